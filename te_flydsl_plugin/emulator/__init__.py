"""A gfx950 (CDNA4) ISA emulator: runs FlyDSL's compiled code objects on the CPU, with hazard checks.

See docs/emulator.md for what it models. The entry point is :func:`launch`.
"""

from .errors import EmulatorError, HazardError
from .kernarg import kernarg_layout, pack_flydsl_kernarg, pack_named_kernarg
from .run import Hazard, LaunchReport, launch

__all__ = [
    "EmulatorError",
    "Hazard",
    "HazardError",
    "LaunchReport",
    "kernarg_layout",
    "launch",
    "pack_flydsl_kernarg",
    "pack_named_kernarg",
]
