"""Walks docs/te-seam.md's argument table: every ``generic_gemm`` argument, in order, and the outcome it claims.

Each row names a probe: one change to a plain bf16 TN call (``A`` = weight [48, 64], ``B`` = input
[40, 64]) that isolates the argument. The probe runs through the real wrapper and dispatcher (FlyDSL
backend, reference executor, CPU) with a recording stand-in for TE's ``generic_gemm``, and the
outcome (``backend`` or ``declined CODE``, and for passed-through arguments that the stand-in got
the very same object) must be the one the table states. No TE needed: TE's ``DType`` is mirrored by
an IntEnum registered through the seam's own ``register_dtypes``.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from te_flydsl_plugin.host import te_types
from te_flydsl_plugin.host.views import Unsupported
from te_flydsl_plugin.operands import Fp8Operand, MXFP8Operand, OutputQuantizer
from te_flydsl_plugin.spec import Format, GemmCall, QuantizerSpec

DOC = Path(__file__).resolve().parents[1] / "docs" / "te-seam.md"
DType = enum.IntEnum(
    "DType",
    {"kByte": 0, "kInt32": 2, "kFloat32": 4, "kFloat16": 5, "kBFloat16": 6, "kFloat8E4M3": 7, "kFloat8E5M2": 8},
)
M, N, K = 40, 48, 64


def table_rows() -> list[dict[str, str]]:
    """The rows of the table under the heading 'generic_gemm arguments', as {column: cell}."""
    text = DOC.read_text()
    section = text.split("## generic_gemm arguments", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        assert len(cells) == len(header), ln
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def base() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "A": torch.randn(N, K, dtype=torch.bfloat16),
        "transA": True,
        "B": torch.randn(M, K, dtype=torch.bfloat16),
        "transB": False,
        "D": None,
        "quantizer": None,
        "output_dtype": DType.kBFloat16,
        "bias": None,
        "bias_type": DType.kBFloat16,
        "gelu": False,
        "gelu_in": None,
        "grad": False,
        "workspace": torch.empty(0, dtype=torch.uint8),
        "workspace_size": 0,
        "accumulate": False,
        "use_split_accumulator": False,
        "comm_overlap": None,
        "comm_type": None,
        "extra_output": None,
        "bulk_overlap": False,
        "alpha": 1.0,
        "beta": None,
    }


def _fp8(t: torch.Tensor) -> Fp8Operand:
    data = t.float().to(torch.float8_e4m3fn).view(torch.uint8)
    return Fp8Operand(data, data.t().contiguous(), torch.ones(1), Format.FP8_E4M3, True)


def _mx(t: torch.Tensor) -> MXFP8Operand:
    rows, k = t.shape
    data = t.float().to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.full((-(-rows // 128) * 128, -(-k // 32 // 4) * 4), 127, dtype=torch.uint8)
    return MXFP8Operand(data, scales, None, None, Format.MXFP8_E4M3)


class _Subclass(torch.Tensor):
    """A tensor subclass standing for TE's quantized ``Float8Tensor`` D."""


