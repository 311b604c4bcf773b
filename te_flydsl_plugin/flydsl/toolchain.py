"""Compiling FlyDSL kernels for gfx950 on any machine, and getting the code object back.

FlyDSL's ROCDL serializer links with ``$ROCM_PATH/llvm/bin/ld.lld`` (lld >= 18 for code object v6).
On a real ROCm install that exists already; elsewhere (CI, a laptop) Debian's ``lld-22`` does the
job, so :func:`rocm_root` finds a usable ``ld.lld`` by itself and, if needed, lays out a small
ROCm-shaped folder pointing at it. No environment has to be set by hand.

FlyDSL reads its target from process-wide environment variables (``ARCH``, ``FLYDSL_GPU_ARCH``),
so :func:`compile_for` holds a lock while they are set: compiles from several threads are safe.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..llvm import MIN_LLD, ToolchainError, find_ld_lld, lld_major, llvm_tool, run_on_bytes

_env_lock = threading.RLock()


def _shim_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "te-flydsl-plugin" / "rocm-shim"


def rocm_root() -> str | None:
    """A folder laid out as FlyDSL expects (``llvm/bin/ld.lld``), or None when no usable lld exists."""
    rocm = os.environ.get("ROCM_PATH")
    if rocm and lld_major(os.path.join(rocm, "llvm", "bin", "ld.lld")) >= MIN_LLD:
        return rocm
    lld = find_ld_lld()
    if lld is None:
        return None
    shim = _shim_dir()
    link = shim / "llvm" / "bin" / "ld.lld"
    with _env_lock:
        if not (link.exists() and os.path.realpath(link) == os.path.realpath(lld)):
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f"ld.lld.{os.getpid()}.{threading.get_ident()}")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            tmp.symlink_to(lld)
            os.replace(tmp, link)  # atomic: safe when several processes share the cache
    return str(shim)


@contextlib.contextmanager
def compile_for(arch: str) -> Iterator[None]:
    """Set FlyDSL's target environment for ``arch`` for the duration of a compile (thread-safe)."""
    root = rocm_root()
    if root is None:
        raise ToolchainError(f"no ld.lld >= {MIN_LLD} found: install ROCm, or Debian's lld-22 (apt-get install lld-22)")
    wanted = {"ROCM_PATH": root, "ARCH": arch, "FLYDSL_GPU_ARCH": arch}
    with _env_lock:
        saved = {k: os.environ.get(k) for k in wanted}
        os.environ.update(wanted)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def code_objects(compiled: Any) -> dict[str, bytes]:
    """The device code objects (ELF bytes) inside a ``flyc.compile`` result, by binary symbol name."""
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    found: dict[str, bytes] = {}

    def visit(op: Any) -> Any:
        if op.name == "gpu.binary":
            objects = ir.ArrayAttr(op.attributes["objects"])
            found[ir.StringAttr(op.attributes["sym_name"]).value] = bytes(gpu.ObjectAttr(objects[0]).object)
        return ir.WalkResult.ADVANCE

    with _create_mlir_context():
        ir.Module.parse(compiled._keepalive._ir_text).operation.walk(visit)
    return found


@dataclass(frozen=True)
class KernelResources:
    """What the code object's metadata says about one kernel (the ISA budget checks read these)."""

    name: str
    vgpr_count: int  # on gfx950: arch VGPRs + AGPRs
    agpr_count: int
    sgpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    lds_bytes: int  # static LDS (group_segment_fixed_size)
    scratch_bytes: int  # private_segment_fixed_size
    max_flat_workgroup_size: int
    kernarg_size: int


def kernel_resources(code_object: bytes) -> list[KernelResources]:
    """Parse the AMDGPU metadata note of a code object with ``llvm-readelf --notes``."""
    readelf = llvm_tool("llvm-readelf")
    if readelf is None:
        raise ToolchainError("llvm-readelf >= 18 not found: apt-get install llvm-22")
    text = run_on_bytes([readelf, "--notes"], code_object)
    kernels: list[KernelResources] = []
    for block in re.split(r"\n\s*- \.agpr_count:", text)[1:]:
        block = ".agpr_count:" + block

        def num(key: str, default: int = 0, _b: str = block) -> int:
            m = re.search(rf"\.{key}:\s+(\d+)", _b)
            return int(m.group(1)) if m else default

        name = re.search(r"\.name:\s+(\S+)", block)
        kernels.append(
            KernelResources(
                name=name.group(1) if name else "?",
                vgpr_count=num("vgpr_count"),
                agpr_count=num("agpr_count"),
                sgpr_count=num("sgpr_count"),
                vgpr_spill_count=num("vgpr_spill_count"),
                sgpr_spill_count=num("sgpr_spill_count"),
                lds_bytes=num("group_segment_fixed_size"),
                scratch_bytes=num("private_segment_fixed_size"),
                max_flat_workgroup_size=num("max_flat_workgroup_size"),
                kernarg_size=num("kernarg_segment_size"),
            )
        )
    return kernels
