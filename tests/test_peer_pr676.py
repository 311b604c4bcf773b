"""tools/peer_pr676.py without PR 676's sources: its argument handling, their shape rules, and the cut of
one steady iteration out of an unrolled K loop (docs/perf-model.md, "PR 676")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "peer_pr676.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peer_pr676", TOOL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # its dataclass looks its module up there
    spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tool = _tool()
    with pytest.raises(SystemExit) as exc:  # a directory without their kernel module
        tool.parse_args([str(tmp_path), "--commit", "abc"])
    assert exc.value.code == 2 and "bf16_gemm.py" in capsys.readouterr().err
    (tmp_path / "bf16_gemm.py").write_text("")
    with pytest.raises(SystemExit):
        tool.parse_args([str(tmp_path), "--commit", "abc", "--kinds", "fp4"])
    assert "--kinds" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the commit is part of every result
        tool.parse_args([str(tmp_path), "--kinds", "bf16"])
    args = tool.parse_args([str(tmp_path), "--commit", "abc", "--kinds", "bf16"])
    assert args.kinds == ["bf16"] and args.out == tool.OUT
    with pytest.raises(SystemExit):  # every kind asked for needs its module: all three by default
        tool.parse_args([str(tmp_path), "--commit", "abc"])
    err = capsys.readouterr().err
    assert "fp8_gemm.py" in err and "mxfp8_gemm.py" in err and "bf16_gemm.py" not in err
    for module in ("fp8_gemm.py", "mxfp8_gemm.py"):
        (tmp_path / module).write_text("")
    assert tool.parse_args([str(tmp_path), "--commit", "abc"]).kinds == ["bf16", "fp8", "mxfp8"]


def test_their_shape_rules() -> None:
    tool = _tool()
    assert tool.accepts("bf16", 8192, 8192, 8192)
    assert not tool.accepts("bf16", 8192, 29568, 8192)  # Qwen2.5-72B's FFN: 29568 = 115.5 x 256
    assert not tool.accepts("bf16", 256, 256, 192)  # 3 K64 tiles: below their pipeline's 4
    assert tool.gemm_bytes("bf16", 256, 256, 64) == 2 * 256 * 64 * 2 + 256 * 256 * 2
    for kind in ("fp8", "mxfp8"):  # K128 tiles, one byte an operand element, bf16 out, scales not counted
        assert tool.accepts(kind, 8192, 8192, 512)
        assert not tool.accepts(kind, 8192, 8192, 384)  # 3 K128 tiles
        assert not tool.accepts(kind, 8192, 8192, 8192 + 64)  # K not a multiple of 128
        assert tool.gemm_bytes(kind, 256, 256, 128) == 2 * 256 * 128 + 256 * 256 * 2


def test_their_launch_arguments() -> None:
    """Each kernel's arguments in its own launcher's order (docs/perf-model.md, "PR 676")."""
    import torch

    tool = _tool()
    k = 4 * 128

    def kinds(args: list) -> list:
        return [(a.dtype, a.numel()) if isinstance(a, torch.Tensor) else a for a in args]

    u8, tile = (torch.uint8, 256 * k), 256 * 256
    assert kinds(tool._args("fp8", k)) == [
        u8,
        u8,
        (torch.bfloat16, tile),
        (torch.float32, 1),
        (torch.float32, 1),
        256,
        256,
    ]
    scales = (torch.int32, 4 * 256)  # one packed E8M0 word per row and K128 tile
    assert kinds(tool._args("mxfp8", k)) == [u8, scales, u8, scales, (torch.bfloat16, tile), 256, 256]
    assert kinds(tool._args("bf16", 256)) == [(torch.uint8, 256 * 256 * 2)] * 2 + [(torch.bfloat16, tile), 256, 256]
    fp8 = (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16)
    assert tool._build_args("fp8", k, "TN") == (k, *fp8)  # TN only: no layout argument
    assert tool._build_args("mxfp8", k, "NT") == (k, *fp8, "NT")
    assert tool._build_args("bf16", 256, "NN") == (256, torch.bfloat16, "NN")


def _insts(ops: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(opcode=o) for o in ops]


def test_unrolled_iteration() -> None:
    """prologue P, a first iteration that differs (x), steady iterations 'mmdmb' (period 5), a tail t."""
    tool = _tool()
    short = _insts("PPP" + "xmmdmb" + "mmdmb" + "tt")
    long = _insts("PPP" + "xmmdmb" + "mmdmb" * 5 + "tt")
    body, n = tool.unrolled_iteration(short, long, 4)
    assert n == 2 and len(body) == 10
    ops = "".join(i.opcode for i in body)
    assert ops[:5] == ops[5:] and sorted(ops[:5]) == sorted("mmdmb")  # a rotation of one steady iteration
    with pytest.raises(ValueError):
        tool.unrolled_iteration(long, short, 4)


def test_committed_result() -> None:
    """docs/data/pr676_peer.json is a predicted result for all three kinds whose summaries are those of
    its own per-GEMM rows, and docs/perf-model.md's 8192^3 row quotes it."""
    import json

    root = TOOL.parents[1]
    tool = _tool()
    result = json.loads((root / tool.OUT).read_text())
    assert result["predicted"] is True and result["pr676_commit"].startswith("10a0813d")
    assert list(result["kinds"]) == ["bf16", "fp8", "mxfp8"]
    square = []
    for kind, s in result["kinds"].items():
        assert sorted(result["pr676_kernels"][kind]) == sorted(tool.PEERS[kind].layouts)
        rows = s["gemms"]
        assert all(r["ratio"] == pytest.approx(r["ours"] / r["pr676"]) for r in rows)
        for side in ("ours", "pr676", "ratio"):
            assert s["llm_both"][side] == pytest.approx(tool.summary([r[side] for r in rows]))
        assert not set(s["pr676_declines"]) & {r["shape"] for r in rows}
        sq = s["square_8192"]
        square += [f"{sq['ours']:.0f} ({sq['ours_limiter']})", f"{sq['pr676']:.0f} ({sq['pr676_limiter']})"]
    doc = (root / "docs" / "perf-model.md").read_text()
    assert "| 8192^3 TFLOP/s (limiter) | " + " | ".join(square) + " |" in doc
