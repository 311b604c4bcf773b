"""The compile caches of the plugin's kernels, and their launchers: never keyed by M/N/K.

The GEMM family's code objects (:func:`compile_config`) are keyed by KernelConfig + arch, in two
levels: an in-process dict (one compile per key even when threads race: a per-key lock), and a
directory on disk (``$TE_FLYDSL_CACHE_DIR``, else ``~/.cache/te-flydsl-plugin/kernels``) that several
processes may share: each entry is written to a private temporary name and published with an atomic
``os.replace``, the metadata file last, so a reader sees a whole entry or none. The key also hashes
the kernel sources and the FlyDSL version, so an edited kernel never meets a stale code object.

The in-process launchers (FlyDSL ``CompiledFunction``s, :func:`launcher`) are keyed by (name, arch):
a GEMM config's name, or a scale-pack variant's (:func:`scale_pack_launcher`, whose code object the
emulator runs as well).

``family.BACKED`` lists the configs that compile for gfx950, pass ``isa.isa_report`` and matched a
torch reference in the gfx950 emulator; only they may back a capability-matrix row.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import archs
from . import matrix, toolchain
from .kernels.config import KernelConfig


@dataclass(frozen=True)
class CompiledKernel:
    """One config's gfx950 code object and what the compiler made of it."""

    config: KernelConfig
    arch: str
    kernel: str  # the kernel symbol inside the code object
    code_object: bytes
    resources: toolchain.KernelResources
    compile_seconds: float  # of the compile that produced it (also when it came from disk)
    from_disk: bool


def _cache_dir() -> Path:
    env = os.environ.get("TE_FLYDSL_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "te-flydsl-plugin" / "kernels"


def _source_digest() -> str:
    import flydsl

    h = hashlib.sha256(getattr(flydsl, "__version__", "?").encode())
    for f in sorted((Path(__file__).parent / "kernels").glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


_digest: str | None = None
_memory: dict[tuple[str, str], CompiledKernel] = {}
_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def cache_key(cfg: KernelConfig, arch: str) -> str:
    """The on-disk entry name of a config: its name plus a digest of arch, sources and FlyDSL version."""
    global _digest
    if _digest is None:
        _digest = _source_digest()
    tail = hashlib.sha256(f"{cfg!r}|{arch}|{_digest}".encode()).hexdigest()[:16]
    return f"{cfg.name}-{arch}-{tail}"


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(cfg: KernelConfig, arch: str, key: str) -> CompiledKernel | None:
    meta_path = _cache_dir() / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        blob = (_cache_dir() / f"{key}.hsaco").read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        return None  # a torn or foreign entry: recompile and overwrite it
    res = toolchain.KernelResources(**meta["resources"])
    return CompiledKernel(cfg, arch, meta["kernel"], blob, res, meta["compile_seconds"], True)


def _compile(cfg: KernelConfig, arch: str) -> CompiledKernel:
    archs.require(arch, matrix.ARCHS)  # an ArchError, not LLVM aborting the process on gfx942
    import flydsl.compiler as flyc

    from .kernels import gemm

    start = time.perf_counter()
    with toolchain.compile_for(arch):
        compiled = flyc.compile(gemm.gemm_launch, *gemm.placeholder_args(cfg))
    seconds = time.perf_counter() - start
    objects = toolchain.code_objects(compiled)
    if len(objects) != 1:
        raise RuntimeError(f"{cfg.name}: expected one code object, got {sorted(objects)}")
    blob = next(iter(objects.values()))
    kernels = toolchain.kernel_resources(blob)
    if len(kernels) != 1:
        raise RuntimeError(f"{cfg.name}: expected one kernel, got {[k.name for k in kernels]}")
    return CompiledKernel(cfg, arch, kernels[0].name, blob, kernels[0], seconds, False)


def compile_config(cfg: KernelConfig, arch: str = "gfx950") -> CompiledKernel:
    """The compiled kernel of ``cfg`` for ``arch``: from memory, else from disk, else compiled now."""
    mem_key = (repr(cfg), arch)
    hit = _memory.get(mem_key)
    if hit is not None:
        return hit
    with _locks_guard:
        lock = _locks.setdefault(mem_key, threading.Lock())
    with lock:
        hit = _memory.get(mem_key)
        if hit is not None:
            return hit
        key = cache_key(cfg, arch)
        ck = _load(cfg, arch, key)
        if ck is None:
            ck = _compile(cfg, arch)
            meta = {
                "config": cfg.name,
                "arch": arch,
                "kernel": ck.kernel,
                "compile_seconds": ck.compile_seconds,
                "sha256": hashlib.sha256(ck.code_object).hexdigest(),
                "resources": asdict(ck.resources),
            }
            _atomic_write(_cache_dir() / f"{key}.hsaco", ck.code_object)
            _atomic_write(_cache_dir() / f"{key}.json", json.dumps(meta, indent=1).encode())
        _memory[mem_key] = ck
        return ck


_launchers: dict[tuple[str, str], Any] = {}  # (config name, arch) -> compiled function
_launchers_lock = threading.Lock()


def launcher(cfg: KernelConfig, args: tuple, arch: str = "gfx950") -> Any:
    """The in-process FlyDSL ``CompiledFunction`` of ``cfg`` for this machine's GPU (flydsl executor).

    Compiled once per process, for ``arch`` (FlyDSL's target comes from the environment, which would
    otherwise default to gfx942), from the first launch's own arguments ``args`` (``gemm.jit_args``:
    the GPU tensors' dtypes and dynamic layouts; shapes are runtime values, so any later launch of
    the config reuses it). FlyDSL's own on-disk cache makes the compile cheap in a new process.
    Calling the result launches on the stream passed as its last argument.
    """
    with _launchers_lock:
        fn = _launchers.get((cfg.name, arch))
        if fn is None:
            import flydsl.compiler as flyc

            from .kernels import gemm

            with toolchain.compile_for(arch):
                fn = flyc.compile(gemm.gemm_launch, *args)
            _launchers[cfg.name, arch] = fn
        return fn


def scale_pack_launcher(blocks_along_dim: int, arch: str = "gfx950") -> Any:
    """The compiled MXFP8 scale-pack kernel of one variant (``kernels/scale_pack.py``), keyed never by shape.

    Compiled once per process from CPU placeholders (extents and strides are dynamic, so it serves
    every shape and view; no GPU is touched, so it compiles on any machine with ld.lld and raises
    ToolchainError without one). Calling it launches on the stream passed as its last argument.
    """
    from .kernels import scale_pack

    name = scale_pack.variant_name(blocks_along_dim)
    with _launchers_lock:
        fn = _launchers.get((name, arch))
        if fn is None:
            import flydsl.compiler as flyc

            with toolchain.compile_for(arch):
                fn = flyc.compile(scale_pack.scale_pack, *scale_pack.placeholder_args(blocks_along_dim))
            _launchers[name, arch] = fn
        return fn


def scale_pack_code_object(blocks_along_dim: int, arch: str = "gfx950") -> bytes:
    """The code object (ELF) of one scale-pack variant: what the ISA checks and the emulator read."""
    (blob,) = toolchain.code_objects(scale_pack_launcher(blocks_along_dim, arch)).values()
    return blob
