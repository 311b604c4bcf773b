"""TE tensor + sequence parallelism with the plugin on two GPUs (NCCL), one process per GPU.

Each rank builds a ``te.TransformerLayer`` with ``tp_size=2``, ``sequence_parallel=True`` and its own
``tp_group``, copies one state into a twin, and trains both for a few steps on the same sequence
shard: one on TE's own GEMM, one with the plugin (reference executor). Losses and every gradient
must agree, and every rank's counters must show its GEMMs on the backend (none declined: this
configuration has no comm+GEMM overlap). Skips, with the reason, on fewer than two GPUs. NCCL's
NVLink multicast stays off (NCCL_NVLS_ENABLE=0), as the lent machines need.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
from te_real import requires_te

pytestmark = [
    pytest.mark.te,
    requires_te,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (TP=2 over NCCL)"),
]

WORLD, STEPS = 2, 4
HIDDEN, FFN, HEADS, SEQ, BATCH = 512, 1536, 8, 256, 2


def _rank_main(rank: int, init: str, out_dir: str) -> None:
    try:
        result = _train(rank, init)
    except BaseException:
        result = {"error": traceback.format_exc()}
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def _train(rank: int, init: str) -> dict[str, Any]:
    import torch.distributed as dist
    import transformer_engine.pytorch as te
    from te_real import grads, plugin_installed

    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=WORLD)
    try:
        group = dist.new_group(list(range(WORLD)))

        def build() -> torch.nn.Module:
            return te.TransformerLayer(
                HIDDEN, FFN, HEADS, tp_group=group, tp_size=WORLD, sequence_parallel=True,
                set_parallel_mode=True, hidden_dropout=0.0, attention_dropout=0.0,
                params_dtype=torch.bfloat16, seq_length=SEQ, micro_batch_size=BATCH,
            )  # fmt: skip

        torch.manual_seed(1234 + rank)
        native, twin = build().cuda(), build().cuda()
        twin.load_state_dict(native.state_dict())
        gen = torch.Generator(device="cuda").manual_seed(99 + rank)  # this rank's sequence shard
        xs = [torch.randn(SEQ // WORLD, BATCH, HIDDEN, generator=gen, device="cuda", dtype=torch.bfloat16)
              for _ in range(STEPS)]  # fmt: skip

        def train(module: torch.nn.Module) -> tuple[list[float], dict[str, torch.Tensor]]:
            opt = torch.optim.SGD(module.parameters(), lr=1e-2)
            losses = []
            for x in xs:
                opt.zero_grad(set_to_none=True)
                loss = module(x).float().pow(2).mean()
                loss.backward()
                opt.step()
                losses.append(float(loss))
            return losses, grads(module)

        want_losses, want_grads = train(native)
        with plugin_installed() as plugin:
            got_losses, got_grads = train(twin)
        s = plugin.stats()
        return {
            "want": want_losses,
            "got": got_losses,
            "grad_err": {
                k: float((got_grads[k].float() - v.float()).norm() / v.float().norm().clamp_min(1e-12))
                for k, v in want_grads.items()
            },
            "stats": {"by_backend": s["by_backend"], "by_reason": s["by_reason"]},
        }
    finally:
        dist.destroy_process_group()


def test_tp2_sequence_parallel_training_matches_native(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    init = f"file://{tmp_path / 'rendezvous'}"
    mp.start_processes(_rank_main, args=(init, str(tmp_path)), nprocs=WORLD, join=True, start_method="spawn")
    for r in range(WORLD):
        res = torch.load(tmp_path / f"rank{r}.pt")
        assert "error" not in res, f"rank {r} failed:\n{res['error']}"
        for step, (got, want) in enumerate(zip(res["got"], res["want"], strict=True)):
            assert abs(got - want) <= 2e-2 * abs(want), f"rank {r} step {step}: loss {got} vs native {want}"
        bad = {k: e for k, e in res["grad_err"].items() if e > 3e-2}
        assert not bad, f"rank {r}: gradients off: {bad}"
        assert res["stats"]["by_backend"].get("flydsl", 0) > 0, f"rank {r}: {res['stats']}"
        assert res["stats"]["by_backend"].get("native", 0) == 0, f"rank {r}: declined {res['stats']['by_reason']}"
