"""Tensor and sequence parallelism with the plugin, on CPU: two gloo ranks, one process each.

The CPU half of the multi-GPU story (tests/te/test_te_distributed.py runs TE itself on several GPUs).
Each rank runs the GEMMs of a Megatron-style MLP block as TE issues them through ``generic_gemm``:
sequence-parallel all-gather of the input, column-parallel fc1 (TN), row-parallel fc2 (TN), the
reduce-scatter back to sequence shards, and the backward pass (dgrad NN, wgrad NT) of both. Every
GEMM goes through the plugin's wrapper with the FlyDSL backend's reference executor. The test holds:
- the sharded results, gathered, equal the unsharded block computed in float64;
- every rank decided every problem the same way (the verdict depends on the problem alone, so ranks
  cannot take different paths and deadlock a collective);
- a comm+GEMM-overlap call (userbuffers) is declined on every rank and reaches TE's GEMM with its
  arguments exactly as given;
- each rank's counters and exit report count its own calls, and the report names the rank.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
S, H, F = 96, 64, 160  # sequence (split over ranks), hidden, FFN width (split over ranks)
ARGS_AFTER_OUT = (None, None, False, None, False, None, 0, False, False)  # bias .. use_split_accumulator


class _Native:
    """Stands in for TE's generic_gemm: records each call's arguments, computes nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        self.calls.append((args, kwargs))
        return ["native", None, None, None]


def _weights() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(S, H, generator=gen)
    w1 = torch.randn(F, H, generator=gen) / H**0.5
    w2 = torch.randn(H, F, generator=gen) / F**0.5
    dy = torch.randn(S, H, generator=gen)
    return x, w1, w2, dy


def _rank_main(rank: int, init: str, out_dir: str) -> None:
    try:
        result = _rank_steps(rank, init)
    except BaseException:  # the parent reads this file: a child's traceback must not vanish
        result = {"error": traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def _rank_steps(rank: int, init: str) -> dict[str, Any]:
    import te_flydsl_plugin as tp
    from te_flydsl_plugin.host import dispatch

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        dispatch.configure(backend="flydsl", executor="reference", env={})
        native = _Native()
        gemm = tp.wrap_generic_gemm(native)
        dtype = torch.bfloat16

        def mm(a: torch.Tensor, ta: bool, b: torch.Tensor, tb: bool) -> torch.Tensor:
            return gemm(a.to(dtype), ta, b.to(dtype), tb, None, None, torch.float32, *ARGS_AFTER_OUT)[0]

        x, w1, w2, dy = _weights()
        x_local, dy_local = x.chunk(WORLD)[rank], dy.chunk(WORLD)[rank]  # sequence-parallel shards
        w1_local = w1.chunk(WORLD, 0)[rank]  # column parallel: [F/world, H]
        w2_local = w2.chunk(WORLD, 1)[rank].contiguous()  # row parallel: [H, F/world]

        def all_gather(t: torch.Tensor) -> torch.Tensor:
            parts = [torch.empty_like(t) for _ in range(WORLD)]
            dist.all_gather(parts, t.contiguous())
            return torch.cat(parts)

        def reduce_scatter(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)  # gloo has no reduce_scatter: all-reduce, keep this rank's rows
            return t.chunk(WORLD)[rank]

        x_full = all_gather(x_local)
        h = mm(w1_local, True, x_full, False)  # fc1 fprop, TN: [S, F/world]
        y_local = reduce_scatter(mm(w2_local, True, h, False))  # fc2 fprop, TN, then RS
        dy_full = all_gather(dy_local)
        dh = mm(w2_local, False, dy_full, False)  # fc2 dgrad, NN: [S, F/world]
        dw2 = mm(h, False, dy_full, True)  # fc2 wgrad, NT: [H, F/world]
        dx_local = reduce_scatter(mm(w1_local, False, dh, False))  # fc1 dgrad, NN, then RS
        dw1 = mm(x_full, False, dh, True)  # fc1 wgrad, NT: [F/world, H]

        # A userbuffers-overlapped GEMM (TE passes comm_overlap / comm_type / extra_output): declined.
        overlap, comm_type, extra = object(), object(), torch.empty(1)
        args = (w1_local.to(dtype), True, x_full.to(dtype), False, None, None, torch.float32, *ARGS_AFTER_OUT)
        kwargs = {"comm_overlap": overlap, "comm_type": comm_type, "extra_output": extra}
        assert gemm(*args, **kwargs)[0] == "native"
        (got_args, got_kwargs), *more = native.calls
        assert not more and set(got_kwargs) == set(kwargs)
        assert all(a is b for a, b in zip(got_args, args, strict=True)), "positional arguments were not forwarded"
        for name, value in kwargs.items():
            assert got_kwargs[name] is value, f"{name} was not forwarded as given"

        s = tp.stats()
        decisions = sorted(
            (f["problem"]["layout"], f["problem"]["m"], f["problem"]["n"], f["problem"]["k"], "native")
            for f in s["fallbacks"]
        )
        return {
            "y": y_local,
            "dx": dx_local,
            "dw1": dw1,
            "dw2": dw2,
            "by_backend": s["by_backend"],
            "by_reason": s["by_reason"],
            "declined": decisions,
            "report": dispatch.current().report(),
        }
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    d: Path = tmp_path_factory.mktemp("tp")
    init = f"file://{d / 'rendezvous'}"
    mp.start_processes(_rank_main, args=(init, str(d)), nprocs=WORLD, join=True, start_method="spawn")
    out = [torch.load(d / f"rank{r}.pt") for r in range(WORLD)]
    for r, res in enumerate(out):
        assert "error" not in res, f"rank {r} failed:\n{res['error']}"
    return out


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    err = float((got.double() - want).norm() / want.norm())
    assert err < 1e-2, f"{what}: relative error {err:.3g} (bf16 operands, fp32 output)"


def test_sharded_block_equals_the_unsharded_one(ranks: list[dict[str, Any]]) -> None:
    x, w1, w2, dy = (t.to(torch.bfloat16).double() for t in _weights())
    h = x @ w1.T
    hb = h.to(torch.float32).to(torch.bfloat16).double()  # fc2 reads h in bf16, as each rank does
    _close(torch.cat([r["y"] for r in ranks]), hb @ w2.T, "fc2 output (after reduce-scatter)")
    dh = dy @ w2
    dhb = dh.to(torch.float32).to(torch.bfloat16).double()
    _close(torch.cat([r["dx"] for r in ranks]), dhb @ w1, "input gradient (after reduce-scatter)")
    _close(torch.cat([r["dw1"] for r in ranks]), dhb.T @ x, "fc1 weight gradient (column shards)")
    _close(torch.cat([r["dw2"] for r in ranks], dim=1), dy.T @ hb, "fc2 weight gradient (row shards)")


def test_every_rank_decides_alike_and_counts_its_own_calls(ranks: list[dict[str, Any]]) -> None:
    for r, res in enumerate(ranks):
        assert res["by_backend"] == {"flydsl": 6, "native": 1}, f"rank {r}: {res['by_backend']}"
        assert res["by_reason"] == {"FEATURE": 1}, f"rank {r}: {res['by_reason']}"
    assert all(res["declined"] == ranks[0]["declined"] for res in ranks)


def test_each_rank_reports_its_own_calls(ranks: list[dict[str, Any]]) -> None:
    """NVTE_GEMM_BACKEND_REPORT prints one report per process: each says which rank it is."""
    for r, res in enumerate(ranks):
        head = res["report"].splitlines()[0]
        assert head.startswith(f"te-flydsl-plugin [rank {r}]: 7 GEMM calls"), res["report"]
