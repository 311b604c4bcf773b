"""The fused scale-pack kernel: compiles for gfx950 within its ISA budget, runs in the emulator and
on gfx950 hardware, and matches ``mx_layout.pack_scales`` bit for bit."""

from __future__ import annotations

import re

import pytest
import torch

from te_flydsl_plugin import llvm
from te_flydsl_plugin.flydsl import compiled, toolchain
from te_flydsl_plugin.flydsl import mx_layout as mx
from te_flydsl_plugin.flydsl.executors import pack_scales_kernel
from te_flydsl_plugin.flydsl.launch_log import LaunchLog

from .helpers import te_scales

needs_toolchain = pytest.mark.skipif(
    llvm.find_ld_lld() is None,
    reason="no ld.lld >= 18 on this machine: install lld-22 (or ROCm) to compile for gfx950",
)


def _gfx950_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no GPU visible to torch: the gfx950 hardware test needs an MI355X"
    arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    if not arch.startswith("gfx950"):
        return f"device 0 is {torch.cuda.get_device_name(0)} ({arch or 'not ROCm'}), not gfx950"
    return None


@pytest.fixture(scope="module")
def sp():
    from te_flydsl_plugin.flydsl.kernels import scale_pack

    return scale_pack


@pytest.mark.compile
@needs_toolchain
@pytest.mark.parametrize("dim", [1, 0])
def test_compiles_for_gfx950_within_isa_budget(sp, dim: int) -> None:
    blob = compiled.scale_pack_code_object(dim)
    (res,) = toolchain.kernel_resources(blob)
    assert res.name == sp.KERNEL_NAME
    assert res.scratch_bytes == 0
    assert res.vgpr_spill_count == 0 and res.sgpr_spill_count == 0
    assert res.lds_bytes == 0 and res.agpr_count == 0
    assert res.max_flat_workgroup_size == sp.THREADS
    asm = llvm.disassemble(blob)
    ops = re.findall(r"^\s+([a-z][a-z0-9_]+)", asm, flags=re.M)
    # Four byte reads of TE's scales through buffer bounds, one dword store of the packed word:
    # nothing else touches memory (no flat/global access that could stray into padding).
    assert ops.count("buffer_load_ubyte") == 4
    assert ops.count("buffer_store_dword") == 1
    assert not [o for o in ops if o.startswith(("flat_", "global_", "scratch_", "ds_"))]


@pytest.mark.compile
@needs_toolchain
def test_one_compile_serves_every_shape(sp, monkeypatch) -> None:
    """Shapes and strides are runtime values: both variants compile once, never per shape."""
    import flydsl.compiler as flyc

    compiles = []
    real = flyc.compile
    monkeypatch.setattr(flyc, "compile", lambda fn, *args: compiles.append(fn) or real(fn, *args))
    monkeypatch.setattr(compiled, "_launchers", {})
    compiled.scale_pack_code_object(1)
    compiled.scale_pack_code_object(1)
    compiled.scale_pack_code_object(0)
    assert compiles == [sp.scale_pack, sp.scale_pack]


EMU_CASES = [
    (1, 32, 1),
    (20, 32 * 5, 1),
    (20, 32 * 5, 0),
    (130, 32 * 37, 1),
    (130, 32 * 37, 0),
    (33, 544, 0),
    (40, 32 * 80, 1),  # several workgroups along x (T * 64 > 256 words per tile)
]


@pytest.mark.emulator
@needs_toolchain
@pytest.mark.parametrize(("rows", "k", "dim"), EMU_CASES)
def test_emulator_matches_reference(sp, rows: int, k: int, dim: int) -> None:
    scales, truth = te_scales(rows, k, dim, poison=None)
    want = mx.pack_scales(scales, rows, k, dim)
    out = torch.full(mx.packed_shape(rows, k), 0xA5, dtype=torch.uint8)
    with LaunchLog() as log:
        got = pack_scales_kernel(scales, rows, k, dim, out=out, mode="emulator")
    assert got is out and log.count("scale_pack", "emulator") == 1
    (report,) = log.reports("scale_pack")
    shape = mx.packed_shape(rows, k)
    assert report.workgroups == shape[0] * -(-shape[1] * 64 // sp.THREADS) and not report.hazards
    assert report.opcode_counts["buffer_load_ubyte"] == 4 * report.opcode_counts["buffer_store_dword"]
    assert torch.equal(got, want)
    assert torch.equal(mx.unpack_scales(got, rows, k), truth)


@pytest.mark.emulator
@needs_toolchain
@pytest.mark.parametrize("dim", [1, 0])
def test_emulator_strided_view(dim: int) -> None:
    rows, k = 40, 32 * 9
    base, _ = te_scales(rows, k, dim)
    store = torch.full((2 * base.shape[0] + 1, 3 * base.shape[1]), 255, dtype=torch.uint8)
    store[1::2, ::3] = base
    view = store[1::2, ::3]
    got = pack_scales_kernel(view, rows, k, dim, mode="emulator")
    assert torch.equal(got, mx.pack_scales(base, rows, k, dim))


@pytest.mark.gfx950
@pytest.mark.parametrize("dim", [1, 0])
def test_gfx950_hardware_matches_reference(dim: int) -> None:
    reason = _gfx950_reason()
    if reason:
        pytest.skip(reason)
    rows, k = 1000, 32 * 131
    scales, _ = te_scales(rows, k, dim, poison=None)
    scales = scales.cuda()
    with LaunchLog() as log:
        got = pack_scales_kernel(scales, rows, k, dim, mode="flydsl")
    torch.cuda.synchronize()
    assert log.count("scale_pack", "flydsl") == 1  # the compiled kernel ran, not a fallback
    assert torch.equal(got.cpu(), mx.pack_scales(scales.cpu(), rows, k, dim))


def test_host_rejects_bad_arguments() -> None:
    scales, _ = te_scales(16, 128, 1)
    with pytest.raises(ValueError, match="mode"):
        pack_scales_kernel(scales, 16, 128, 1, mode="torch")
    with pytest.raises(ValueError, match="gfx950 device"):
        pack_scales_kernel(scales, 16, 128, 1, mode="flydsl")
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_scales_kernel(scales, 16, 100, 1, mode="emulator")
