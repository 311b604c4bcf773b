"""The machine state: wave64 register files, LDS, and the host memory that stands in for HBM.

Vector registers are ``uint32[n, 64]`` numpy arrays, so every VALU instruction is one numpy
expression over the 64 lanes. Scalar registers are a Python list (scalar code is branchy and
small; Python ints are faster there than numpy scalars). The special registers live at their
hardware indices in the scalar file (VCC at 106, M0 at 124, EXEC at 126) so that an instruction
writing ``s[106:107]`` and one writing ``vcc`` see the same state.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .decode import EXEC, VCC
from .errors import EmulatorError
from .hazards import WaveCounters

LANES = 64
_LANE_BITS = (np.uint64(1) << np.arange(LANES, dtype=np.uint64)).astype(np.uint64)


def mask_to_bits(mask: np.ndarray) -> int:
    """A bool[64] lane mask as the 64-bit integer the scalar unit sees."""
    return int(np.bitwise_or.reduce(_LANE_BITS[mask])) if mask.any() else 0


def bits_to_mask(bits: int) -> np.ndarray:
    """A 64-bit lane mask as bool[64]."""
    return (np.uint64(bits) & _LANE_BITS) != 0


class HostMemory:
    """Global memory: this process's own address space, read and written through numpy views.

    A kernel argument address is a real host address (a CPU tensor's ``data_ptr()``). To turn a
    stray address into an error instead of a crash, every access is checked against the process's
    mappings (``/proc/self/maps``, re-read when an address is not in the cached copy).
    """

    def __init__(self) -> None:
        self._maps: list[tuple[int, int, bool]] = []
        self._last: tuple[int, int, bool] | None = None
        self._load_maps()

    def _load_maps(self) -> None:
        maps = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    rng, perms = line.split()[:2]
                    lo, hi = (int(x, 16) for x in rng.split("-"))
                    if perms[0] == "r":
                        maps.append((lo, hi, perms[1] == "w"))
        except OSError:
            maps = [(0, 1 << 64, True)]
        self._maps = maps

    def _check(self, lo: int, hi: int, write: bool) -> None:
        last = self._last
        if last is not None and last[0] <= lo and hi <= last[1] and (last[2] or not write):
            return  # the common case: the same tensor as the previous access
        for attempt in range(2):
            for m in self._maps:
                if m[0] <= lo and hi <= m[1] and (m[2] or not write):
                    self._last = m
                    return
            if attempt == 0:
                self._load_maps()
        # Ranges spanning adjacent mappings (a big tensor next to another) are checked page by page.
        page = lo & ~0xFFF
        while page < hi:
            if not any(mlo <= page < mhi and (w or not write) for mlo, mhi, w in self._maps):
                kind = "write" if write else "read"
                raise EmulatorError(f"global {kind} of unmapped host memory at 0x{page:x} (range 0x{lo:x}-0x{hi:x})")
            page += 0x1000

    def view(self, lo: int, nbytes: int, write: bool) -> np.ndarray:
        """A uint8 numpy view of ``nbytes`` of host memory at ``lo`` (checked)."""
        if lo <= 0:
            raise EmulatorError(f"global access at null or negative address 0x{lo:x}")
        self._check(lo, lo + nbytes, write)
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(lo))

    def gather(self, addrs: np.ndarray, nbytes: int) -> np.ndarray:
        """``nbytes`` bytes at each of ``addrs`` (uint64[n]) as uint8[n, nbytes]."""
        if addrs.size == 0:
            return np.zeros((0, nbytes), np.uint8)
        lo = int(addrs.min())
        hi = int(addrs.max()) + nbytes
        mem = self.view(lo, hi - lo, write=False)
        idx = (addrs - np.uint64(lo)).astype(np.int64)[:, None] + np.arange(nbytes)
        return mem[idx]

    def scatter(self, addrs: np.ndarray, data: np.ndarray) -> None:
        """Write uint8[n, nbytes] ``data`` at ``addrs``; lanes are applied in order (last lane wins)."""
        if addrs.size == 0:
            return
        nbytes = data.shape[1]
        lo = int(addrs.min())
        hi = int(addrs.max()) + nbytes
        mem = self.view(lo, hi - lo, write=True)
        idx = (addrs - np.uint64(lo)).astype(np.int64)[:, None] + np.arange(nbytes)
        mem[idx] = data


class Wave:
    """One wave64: registers, program counter, and its place in the workgroup."""

    def __init__(self, wave_id: int, n_vgpr: int, n_agpr: int, n_sgpr: int = 128) -> None:
        self.wave_id = wave_id
        self.s: list[int] = [0] * max(n_sgpr, 128)
        self.v = np.zeros((max(n_vgpr, 1), LANES), np.uint32)
        self.a = np.zeros((max(n_agpr, 1), LANES), np.uint32)
        self.scc = 0
        self.pc = 0  # index into the kernel's instruction list
        self.done = False
        self.at_barrier = False
        self.exec_mask = np.zeros(LANES, bool)
        self.exec_full = False
        self.hazards = WaveCounters()  # replaced per workgroup by HazardTracker.reset_workgroup
        self.scratch = np.zeros((LANES, 0), np.uint8)  # each lane's private segment (spills)
        self.back_branches = 0  # taken backward branches: a runaway loop is stopped (see ops_salu)

    # -- EXEC / VCC -------------------------------------------------------------------------
    def set_exec(self, bits: int) -> None:
        bits &= (1 << 64) - 1
        self.s[EXEC] = bits & 0xFFFFFFFF
        self.s[EXEC + 1] = bits >> 32
        self.exec_mask = bits_to_mask(bits)
        self.exec_full = bits == (1 << 64) - 1

    def exec_bits(self) -> int:
        return self.s[EXEC] | (self.s[EXEC + 1] << 32)

    def set_vcc(self, bits: int) -> None:
        self.s[VCC] = bits & 0xFFFFFFFF
        self.s[VCC + 1] = (bits >> 32) & 0xFFFFFFFF

    def sget(self, idx: int, count: int = 1) -> int:
        """Scalar registers ``idx..idx+count-1`` as one little-endian integer."""
        if count == 1:
            return self.s[idx]
        val = 0
        for i in range(count):
            val |= self.s[idx + i] << (32 * i)
        return val

    def sset(self, idx: int, value: int, count: int = 1) -> None:
        """Write ``count`` scalar registers from one integer; EXEC writes update the lane mask."""
        for i in range(count):
            self.s[idx + i] = (value >> (32 * i)) & 0xFFFFFFFF
        if idx <= EXEC + 1 and idx + count > EXEC:
            self.set_exec(self.s[EXEC] | (self.s[EXEC + 1] << 32))

    def vwrite(self, file: np.ndarray, idx: int, value: np.ndarray | int) -> None:
        """Write one VGPR/AGPR in the lanes EXEC enables."""
        if self.exec_full:
            file[idx] = value
        else:
            np.copyto(file[idx], np.asarray(value, dtype=np.uint32), where=self.exec_mask)
