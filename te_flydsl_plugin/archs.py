"""GPU architecture names: the one place a name given by a user (CLI ``--arch``,
``NVTE_FLYDSL_TARGET_ARCH``) is checked and normalised.

Names are compared case-insensitively, with surrounding blanks and a target-feature suffix
(``gfx950:sramecc+:xnack-``, as ``rocminfo`` and torch's ``gcnArchName`` print it) removed. A name
outside :data:`KNOWN` is an error; a known name without kernels is an ordinary "not supported" answer
from the backend (``check``'s ARCH reason), or an error where nothing can be done for it (precompile).
"""

from __future__ import annotations

from .spec import SettingsError

# AMD GPU processors a ROCm PyTorch build targets: the CDNA and RDNA rows of LLVM's processor table
# (llvm/docs/AMDGPUUsage.rst, "Processors"). Only gfx950 has kernels (flydsl/matrix.py's ARCHS).
KNOWN: tuple[str, ...] = (
    "gfx908",
    "gfx90a",
    "gfx940",
    "gfx941",
    "gfx942",
    "gfx950",
    "gfx1030",
    "gfx1100",
    "gfx1101",
    "gfx1102",
    "gfx1200",
    "gfx1201",
)


class ArchError(SettingsError):
    """An arch name the project does not know, or a known one that cannot be served where it is asked."""


def normalize(name: str, what: str = "arch") -> str:
    """``name`` as the project spells it (``GFX950`` -> ``gfx950``); ArchError when it is not known."""
    arch = name.strip().split(":")[0].strip().lower()
    if arch not in KNOWN:
        raise ArchError(f"unknown {what} {name!r}: known archs are {', '.join(KNOWN)}")
    return arch


def require(name: str, backed: tuple[str, ...], what: str = "arch") -> str:
    """``normalize(name)``, and ArchError unless it is one of ``backed``."""
    arch = normalize(name, what)
    if arch not in backed:
        raise ArchError(f"{what} {arch} is not supported: FlyDSL kernels exist for {', '.join(backed)} only")
    return arch
