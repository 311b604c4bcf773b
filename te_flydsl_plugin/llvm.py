"""Where the LLVM tools that know gfx950 are on this machine, and a code object's disassembly.

Shared by the FlyDSL backend (its compiles link with ``ld.lld``; its ISA checks read the disassembly and
the metadata notes) and the emulator (which decodes the disassembly), so neither imports the other for
it. LLVM >= 18 is the first with gfx950 (code object v6); Debian's ``llvm-22`` / ``lld-22`` serve where
ROCm is absent (``tools/setup.sh`` installs them).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Iterator

MIN_LLD = 18


class ToolchainError(RuntimeError):
    """The machine lacks what compiling for gfx950 needs; the message says what to install."""


def lld_major(path: str) -> int:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"LLD (\d+)", out)
    return int(m.group(1)) if m else 0


def _candidates() -> Iterator[str]:
    rocm = os.environ.get("ROCM_PATH")
    if rocm:
        yield os.path.join(rocm, "llvm", "bin", "ld.lld")
    yield "/opt/rocm/llvm/bin/ld.lld"
    # Debian/Ubuntu versioned LLVM packages, newest first.
    yield from sorted(glob.glob("/usr/lib/llvm-*/bin/ld.lld"), key=_version_key, reverse=True)
    for name in ("ld.lld-22", "ld.lld-21", "ld.lld-20", "ld.lld-19", "ld.lld-18", "ld.lld"):
        found = shutil.which(name)
        if found:
            yield found


def _version_key(path: str) -> int:
    m = re.search(r"llvm-(\d+)", path)
    return int(m.group(1)) if m else 0


def find_ld_lld() -> str | None:
    """The first ``ld.lld`` of version >= 18 found on this machine, or None."""
    for cand in _candidates():
        if os.path.isfile(cand) and lld_major(cand) >= MIN_LLD:
            return cand
    return None


def llvm_tool(name: str) -> str | None:
    """An LLVM binary (``llvm-objdump``, ``llvm-readelf``) that knows gfx950, newest first."""
    for cand in sorted(glob.glob(f"/usr/lib/llvm-*/bin/{name}"), key=_version_key, reverse=True):
        if _version_key(cand) >= MIN_LLD:
            return cand
    rocm = os.environ.get("ROCM_PATH") or "/opt/rocm"
    cand = os.path.join(rocm, "llvm", "bin", name)
    return cand if os.path.isfile(cand) else None


def disassemble(code_object: bytes, arch: str = "gfx950") -> str:
    """``llvm-objdump -d`` of a code object (the text the ISA checks and the emulator read)."""
    objdump = llvm_tool("llvm-objdump")
    if objdump is None:
        raise ToolchainError("llvm-objdump >= 18 not found: apt-get install llvm-22")
    return run_on_bytes([objdump, "-d", f"--mcpu={arch}"], code_object)


def run_on_bytes(cmd: list[str], blob: bytes) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
        f.write(blob)
        f.flush()
        res = subprocess.run([*cmd, f.name], capture_output=True, text=True, timeout=120)
    if res.returncode:
        raise ToolchainError(f"{os.path.basename(cmd[0])} failed: {res.stderr.strip()}")
    return res.stdout
