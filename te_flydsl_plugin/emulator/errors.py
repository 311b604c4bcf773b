"""The emulator's exceptions: one for "cannot run this", one for "the kernel has a hazard"."""

from __future__ import annotations


class EmulatorError(RuntimeError):
    """The emulator cannot execute the kernel: an unknown opcode, a bad address, a malformed code object."""


class HazardError(EmulatorError):
    """A hazard that hardware would hide (an unwaited load, an LDS race), raised in ``hazards="raise"`` mode."""
