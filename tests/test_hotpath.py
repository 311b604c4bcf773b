"""The compiled decision path (host/_hotpath.cpp) against the Python one it defers to (host/wrapper.py).

The Python path is the definition; the compiled one must decide every call as it does, forward exactly the
same objects, count the same, and hand over what it does not read. Each test runs a call through both
(fresh wrappers, the same dispatcher settings) and compares; the counts show the compiled path really
decided the calls it claims (a test passing because everything was handed to Python would be vacuous).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import te_flydsl_plugin as tp
from te_flydsl_plugin.host import dispatch, hotpath, signature, views
from te_flydsl_plugin.host.dispatch import FallbackWarning, GemmNotSupportedError

from .conftest import RecordingNative

ROOT = Path(__file__).resolve().parents[1]
M, N, K = 24, 40, 64  # M != N != K


def test_this_install_has_the_compiled_path():
    """README's setup builds it (pip install --no-build-isolation): CI must run it, not skip it."""
    assert hotpath.MODULE is not None, hotpath.WHY_NOT
    assert type(tp.wrap_generic_gemm(RecordingNative())) is hotpath.MODULE.Wrapper
    assert hotpath.describe().startswith("compiled")


def _tn(dtype: torch.dtype = torch.bfloat16, batch: tuple[int, ...] = (), **over: Any) -> tuple[tuple, dict]:
    """A TN call as TE makes it: weight A (N, K), input B (*batch, M, K), output (*batch, M, N)."""
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(N, K, generator=gen).to(dtype)
    b = torch.randn(*batch, M, K, generator=gen).to(dtype)
    args = dict(A=a, transA=True, B=b, transB=False, D=None, quantizer=None, output_dtype=dtype, bias=None,
                bias_type=None, gelu=False, gelu_in=None, grad=False, workspace=None, workspace_size=0,
                accumulate=False, use_split_accumulator=False)  # fmt: skip
    kwargs = {"alpha": 1.0, "beta": None}
    for k, v in over.items():
        (args if k in args else kwargs)[k] = v
    return tuple(args[n] for n in signature.REQUIRED), kwargs


def _run_both(args: tuple, kwargs: dict, repeat: int = 2) -> dict[str, Any]:
    """Each path's outcome of ``repeat`` identical calls on fresh wrappers: results, what TE got, stats."""
    out: dict[str, Any] = {}
    for compiled in (True, False):
        native = RecordingNative()
        gemm = tp.wrap_generic_gemm(native, compiled=compiled)
        tp.reset_stats()
        results = []
        for _ in range(repeat):
            try:
                results.append(gemm(*args, **kwargs))
            except Exception as exc:  # compared by type and words
                results.append((type(exc), str(exc)))
        out[compiled] = {"results": results, "native": native.calls, "stats": tp.stats(), "wrapper": gemm}
    return out


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    return x == y


def _assert_same(both: dict[str, Any], args: tuple, kwargs: dict) -> None:
    c, p = both[True], both[False]
    assert _same(c["results"], p["results"])
    assert len(c["native"]) == len(p["native"])
    for got, _ in c["native"]:  # TE gets the very objects, as it would from the Python path
        assert len(got) == len(args) and all(x is y for x, y in zip(got, args, strict=True))
    for _, kw in c["native"]:
        assert kw.keys() == kwargs.keys() and all(kw[k] is v for k, v in kwargs.items())
    assert c["stats"] == p["stats"]


@pytest.fixture
def reference(reference_dispatcher):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        yield reference_dispatcher


def test_repeat_calls_are_decided_by_the_compiled_path(reference):
    args, kwargs = _tn(batch=(2,))
    both = _run_both(args, kwargs, repeat=3)
    _assert_same(both, args, kwargs)
    assert both[True]["stats"]["by_backend"] == {"flydsl": 3}
    assert both[True]["wrapper"].counts == {"fast": 2, "handed": 0, "keys": 1}


