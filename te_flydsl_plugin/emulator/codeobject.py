"""Reading an AMDHSA code object: ELF sections and symbols, kernel descriptors, the metadata note.

The emulator needs, per kernel, what the hardware and the runtime would take from the code object
at dispatch: where the code starts, which SGPRs/VGPRs the hardware initialises (kernel descriptor),
the static LDS size and the kernarg layout (metadata). Everything is read from the ELF bytes in
pure Python, so nothing but the code object is needed at launch time.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from .errors import EmulatorError

_NT_AMDGPU_METADATA = 32


@dataclass(frozen=True)
class KernelArg:
    """One entry of the metadata's ``.args``: where the caller must put an argument in the kernarg."""

    offset: int
    size: int
    value_kind: str  # global_buffer, by_value, hidden_block_count_x, ...
    name: str | None = None


@dataclass(frozen=True)
class KernelDescriptor:
    """The fields of the 64-byte AMDHSA kernel descriptor the dispatch model uses."""

    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    entry_offset: int  # relative to the descriptor's own address
    rsrc1: int
    rsrc2: int
    rsrc3: int
    code_properties: int
    kernarg_preload: int

    @property
    def user_sgpr_count(self) -> int:
        return (self.rsrc2 >> 1) & 0x1F

    @property
    def tgid_enable(self) -> tuple[bool, bool, bool]:
        return bool(self.rsrc2 >> 7 & 1), bool(self.rsrc2 >> 8 & 1), bool(self.rsrc2 >> 9 & 1)

    @property
    def tg_size_enable(self) -> bool:
        return bool(self.rsrc2 >> 10 & 1)


@dataclass(frozen=True)
class Kernel:
    """Everything about one kernel of a code object the emulator needs to launch it."""

    name: str
    code_address: int  # virtual address of the first instruction
    code_size: int
    descriptor: KernelDescriptor
    args: tuple[KernelArg, ...]
    vgpr_count: int
    agpr_count: int
    sgpr_count: int
    lds_bytes: int
    kernarg_size: int
    wavefront_size: int
    reqd_workgroup_size: tuple[int, int, int] | None
    metadata: dict[str, Any] = field(repr=False, compare=False, hash=False)


@dataclass(frozen=True)
class CodeObject:
    """A parsed code object: its kernels by name."""

    kernels: dict[str, Kernel]

    def kernel(self, name: str | None) -> Kernel:
        """The named kernel, or the only one when ``name`` is None."""
        if name is None:
            if len(self.kernels) != 1:
                raise EmulatorError(f"code object has kernels {sorted(self.kernels)}: name one")
            return next(iter(self.kernels.values()))
        try:
            return self.kernels[name]
        except KeyError:
            raise EmulatorError(f"no kernel {name!r} in code object (has {sorted(self.kernels)})") from None


