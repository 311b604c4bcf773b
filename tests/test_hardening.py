"""Odd GEMM calls from issue 14: each is executed right, declined to TE with its arguments exactly as given,
or refused as TE's own signature refuses it; never an exception from inside the plugin, never a wrong or
reshaped result."""

from __future__ import annotations

import pytest
import torch

import te_flydsl_plugin as tp

ARGS16 = (None, None, torch.float32, None, None, False, None, False, None, 0, False, False)


def tn_args(m: int = 24, n: int = 16, k: int = 32, **tensors) -> tuple:
    """generic_gemm's sixteen positionals for a TN fp32 GEMM (D, bias, gelu_in from ``tensors``)."""
    a = tensors.pop("A", None)
    b = tensors.pop("B", None)
    a = torch.randn(n, k) if a is None else a
    b = torch.randn(m, k) if b is None else b
    args = list((a, True, b, False, *ARGS16))
    for name, pos in (("D", 4), ("bias", 7), ("gelu", 9), ("gelu_in", 10), ("grad", 11)):
        if name in tensors:
            args[pos] = tensors.pop(name)
    assert not tensors
    return tuple(args)


# ---------------------------------------------------------------- item 1: TE's signature


@pytest.mark.parametrize(
    ("args_extra", "kwargs", "match"),
    [
        ((), {"frobnicate": 1}, "frobnicate"),
        ((None, None, None, False, 1.0, None, "extra"), {}, "too many positional"),
        ((None,), {"comm_overlap": None}, "multiple values"),
        ((), {"A": None}, "multiple values"),
    ],
    ids=["unknown-keyword", "23rd-positional", "tail-twice", "A-twice"],
)
def test_a_call_te_would_refuse_raises_typeerror(reference_dispatcher, native, args_extra, kwargs, match):
    with pytest.raises(TypeError, match=match):
        tp.wrap_generic_gemm(native)(*tn_args(), *args_extra, **kwargs)
    assert not native.calls and tp.stats()["total"] == 0


def test_a_missing_argument_raises_typeerror(reference_dispatcher, native):
    with pytest.raises(TypeError, match="use_split_accumulator"):
        tp.wrap_generic_gemm(native)(*tn_args()[:15])


def test_every_argument_may_come_by_keyword(reference_dispatcher, native):
    from te_flydsl_plugin.host.signature import REQUIRED

    args = tn_args()
    res = tp.wrap_generic_gemm(native)(**dict(zip(REQUIRED, args, strict=True)), alpha=2.0)
    torch.testing.assert_close(res[0], 2.0 * args[2] @ args[0].t())
    assert not native.calls


# ---------------------------------------------------------------- item 6 and 13: counting, raising check


def test_the_report_counts_calls_not_reasons(reference_dispatcher, native):
    """Two FORMAT reasons (fp64 A and fp64 B) on one call are one FORMAT decline."""
    a, b = torch.randn(16, 32, dtype=torch.float64), torch.randn(24, 32, dtype=torch.float64)
    gemm = tp.wrap_generic_gemm(native)
    gemm(*tn_args(A=a, B=b))
    gemm(*tn_args(A=a, B=b))
    s = tp.stats()
    assert s["by_reason"] == {"FORMAT": 2} and s["total"] == 2, s
    assert "declined [FORMAT]: 2" in reference_dispatcher.report()


def test_dispatch_copies_no_iterator():
    """copy.copy of itertools.count is deprecated (removed in Python 3.14); counters never need it."""
    import inspect

    from te_flydsl_plugin.host import dispatch

    assert "copy" not in inspect.getsource(dispatch)