def _variants() -> dict[str, tuple[tuple, dict]]:
    """Calls that differ from the canonical one in one field each of the compiled key."""
    base, _ = _tn()
    a, b = base[0], base[2]
    off = torch.empty(a.numel() + 1, dtype=a.dtype)[1:].view(a.shape).copy_(a)
    out = torch.zeros(M, N, dtype=torch.bfloat16)
    return {
        "A dtype": _tn(A=a.to(torch.float16)),
        "A start": _tn(A=off),
        "A strides": _tn(A=a.t().contiguous().t()),
        "A shape": _tn(A=a[:, : K // 2].contiguous(), B=b[:, : K // 2].contiguous()),
        "B device": _tn(B=torch.empty(M, K, dtype=torch.bfloat16, device="meta")),
        "B batched": _tn(B=b.expand(3, M, K).contiguous()),
        "layout": _tn(transB=True, B=b.t().contiguous()),
        "both transposed": _tn(transB=True),
        "D": _tn(D=out),
        "D wrong shape": _tn(D=torch.zeros(N, M, dtype=torch.bfloat16)),
        "accumulate": _tn(D=out.clone().fill_(1), accumulate=True),
        "bias": _tn(bias=torch.ones(N, dtype=torch.bfloat16)),
        "bias wrong length": _tn(bias=torch.ones(N + 1, dtype=torch.bfloat16)),
        "gelu": _tn(gelu=True),
        "output dtype": _tn(output_dtype=torch.float32),
        "alpha": _tn(alpha=0.5),
        "beta": _tn(D=out.clone().fill_(2), beta=0.25),
        "comm": _tn(comm_type=1),
        "bulk": _tn(bulk_overlap=True),
    }


@pytest.mark.parametrize("field", list(_variants()))
def test_every_key_field_is_told_apart(reference, field):
    """With the canonical call's key remembered, a call differing in one field gets its own decision: the
    compiled path never serves one problem's verdict to another."""
    base_args, base_kwargs = _tn()
    args, kwargs = _variants()[field]
    for compiled in (True, False):
        gemm = tp.wrap_generic_gemm(RecordingNative(), compiled=compiled)
        gemm(*base_args, **base_kwargs)
        first = gemm(*args, **kwargs)
        again = gemm(*args, **kwargs)
        if compiled:
            assert gemm.counts == {"fast": 1, "handed": 0, "keys": 2}, "the variant must be a second key"
            compiled_out = (first, again)
        else:
            assert _same((first, again), compiled_out)


def test_the_variants_are_not_all_alike(reference):
    """The variants above do reach both outcomes (some run, some are declined), so the test has teeth."""
    ran = set()
    for args, kwargs in _variants().values():
        native = RecordingNative()
        tp.wrap_generic_gemm(native)(*args, **kwargs)
        ran.add(not native.calls)
    assert ran == {True, False}


class Quantizer:
    pass


@pytest.mark.parametrize(
    "over",
    [
        {"quantizer": Quantizer()},  # keyed by the quantizer's registered key, in Python
        {"transA": 1},  # a flag that is no bool
        {"alpha": 1},  # an alpha that is no float
        {"frobnicate": 1},  # an argument TE 2.20 lacks
        {"A": torch.nn.Parameter(torch.randn(N, K)), "B": torch.randn(M, K), "output_dtype": torch.float32},
        {"D": torch.zeros(2, M, N, dtype=torch.bfloat16)},  # a D that does not hold the output
        {"A": torch.randn(N, K, dtype=torch.float64), "output_dtype": torch.float64},  # a dtype no Format names
        {"B": torch.randn(1, 1, 1, 1, 1, 1, M, K).to(torch.bfloat16)},  # more dims than the compiled key holds
        {"A": torch.randn(N, K).to_sparse_csr()},  # no strides to read
        {"B": torch.nested.nested_tensor([torch.randn(M, K), torch.randn(M, K)])},  # no sizes to read
    ],
    ids=[
        "quantizer",
        "int flag",
        "int alpha",
        "unknown keyword",
        "parameter",
        "D shape",
        "fp64 out",
        "7 dims",
        "sparse A",
        "nested B",
    ],
)
def test_calls_it_does_not_read_are_handed_over(reference, over):
    args, kwargs = _tn(**over)
    both = _run_both(args, kwargs)
    _assert_same(both, args, kwargs)
    counts = both[True]["wrapper"].counts
    read = "parameter" in str(type(args[0])).lower() or isinstance(args[4], torch.Tensor)
    assert counts["handed"] == (0 if read else 2), counts


def test_a_new_dispatcher_is_followed(native):
    """configure() replaces the dispatcher: the compiled path forgets its keys and follows the new one."""
    gemm = tp.wrap_generic_gemm(native)
    args, kwargs = _tn()
    try:
        dispatch.configure(backend="default", env={})
        assert gemm(*args, **kwargs)[0] == "native"
        dispatch.configure(backend="flydsl", executor="reference", env={})
        assert isinstance(gemm(*args, **kwargs)[0], torch.Tensor)
        dispatch.configure(backend="flydsl", executor="auto", env={})  # unavailable off gfx950: pass-through
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert gemm(*args, **kwargs)[0] == "native"
        assert tp.stats()["total"] == 1
    finally:
        dispatch.configure(backend="default", executor=None, env={})
    assert len(native.calls) == 2


def test_strict_mode_raises_on_every_declined_call(native):
    dispatch.configure(backend="flydsl", executor="reference", strict=True, env={})
    try:
        gemm = tp.wrap_generic_gemm(native)
        args, kwargs = _tn(transB=True)  # TT: declined
        for _ in range(2):
            with pytest.raises(GemmNotSupportedError):
                gemm(*args, **kwargs)
        assert gemm.counts["fast"] == 1 and not native.calls
    finally:
        dispatch.configure(backend="default", executor=None, env={})


def test_a_fallback_warns_once_and_counts_every_call(reference_dispatcher, native):
    gemm = tp.wrap_generic_gemm(native)
    args, kwargs = _tn(transB=True)
    tp.reset_stats()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        gemm(*args, **kwargs)
        first = len(seen)
        for _ in range(2):
            gemm(*args, **kwargs)
    assert first and len(seen) == first and {w.category for w in seen} == {FallbackWarning}
    assert len({str(w.message) for w in seen}) == first  # once per reason code
    assert tp.stats()["by_backend"] == {"native": 3}
    tp.reset_stats()  # the compiled path keeps counting into the same tallies
    gemm(*args, **kwargs)
    assert tp.stats()["by_backend"] == {"native": 1} and gemm.counts["fast"] == 3


def test_threads_lose_no_count(reference):
    gemm = tp.wrap_generic_gemm(RecordingNative())
    args, kwargs = _tn(transB=True)
    tp.reset_stats()

    def work() -> None:
        for _ in range(500):
            gemm(*args, **kwargs)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tp.stats()["by_backend"] == {"native": 2000}


def test_its_tables_are_checked_against_the_signature():
    """The compiled file reads arguments by position: a signature it was not written for is refused."""
    common = dict(native=print, python_path=print, decide=print, run=print, globals={}, plain=views.PLAIN_TENSORS,
                  dtypes={}, tail=signature.TAIL, defaults=tuple(signature.DEFAULTS.values()),
                  align=views.MAX_ALIGN)  # fmt: skip
    hotpath.MODULE.Wrapper(required=signature.REQUIRED, **common)
    swapped = (signature.REQUIRED[2], signature.REQUIRED[1], signature.REQUIRED[0], *signature.REQUIRED[3:])
    with pytest.raises(ValueError, match=r"signature\.py"):
        hotpath.MODULE.Wrapper(required=swapped, **common)


def test_it_looks_like_the_function_it_wraps():
    def generic_gemm(*args: Any, **kwargs: Any) -> None:
        """TE's docstring."""

    gemm = tp.wrap_generic_gemm(generic_gemm)
    assert gemm.__wrapped__ is generic_gemm and gemm.__te_flydsl_native__ is generic_gemm
    assert (gemm.__name__, gemm.__doc__, gemm.__qualname__) == ("generic_gemm", "TE's docstring.",
                                                                 generic_gemm.__qualname__)  # fmt: skip


def test_the_benchmark_reports_the_compiled_path():
    """benchmarks/dispatch_overhead.py runs and says which path it timed (its figures go in reports)."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/dispatch_overhead.py"), "--calls", "200",
                          "--rounds", "1", "--json"], capture_output=True, text=True, check=True)  # fmt: skip
    rep = json.loads(out.stdout)
    assert rep["decision_path"].startswith("compiled") and rep["target_us"] == 1.5