def _msgpack(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode one MessagePack value (the AMDGPU metadata note's encoding); only what the note uses."""
    b = buf[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8F:
        return _msgpack_map(buf, pos, b & 0x0F)
    if 0x90 <= b <= 0x9F:
        return _msgpack_array(buf, pos, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        n = b & 0x1F
        return buf[pos : pos + n].decode(), pos + n
    fixed = {0xCC: "B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q", 0xD0: "b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if b in fixed:
        fmt = fixed[b]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if b in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[b], pos
    if b in (0xCA, 0xCB):
        fmt = ">f" if b == 0xCA else ">d"
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if b in (0xD9, 0xDA, 0xDB, 0xC4, 0xC5, 0xC6):
        width = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}[b]
        n = int.from_bytes(buf[pos : pos + width], "big")
        pos += width
        data = buf[pos : pos + n]
        return (data.decode() if b >= 0xD9 else bytes(data)), pos + n
    if b in (0xDC, 0xDD):
        width = 2 if b == 0xDC else 4
        return _msgpack_array(buf, pos + width, int.from_bytes(buf[pos : pos + width], "big"))
    if b in (0xDE, 0xDF):
        width = 2 if b == 0xDE else 4
        return _msgpack_map(buf, pos + width, int.from_bytes(buf[pos : pos + width], "big"))
    raise EmulatorError(f"metadata note: unsupported MessagePack byte 0x{b:02x}")


def _msgpack_map(buf: bytes, pos: int, n: int) -> tuple[dict[Any, Any], int]:
    out: dict[Any, Any] = {}
    for _ in range(n):
        k, pos = _msgpack(buf, pos)
        v, pos = _msgpack(buf, pos)
        out[k] = v
    return out, pos


def _msgpack_array(buf: bytes, pos: int, n: int) -> tuple[list[Any], int]:
    out = []
    for _ in range(n):
        v, pos = _msgpack(buf, pos)
        out.append(v)
    return out, pos


def _sections(raw: bytes) -> list[dict[str, int | str]]:
    if raw[:4] != b"\x7fELF" or raw[4] != 2:
        raise EmulatorError("not a 64-bit ELF code object")
    shoff = struct.unpack_from("<Q", raw, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", raw, 0x3A)
    secs = []
    for i in range(shnum):
        name, typ, _flags, addr, off, size, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", raw, shoff + i * shentsize
        )
        secs.append(
            {"name_off": name, "type": typ, "addr": addr, "off": off, "size": size, "link": link, "ent": entsize}
        )
    strtab = secs[shstrndx]
    for s in secs:
        start = int(strtab["off"]) + int(s["name_off"])
        s["name"] = raw[start : raw.index(b"\0", start)].decode()
    return secs


def parse(raw: bytes) -> CodeObject:
    """Parse ELF bytes of a gfx9 AMDHSA code object (v4-v6) into its kernels."""
    secs = _sections(raw)
    symbols: dict[str, tuple[int, int]] = {}
    for s in secs:
        if s["type"] != 2:  # SHT_SYMTAB
            continue
        strsec = secs[int(s["link"])]
        for i in range(int(s["size"]) // 24):
            name_off, _info, _other, _shndx, value, size = struct.unpack_from("<IBBHQQ", raw, int(s["off"]) + i * 24)
            start = int(strsec["off"]) + name_off
            name = raw[start : raw.index(b"\0", start)].decode()
            if name:
                symbols[name] = (value, size)
    meta: dict[str, Any] | None = None
    for s in secs:
        if s["type"] != 7:  # SHT_NOTE
            continue
        pos, end = int(s["off"]), int(s["off"]) + int(s["size"])
        while pos < end:
            namesz, descsz, ntype = struct.unpack_from("<III", raw, pos)
            pos += 12
            owner = raw[pos : pos + namesz].rstrip(b"\0")
            pos += (namesz + 3) & ~3
            if owner == b"AMDGPU" and ntype == _NT_AMDGPU_METADATA:
                meta = _msgpack(raw[pos : pos + descsz])[0]
            pos += (descsz + 3) & ~3
    if meta is None:
        raise EmulatorError("code object has no AMDGPU metadata note")

    def file_offset(vaddr: int) -> int:
        for s in secs:
            if s["type"] != 8 and int(s["addr"]) <= vaddr < int(s["addr"]) + int(s["size"]):  # not NOBITS
                return vaddr - int(s["addr"]) + int(s["off"])
        raise EmulatorError(f"address 0x{vaddr:x} is in no section")

    kernels: dict[str, Kernel] = {}
    for km in meta.get("amdhsa.kernels", []):
        name = km[".name"]
        kd_addr, _ = symbols[km[".symbol"]]
        f = struct.unpack_from("<IIIIq20xIIIHH", raw, file_offset(kd_addr))
        desc = KernelDescriptor(
            group_segment_fixed_size=f[0],
            private_segment_fixed_size=f[1],
            kernarg_size=f[2],
            entry_offset=f[4],
            rsrc3=f[5],
            rsrc1=f[6],
            rsrc2=f[7],
            code_properties=f[8],
            kernarg_preload=f[9],
        )
        code_addr = kd_addr + desc.entry_offset
        code_size = symbols.get(name, (code_addr, 0))[1]
        args = tuple(KernelArg(a[".offset"], a[".size"], a[".value_kind"], a.get(".name")) for a in km.get(".args", []))
        reqd = km.get(".reqd_workgroup_size")
        kernels[name] = Kernel(
            name=name,
            code_address=code_addr,
            code_size=code_size,
            descriptor=desc,
            args=args,
            vgpr_count=km.get(".vgpr_count", 0),
            agpr_count=km.get(".agpr_count", 0),
            sgpr_count=km.get(".sgpr_count", 0),
            lds_bytes=km.get(".group_segment_fixed_size", desc.group_segment_fixed_size),
            kernarg_size=km.get(".kernarg_segment_size", desc.kernarg_size),
            wavefront_size=km.get(".wavefront_size", 64),
            reqd_workgroup_size=tuple(reqd) if reqd else None,
            metadata=km,
        )
    return CodeObject(kernels=kernels)
