"""Kernel arguments: the metadata's layout, and packing Python values the way FlyDSL passes them.

FlyDSL's ABI for a kernel's runtime parameters (read from ``flydsl/compiler/jit_argument.py`` and
confirmed on compiled code objects):

* ``fx.Tensor`` from a torch tensor: an 8-byte global pointer (``data_ptr()``), then, when its
  layout is dynamic (the default), one packed by-value struct of the dynamic shape entries as i32
  followed by the dynamic stride entries as i64 (i32 with ``use_32bit_stride``). By default every
  shape entry is dynamic and every stride except the unit-stride (leading) one: a row-major 2-D
  tensor is ``ptr, {i32 M, i32 N, i64 stride0}`` (8 + 16 bytes). ``mark_shape_dynamic`` /
  ``mark_stride_dynamic`` choose other entries (same order: shapes, then strides, ascending dim);
  a static layout passes only the pointer.
* ``fx.Int32`` / Python int: 4 bytes by value; ``fx.Int64``: 8 bytes. ``fx.Constexpr`` and
  compile-time objects (tiled copies, MMAs) are not kernel arguments at all.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from .codeobject import KernelArg, parse
from .errors import EmulatorError


def kernarg_layout(code_object: bytes, kernel: str | None = None) -> list[KernelArg]:
    """The kernel's ``.args`` from the code object metadata: offset, size, value_kind of each."""
    return list(parse(bytes(code_object)).kernel(kernel).args)


def _layout_struct(t: Any, size: int) -> bytes | None:
    """The by-value layout struct FlyDSL passes after a tensor's pointer, if ``size`` matches one.

    The metadata gives only the struct's size, so the dynamic entries are inferred from it, trying
    in order: FlyDSL's default (every shape entry, every stride but the unit one), every shape and
    every stride (``mark_stride_dynamic`` on all dims), shapes only (``mark_shape_dynamic``), strides
    only; strides as i64, then as i32 (``use_32bit_stride``).
    """
    shape, stride = tuple(t.shape), tuple(t.stride())
    leading = next((i for i, s in enumerate(stride) if s == 1), None)
    non_unit = [s for i, s in enumerate(stride) if i != leading]
    for shapes, strides in ((shape, non_unit), (shape, stride), (shape, ()), ((), stride)):
        for fmt in ("q", "i"):
            packed = struct.pack("<" + "i" * len(shapes) + fmt * len(strides), *shapes, *strides)
            if len(packed) == size:
                return packed
    return None


def pack_flydsl_kernarg(code_object: bytes, kernel: str | None, values: Sequence[Any]) -> bytes:
    """Pack ``values`` (the kernel's runtime parameters in order) into kernarg bytes, FlyDSL's ABI.

    A value may be a CPU torch tensor (its address, then its layout struct when the metadata has
    one), a Python int (by value, 4 or 8 bytes as the metadata says), or ``bytes`` for an argument
    packed by the caller. Hidden arguments (``hidden_*``) are zero-filled.
    """
    args = kernarg_layout(code_object, kernel)
    size = max((a.offset + a.size for a in args), default=0)
    buf = bytearray(size)
    explicit = [a for a in args if not a.value_kind.startswith("hidden_")]
    i = 0
    for v in values:
        if i >= len(explicit):
            raise EmulatorError(f"{len(values)} values for a kernel with {len(explicit)} kernarg slots")
        a = explicit[i]
        if hasattr(v, "data_ptr") and hasattr(v, "stride"):
            if a.value_kind != "global_buffer" or a.size != 8:
                raise EmulatorError(f"a tensor given for kernarg slot {i} of kind {a.value_kind}")
            if v.device.type != "cpu":
                raise EmulatorError("the emulator reads host memory: pass CPU tensors")
            struct.pack_into("<Q", buf, a.offset, v.data_ptr())
            i += 1
            nxt = explicit[i] if i < len(explicit) else None
            if nxt is not None and nxt.value_kind == "by_value":
                packed = _layout_struct(v, nxt.size)
                if packed is not None:
                    buf[nxt.offset : nxt.offset + nxt.size] = packed
                    i += 1
            continue
        if isinstance(v, bytes | bytearray):
            if len(v) != a.size:
                raise EmulatorError(f"kernarg slot {i} is {a.size} bytes, got {len(v)}")
            buf[a.offset : a.offset + a.size] = v
        elif isinstance(v, int):
            if a.size not in (4, 8):
                raise EmulatorError(f"an int given for kernarg slot {i} of {a.size} bytes")
            struct.pack_into("<q" if a.size == 8 else "<I", buf, a.offset, v if a.size == 8 else v & 0xFFFFFFFF)
        elif isinstance(v, float):
            struct.pack_into("<f" if a.size == 4 else "<d", buf, a.offset, v)
        else:
            raise EmulatorError(f"cannot pack {type(v).__name__} into kernarg slot {i}")
        i += 1
    if i != len(explicit):
        raise EmulatorError(f"{len(explicit)} kernarg slots but values filled only {i}")
    return bytes(buf)


def pack_named_kernarg(code_object: bytes, kernel: str | None, values: Mapping[str, Any]) -> bytes:
    """Pack a kernarg by the metadata's argument names (hand-written assembly, e.g. AMD's aiter kernels).

    Such code objects name every field of their launcher's packed struct in ``.args`` (padding
    included, as ``pad``), so the names and offsets come from the code object itself. A value is a
    CPU tensor (its address), ``None`` (a null pointer), a float (f32) or an int (its slot's size);
    arguments not given stay zero. A name that is not an argument, or not a unique one, is an error.
    """
    args = kernarg_layout(code_object, kernel)
    by_name: dict[str, list[KernelArg]] = {}
    for a in args:
        by_name.setdefault(a.name or "", []).append(a)
    buf = bytearray(max((a.offset + a.size for a in args), default=0))
    for name, v in values.items():
        slots = by_name.get(name, [])
        if len(slots) != 1:
            raise EmulatorError(f"kernel argument {name!r}: {len(slots)} arguments of that name in the metadata")
        (a,) = slots
        if v is None or (hasattr(v, "data_ptr") and hasattr(v, "device")):
            if a.size != 8:
                raise EmulatorError(f"a pointer given for kernel argument {name!r} of {a.size} bytes")
            if v is not None and v.device.type != "cpu":
                raise EmulatorError("the emulator reads host memory: pass CPU tensors")
            struct.pack_into("<Q", buf, a.offset, 0 if v is None else v.data_ptr())
        elif isinstance(v, float):
            struct.pack_into("<f" if a.size == 4 else "<d", buf, a.offset, v)
        elif isinstance(v, int):
            struct.pack_into("<Q" if a.size == 8 else "<I", buf, a.offset, v & ((1 << (8 * a.size)) - 1))
        else:
            raise EmulatorError(f"cannot pack {type(v).__name__} into kernel argument {name!r}")
    return bytes(buf)