# probe id -> change to the base call. Shapes stay consistent unless the probe is about shape.
PROBES: dict[str, Callable[[dict[str, Any]], None]] = {
    "A fp8 per-tensor": lambda c: c.update(A=_fp8(c["A"]), B=_fp8(c["B"])),
    "A mxfp8": lambda c: c.update(A=_mx(c["A"]), B=_mx(c["B"])),
    "A nvfp4": lambda c: c.update(A=Unsupported(Format.NVFP4, (N, K), "NVFP4TensorStorage")),
    "A unknown object": lambda c: c.update(A=object()),
    "transA+transB (TT)": lambda c: c.update(transB=True, B=c["B"].t().contiguous()),
    "B fp64": lambda c: c.update(B=c["B"].double()),
    "B batched [2, 20, K]": lambda c: c.update(B=c["B"].view(2, M // 2, K)),
    "NT wgrad shapes": lambda c: c.update(
        transA=False, transB=True, A=torch.randn(M, K, dtype=torch.bfloat16), B=torch.randn(M, N, dtype=torch.bfloat16)
    ),
    "D given": lambda c: c.update(D=torch.empty(M, N, dtype=torch.bfloat16)),
    "D wrong dtype": lambda c: c.update(D=torch.empty(M, N, dtype=torch.float16)),
    "quantizer given": lambda c: c.update(quantizer=object()),
    "quantizer current FP8": lambda c: c.update(
        quantizer=OutputQuantizer(QuantizerSpec("current", Format.FP8_E4M3), lambda r, dtype: ("quantized", r, dtype))
    ),
    "quantizer mxfp8": lambda c: c.update(
        quantizer=OutputQuantizer(QuantizerSpec("mxfp8", Format.MXFP8_E4M3), lambda r, dtype: None)
    ),
    "D a tensor subclass": lambda c: c.update(D=torch.empty(M, N, dtype=torch.bfloat16).as_subclass(_Subclass)),
    "output fp8": lambda c: c.update(output_dtype=DType.kFloat8E4M3),
    "output None, no D": lambda c: c.update(output_dtype=None),
    "bias [N]": lambda c: c.update(bias=torch.randn(N, dtype=torch.bfloat16)),
    "bias_type fp32": lambda c: c.update(bias=torch.randn(N, dtype=torch.bfloat16), bias_type=DType.kFloat32),
    "gelu": lambda c: c.update(gelu=True),
    "dgelu without gelu_in": lambda c: c.update(
        transA=False, A=torch.randn(K, N, dtype=torch.bfloat16), gelu=True, grad=True
    ),
    "grad+bias in TN": lambda c: c.update(grad=True, bias=torch.randn(N, dtype=torch.bfloat16)),
    "workspace None": lambda c: c.update(workspace=None, workspace_size=12345),
    "workspace_size odd": lambda c: c.update(workspace_size=7),
    "accumulate without D": lambda c: c.update(accumulate=True),
    "split accumulator": lambda c: c.update(use_split_accumulator=True),
    "comm_overlap given": lambda c: c.update(comm_overlap=object()),
    "comm_type given": lambda c: c.update(comm_type=object()),
    "extra_output given": lambda c: c.update(extra_output=torch.empty(M, N, dtype=torch.bfloat16)),
    "bulk_overlap": lambda c: c.update(bulk_overlap=True),
    "alpha 2": lambda c: c.update(alpha=2.0, output_dtype=DType.kFloat32),
    "beta 0.5 into D": lambda c: c.update(
        accumulate=True, beta=0.5, D=torch.ones(M, N, dtype=torch.float32), output_dtype=DType.kFloat32
    ),
}


class Native:
    """TE's generic_gemm stand-in: records what it was handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append((args, kwargs))
        return ["native", None, None, None]


@pytest.fixture(scope="module", autouse=True)
def te_dtypes() -> None:
    te_types.register_dtypes(DType)


def run_probe(probe: str, reference_dispatcher: Any) -> tuple[str, dict[str, Any], Native, list[Any]]:
    import te_flydsl_plugin

    call = base()
    PROBES[probe](call)
    native = Native()
    wrapped = te_flydsl_plugin.wrap_generic_gemm(native)
    te_flydsl_plugin.reset_stats()
    names = [f.name for f in dataclasses.fields(GemmCall)]
    args = [call[n] for n in names[:16]]
    kwargs = {n: call[n] for n in names[16:]}
    out = wrapped(*args, **kwargs)
    s = te_flydsl_plugin.stats()
    if s["by_backend"].get("flydsl", 0) == 1:
        return "backend", call, native, out
    assert len(native.calls) == 1 and s["fallbacks"], s
    codes = sorted({r["code"] for r in s["fallbacks"][0]["reasons"]})
    return "declined " + ",".join(codes), call, native, out


ROWS = table_rows()


def test_table_lists_every_argument_in_order() -> None:
    assert [r["argument"].strip("`") for r in ROWS] == [f.name for f in dataclasses.fields(GemmCall)]
    assert [int(r["#"]) for r in ROWS] == list(range(1, len(ROWS) + 1))


@pytest.mark.parametrize("row", ROWS, ids=[r["argument"].strip("`") for r in ROWS])
def test_each_row_outcome_is_what_happens(row: dict[str, str], reference_dispatcher: Any) -> None:
    probes = re.findall(r"`([^`]+)` → ([a-z]+(?: [A-Z,]+)?)", row["probe → outcome"])
    assert probes, f"row {row['argument']} names no probe"
    for probe, claimed in probes:
        outcome, call, native, out = run_probe(probe, reference_dispatcher)
        assert outcome == claimed, f"{row['argument']}: probe {probe!r} gave {outcome!r}, the table says {claimed!r}"
        if outcome == "backend":
            assert not native.calls
            if call["D"] is not None:
                assert out[0] is call["D"]  # D honoured: written in place and returned
        else:  # the native GEMM gets the call exactly as it came
            args, kwargs = native.calls[0]
            names = [f.name for f in dataclasses.fields(GemmCall)]
            assert all(a is call[n] for a, n in zip(args, names[:16], strict=True))
            assert all(kwargs[n] is call[n] for n in names[16:])


def test_backend_results_match_te_semantics(reference_dispatcher: Any) -> None:
    """The numbers behind the 'backend' outcomes: batched B keeps its dims, alpha, beta, bias, GELU."""
    _, call, _, out = run_probe("B batched [2, 20, K]", reference_dispatcher)
    assert out[0].shape == (2, M // 2, N)
    _, call, _, out = run_probe("alpha 2", reference_dispatcher)
    torch.testing.assert_close(out[0], 2 * call["B"].float() @ call["A"].float().T, rtol=1e-5, atol=1e-4)
    _, call, _, out = run_probe("beta 0.5 into D", reference_dispatcher)
    torch.testing.assert_close(out[0], 0.5 + call["B"].float() @ call["A"].float().T, rtol=1e-5, atol=1e-4)
    _, call, _, out = run_probe("gelu", reference_dispatcher)
    pre = call["B"].float() @ call["A"].float().T
    torch.testing.assert_close(out[2].float(), pre, rtol=1e-2, atol=2e-2)  # gelu_input: the pre-activation
    torch.testing.assert_close(out[0].float(), torch.nn.functional.gelu(pre, approximate="tanh"), rtol=1e-2, atol=2e-2)
