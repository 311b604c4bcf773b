"""``te-flydsl-plugin bench``: its shape suite and config sweep everywhere; its timing only on gfx950.

The suite must hold only GEMMs the compiled executors accept (checked on meta tensors, so no memory),
the sweep must start with ``select``'s choice and stay within the backed configs of one kind, and
off gfx950 the command must refuse in one line with exit status 2. The timing itself runs only on an
MI355X (``-m gfx950``), where it also proves the compiled kernel ran.
"""

from __future__ import annotations

import pytest
import torch

from te_flydsl_plugin import cli
from te_flydsl_plugin.flydsl import bench, check, family, plan
from te_flydsl_plugin.flydsl.kernels import select
from te_flydsl_plugin.flydsl.kernels.config import KernelConfig
from te_flydsl_plugin.spec import Format, Layout

META = torch.device("meta")


@pytest.mark.parametrize("kind", list(bench.KINDS))
@pytest.mark.parametrize("suite", list(bench.SUITES))
def test_every_suite_gemm_runs_on_a_compiled_kernel(suite: str, kind: str) -> None:
    shapes = bench.SUITES[suite](8192)
    assert shapes and len({s.name for s in shapes}) == len(shapes)
    layouts_planned = set()
    for shape in shapes:
        p, call = bench.problem_for(shape, kind, META, "gfx950")  # what bench times, on meta tensors
        assert (p.m, p.n, p.k) == (shape.m, shape.n, shape.k)
        assert p.epilogue == shape.epilogue
        verdict = check.check(p, "flydsl")
        if shape.epilogue == "bgrad" and kind in ("fp8", "mxfp8"):  # not backed (family._epilogue_family)
            assert [r.code.value for r in verdict.reasons] == ["KERNEL"], str(verdict)
            continue
        assert verdict.ok, (shape, kind, str(verdict))
        if shape.layout not in layouts_planned:  # the plan bench times, on meta tensors: no memory
            layouts_planned.add(shape.layout)
            built = plan.build(p, call)
            assert built.config in family.BACKED and bench.candidates(built.config, p.m, p.n, p.k)[0] == built.config


def test_llm_suite_is_fprop_dgrad_wgrad_of_each_layer() -> None:
    shapes = {s.name: s for s in bench.llm_suite(4096)}
    up = "llama3.1-70b.up"
    assert (shapes[f"{up}.fprop"].layout, shapes[f"{up}.fprop"].m, shapes[f"{up}.fprop"].n) == (Layout.TN, 4096, 57344)
    assert (shapes[f"{up}.dgrad"].layout, shapes[f"{up}.dgrad"].n, shapes[f"{up}.dgrad"].k) == (Layout.NN, 8192, 57344)
    assert (shapes[f"{up}.wgrad"].layout, shapes[f"{up}.wgrad"].m, shapes[f"{up}.wgrad"].k) == (Layout.NT, 57344, 4096)
    assert len(shapes) == len(bench.MODELS) * (4 * 3 + 4)  # and 4 GEMMs with fused epilogues per model
    fused = {s.epilogue for s in shapes.values()}
    assert fused == {"plain", "bias", "bgrad", "bias_gelu", "dgelu_bgrad"}


def test_backward_gemms_take_the_gradient_format() -> None:
    """TE's HYBRID recipe: E4M3 forward operands; the gradient (TE's B in dgrad and wgrad) is E5M2."""
    assert bench.formats("fp8", Layout.TN) == (Format.FP8_E4M3, Format.FP8_E4M3)
    assert bench.formats("fp8", Layout.NN) == (Format.FP8_E4M3, Format.FP8_E5M2)
    assert bench.formats("mxfp8", Layout.NT) == (Format.MXFP8_E4M3, Format.MXFP8_E5M2)


def test_candidates_start_with_select_and_stay_in_the_kind() -> None:
    base = KernelConfig(Format.BF16, Format.BF16, True, True, Format.BF16)
    got = bench.candidates(base, 512, 1024, 4096)  # a small grid: select picks 128 x 128
    assert got[0] == select.select(base, 512, 1024, 4096) and got[0].tile_m == 128
    assert {(c.tile_m, c.waves) for c in got} == {(128, 4), (256, 4), (384, 4)}
    assert all(c in family.BACKED for c in got) and len(set(got)) == len(got)
    assert all((c.lhs_format, c.lhs_k_major, c.rhs_k_major, c.out_format) == (Format.BF16, True, True, Format.BF16)
               for c in got)  # fmt: skip
    mx = KernelConfig(Format.MXFP8_E4M3, Format.MXFP8_E5M2, True, False, Format.BF16)
    assert bench.candidates(mx, 8192, 8192, 8192) == [select.select(mx, 8192, 8192, 8192)]


@pytest.mark.skipif(torch.version.hip is not None and torch.cuda.is_available(), reason="a ROCm GPU is present")
def test_bench_refuses_in_one_line_off_gfx950(capsys) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["bench", "--suite", "square", "--only", "square4096"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "needs a gfx950 (MI355X) GPU" in err and "nothing was timed" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kinds", "bf16,int4"], "--kinds takes a comma list"),
        (["--only", "no-such-shape"], "no shape of the llm suite contains"),
        (["--iters", "0"], "must be positive"),
    ],
)
def test_bench_argument_errors(capsys, argv: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def _gfx950_reason() -> str | None:
    if not torch.cuda.is_available() or torch.version.hip is None:
        return "needs a ROCm GPU (torch.cuda with HIP): none here"
    arch = torch.cuda.get_device_properties(0).gcnArchName
    return None if arch.startswith("gfx950") else f"needs gfx950 (MI355X), found {arch}"


@pytest.mark.gfx950
@pytest.mark.skipif(_gfx950_reason() is not None, reason=_gfx950_reason() or "")
def test_bench_times_the_compiled_kernels_on_gfx950() -> None:
    shapes = [s for s in bench.llm_suite(1024) if s.name.startswith("llama3.1-8b.o.")]
    rows = bench.run(shapes, ["bf16", "fp8", "mxfp8"], iters=2)
    kernels = [r for r in rows if r["config"] not in (None, "torch.matmul")]
    assert len({(r["shape"], r["kind"]) for r in kernels}) == 9, rows
    assert all(r["tflops"] > 0 for r in kernels)
    assert sum(r["selected"] for r in kernels) == 9
