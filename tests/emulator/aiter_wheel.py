"""AMD's prebuilt gfx950 kernels from the ``amd-aiter`` wheel: where they are, and the data layouts
their launchers expect. The emulator's third-party oracle (test_aiter_oracle.py) runs them.

The code objects are hardware-validated machine code nobody here wrote. ``tools/setup.sh`` installs
the wheel with ``--no-deps``; it is never imported: the files are found through the distribution's
file list and read as bytes. A missing or different wheel fails the tests (it is part of the setup).

Launch facts, from aiter's launchers in the same wheel (``aiter_meta/csrc/py_itfs_cu/``):
``asm_gemm_a16w16.cu`` (bf16gemm), ``asm_gemm_a4w4.cu`` (f4gemm), ``asm_mi350_a8w8_blockscale.cu``
(f8_block_scale): every field of the packed ``KernelArgs`` struct sits in a 16-byte slot (a pointer
+ ``p2``, a 32-bit value + ``p3``, ``aiter_hip_common.h``), which is also what the code objects'
own ``.args`` metadata lists, by name; 256 threads (4 waves) per workgroup.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
import torch

DIST = "amd-aiter"
_SETUP = Path(__file__).resolve().parents[2] / "tools" / "setup.sh"


def pinned_version() -> str:
    """The version tools/setup.sh installs (its ``AITER_VERSION=``: the pin lives there only)."""
    m = re.search(r'^AITER_VERSION="([^"]+)"', _SETUP.read_text(), re.M)
    assert m, f"{_SETUP} pins no AITER_VERSION"
    return m.group(1)


_HSA = "aiter_meta/hsa/gfx950/"


def _dist() -> importlib.metadata.Distribution:
    """The installed, pinned wheel (fails, never skips)."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{DIST} is not installed: tools/setup.sh installs {DIST}=={pinned_version()} --no-deps")
    if dist.version != pinned_version():
        pytest.fail(f"{DIST} {dist.version} is installed, the tests know {pinned_version()} (tools/setup.sh)")
    return dist


def code_object(name: str) -> bytes:
    """The bytes of ``aiter_meta/hsa/gfx950/<name>`` from the installed wheel (fails, never skips)."""
    dist = _dist()
    want = _HSA + name
    for f in dist.files or ():
        if str(f) == want:
            return f.read_binary()
    pytest.fail(f"{DIST} {dist.version} has no {want}")


def code_object_names(prefix: str) -> list[str]:
    """The wheel's gfx950 code objects whose name (under ``aiter_meta/hsa/gfx950/``) starts with ``prefix``,
    sorted; fails if there are none."""
    dist = _dist()
    names = sorted(str(f)[len(_HSA) :] for f in dist.files or () if str(f).startswith(_HSA + prefix))
    names = [n for n in names if n.endswith(".co")]
    if not names:
        pytest.fail(f"{DIST} {dist.version} has no {_HSA}{prefix}*.co")
    return names


# -- MXFP4 (f4gemm) ---------------------------------------------------------------------------

# OCP Microscaling Formats (MX) v1.0, section 5.3.3: the 16 E2M1 values by code (sign bit 3).
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
MX_BLOCK = 32  # elements per E8M0 scale (OCP MX v1.0; aiter's "per1x32")


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [R, K] -> bytes [R, K/2]: element 2i in the low nibble (aiter ``fp4_utils.pack_uint4``)."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def mx_dequant(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float64 [R, K] values of FP4 codes [R, K] with E8M0 scales [R, K/32] (2^(e - 127))."""
    return E2M1_VALUES[codes.long()] * torch.pow(2.0, scales.double() - 127).repeat_interleave(MX_BLOCK, 1)


def preshuffle_b(b: torch.Tensor) -> torch.Tensor:
    """The BpreShuffle weight layout of bytes [N, K/2] (aiter ``ops/shuffle.shuffle_weight``, layout
    (16, 16), 1-byte elements): blocks of 16 rows x 32 bytes, each stored as two 16-row x 16-byte halves."""
    n, kb = b.shape
    return b.view(n // 16, 16, kb // 32, 2, 16).permute(0, 2, 3, 1, 4).contiguous().view(n, kb)


def shuffle_scales(s: torch.Tensor) -> torch.Tensor:
    """aiter ``fp4_utils.e8m0_shuffle``: E8M0 scales [R, K/32], zero-padded to rows % 256 and columns
    % 8; the scale of row 32a + 16b + c, column 8d + 4e + f is stored at [a][d][f][c][e][b] of a
    [R/32][K/256][4][16][2][2] array (so one dword holds 2 rows x 2 K blocks); the row stride the
    kernel is given is the padded column count."""
    r, c = s.shape
    p = torch.zeros((r + 255) // 256 * 256, (c + 7) // 8 * 8, dtype=s.dtype)
    p[:r, :c] = s
    pr, pc = p.shape
    return p.view(pr // 32, 2, 16, pc // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).contiguous().view(pr, pc)
