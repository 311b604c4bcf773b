"""``te-flydsl-plugin bench``: the GEMM family's speed on a gfx950 GPU, shape by shape, config by config.

Why it exists: the tile heuristic (``kernels/select.py``: 256 x 256, or 128 x 128 for small grids, on 4
waves) was chosen by arithmetic, because no MI355X was reachable where the family was written.
On one, this measures what the choice should rest on. For every shape of a suite (TE's fprop,
dgrad and wgrad GEMMs of LLM linear layers) it times every backed config of the problem's kind, the
one ``select`` picks marked, and, for 16-bit problems, torch.matmul (hipBLASLt) on the same
operands. Operands are built once per shape and go through the plugin's own plan (storage choice,
MXFP8 scale packing, pieces); only the ``flydsl`` executor's run is timed (the kernel launches, and for a
fused epilogue its bias widening or bias-gradient reduction on the same stream). Every timing checks that
the compiled kernel ran (a ``launch_log.LaunchLog`` around it), never a fallback. It refuses to run anywhere but
gfx950: there is nothing to time elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..spec import Format, GemmCall, GemmProblem, Layout
from . import mx_layout
from .kernels.config import KernelConfig

# (model, hidden, fused QKV width, FFN width): Llama-3.1-8B / 70B, Qwen2.5-72B, Mistral-7B.
MODELS = (
    ("llama3.1-8b", 4096, 6144, 14336),
    ("llama3.1-70b", 8192, 10240, 28672),
    ("qwen2.5-72b", 8192, 10240, 29568),
    ("mistral-7b", 4096, 6144, 14336),
)
# A kind names TE's operand formats per GEMM: forward operands, and the gradient's in backward GEMMs
# (TE's HYBRID recipe: E4M3 forward, E5M2 gradients).
KINDS = {
    "bf16": (Format.BF16, Format.BF16),
    "fp16": (Format.FP16, Format.FP16),
    "fp8": (Format.FP8_E4M3, Format.FP8_E5M2),
    "mxfp8": (Format.MXFP8_E4M3, Format.MXFP8_E5M2),
}
_OUT = {"bf16": Format.BF16, "fp16": Format.FP16, "fp8": Format.BF16, "mxfp8": Format.BF16}


@dataclass(frozen=True)
class Shape:
    """One GEMM as TE calls it: ``layout``, output rows ``m``, columns ``n``, reduction ``k``."""

    name: str
    layout: Layout
    m: int
    n: int
    k: int
    epilogue: str = "plain"  # a fused epilogue TE requests for this GEMM (matrix.EPILOGUE_LAYOUTS)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def llm_suite(tokens: int = 8192) -> list[Shape]:
    """fprop (TN), dgrad (NN) and wgrad (NT) of each model's QKV, output, gate+up and down projections
    at ``tokens`` tokens per micro-batch (M = tokens for fprop/dgrad, the layer's output for wgrad)."""
    shapes = []
    for model, hidden, qkv, ffn in MODELS:
        for layer, fan_in, fan_out in (
            ("qkv", hidden, qkv),
            ("o", hidden, hidden),
            ("up", hidden, 2 * ffn),
            ("down", ffn, hidden),
        ):
            shapes += [
                Shape(f"{model}.{layer}.fprop", Layout.TN, tokens, fan_out, fan_in),
                Shape(f"{model}.{layer}.dgrad", Layout.NN, tokens, fan_in, fan_out),
                Shape(f"{model}.{layer}.wgrad", Layout.NT, fan_out, fan_in, tokens),
            ]  # fmt: skip
        # The fused epilogues TE requests in a layer with biases and a GELU MLP: the QKV fprop with its
        # bias and the wgrad with its bias gradient (BGRADB), fc1 with bias + GELU, fc2's dgrad with dGELU
        # and fc1's bias gradient.
        shapes += [
            Shape(f"{model}.qkv.fprop+bias", Layout.TN, tokens, qkv, hidden, "bias"),
            Shape(f"{model}.qkv.wgrad+bgrad", Layout.NT, qkv, hidden, tokens, "bgrad"),
            Shape(f"{model}.up.fprop+bias_gelu", Layout.TN, tokens, ffn, hidden, "bias_gelu"),
            Shape(f"{model}.down.dgrad+dgelu_bgrad", Layout.NN, tokens, ffn, hidden, "dgelu_bgrad"),
        ]  # fmt: skip
    return shapes


SUITES: dict[str, Callable[[int], list[Shape]]] = {
    "llm": llm_suite,
    "square": lambda _t: [Shape(f"square{s}", Layout.TN, s, s, s) for s in (2048, 4096, 8192)],
}


def formats(kind: str, layout: Layout) -> tuple[Format, Format]:
    """TE's (A, B) formats for ``kind``: in backward GEMMs (NN, NT) the gradient is TE's B in dgrad
    and wgrad alike, so B takes the gradient format."""
    fwd, grad = KINDS[kind]
    return fwd, (fwd if layout is Layout.TN else grad)


def _operand(fmt: Format, shape: tuple[int, int], device: torch.device) -> Any:
    """A TE-shaped operand of logical ``shape`` with every storage the layouts may read (values are
    irrelevant to the timing: finite random FP8 bytes, unit E8M0 scales)."""
    from ..dtypes import payload_dtype
    from ..operands import Fp8Operand, MXFP8Operand

    if not fmt.is_quantized:
        return torch.randn(shape, device=device, dtype=payload_dtype(fmt))
    data = torch.randn(shape, device=device).to(payload_dtype(fmt)).view(torch.uint8)
    if fmt.is_fp8:
        one = torch.ones(1, device=device)
        return Fp8Operand(data, data.t().contiguous(), one, fmt)
    rows, cols = shape

    def scales(r: int, c: int) -> torch.Tensor:
        return torch.full((r, c), mx_layout.PAD_BYTE, dtype=torch.uint8, device=device)  # E8M0 2^0

    def up(x: int, m: int) -> int:
        return -(-x // m) * m

    return MXFP8Operand(
        data, scales(up(rows, 128), up(cols // 32, 4)), data, scales(up(rows // 32, 4), up(cols, 128)), fmt
    )


def candidates(cfg: KernelConfig, m: int, n: int, k: int) -> list[KernelConfig]:
    """``select``'s choice for the problem, then every other backed config of the same kind (formats,
    majorness, output, epilogue): the tiles and wave counts the heuristic chooses between."""
    from .family import BACKED
    from .kernels.select import select

    chosen = select(cfg, m, n, k)
    kind = ("lhs_format", "rhs_format", "lhs_k_major", "rhs_k_major", "out_format", "epilogue")

    def same(c: KernelConfig) -> bool:
        return all(getattr(c, f) == getattr(chosen, f) for f in kind)

    return [chosen] + [c for c in BACKED if same(c) and c != chosen]


def _time_ms(fn: Callable[[], None], iters: int) -> float:
    """Milliseconds per call: CUDA/HIP events around ``iters`` calls after three warm-up calls."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _epilogue_args(shape: Shape, out_dtype: torch.dtype, device: torch.device) -> tuple:
    """``(bias, bias_type, gelu, gelu_in, grad)`` of ``generic_gemm`` for the shape's fused epilogue."""
    epi = shape.epilogue
    grad = epi in ("bgrad", "dgelu", "dgelu_bgrad")
    gelu = "gelu" in epi
    bias = None
    if epi in ("bias", "bias_gelu", "bgrad", "dgelu_bgrad"):
        bias = torch.randn(shape.m if epi == "bgrad" else shape.n, device=device, dtype=out_dtype)
    gelu_in = torch.randn(shape.m, shape.n, device=device, dtype=out_dtype) if gelu and grad else None
    return bias, out_dtype, gelu, gelu_in, grad


def require_gfx950() -> None:
    """Raise RuntimeError with the reason unless a gfx950 GPU is the current device."""
    from ..device import current_arch

    arch = current_arch()
    if not (torch.version.hip and arch.startswith("gfx950")):
        raise RuntimeError(
            f"bench times compiled gfx950 kernels and needs a gfx950 (MI355X) GPU; this machine's accelerator "
            f"is {arch} (torch {torch.__version__}{', ROCm' if torch.version.hip else ''}); nothing was timed"
        )


def problem_for(shape: Shape, kind: str, device: torch.device, arch: str) -> tuple[GemmProblem, GemmCall]:
    """(problem, call) of one suite GEMM as TE would call it, with operands on ``device`` (``meta``
    builds it from shapes alone, judged as on one real device: meta tensors are otherwise declined)."""
    from ..dtypes import torch_dtype_of
    from ..host import problem as host_problem
    from ..host import views

    a_fmt, b_fmt = formats(kind, shape.layout)
    a_shape, b_shape = host_problem.operand_shapes(shape.layout, shape.m, shape.n, shape.k)
    a, b = _operand(a_fmt, a_shape, device), _operand(b_fmt, b_shape, device)
    torch_out = torch_dtype_of(_OUT[kind])
    call = GemmCall(a, shape.layout is Layout.TN, b, shape.layout is Layout.NT, None, None, torch_out,
                    *_epilogue_args(shape, torch_out, device), None, 0, False, False)  # fmt: skip
    problem = host_problem.build(call, views.spec_of(a), views.spec_of(b), arch, device.type)
    if device.type == "meta":
        problem = dataclasses.replace(problem, devices=())
    return problem, call


def plan_for(shape: Shape, kind: str, device: torch.device, arch: str) -> tuple[Any, Any]:
    """(verdict, plan) of :func:`problem_for`'s GEMM; the plan is None when ``check`` declines."""
    from . import check, plan

    problem, call = problem_for(shape, kind, device, arch)
    verdict = check.check(problem, "flydsl")
    return verdict, (plan.build(problem, call) if verdict.ok else None)


def run(
    shapes: list[Shape],
    kinds: list[str],
    iters: int = 20,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (shape, kind, config), plus torch.matmul's for 16-bit kinds; see the module docstring."""
    require_gfx950()
    from ..device import current_arch
    from .executors import gpu
    from .launch_log import LaunchLog

    device = torch.device("cuda")
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        for kind in kinds:
            a_fmt, _ = formats(kind, shape.layout)
            base = {"shape": shape.name, "layout": shape.layout.value, "m": shape.m, "n": shape.n, "k": shape.k,
                    "epilogue": shape.epilogue}  # fmt: skip
            base["kind"] = kind
            verdict, p = plan_for(shape, kind, device, current_arch())
            if p is None:
                rows.append({**base, "config": None, "declined": str(verdict)})
                continue
            for i, cfg in enumerate(candidates(p.config, shape.m, shape.n, shape.k)):
                q = dataclasses.replace(p, config=cfg)
                with LaunchLog() as log:
                    ms = _time_ms(lambda q=q: gpu.run(q), iters)
                if log.count("gemm", "flydsl") != (iters + 3) * len(q.pieces):
                    raise RuntimeError(f"{cfg.name}: the compiled kernel did not run every time")
                row = {**base, "config": cfg.name, "selected": i == 0, "ms": ms, "tflops": shape.flops / ms / 1e9}
                rows.append(row)
                if progress is not None:
                    progress(row)
            if not a_fmt.is_quantized and shape.epilogue == "plain":
                lhs, rhs = p.lhs.data, p.rhs.data
                x = lhs if p.lhs.k_major else lhs.t()
                w = rhs if p.rhs.k_major else rhs.t()
                ms = _time_ms(lambda x=x, w=w: torch.matmul(x, w.t()), iters)
                rows.append({**base, "config": "torch.matmul", "selected": False, "ms": ms,
                             "tflops": shape.flops / ms / 1e9})  # fmt: skip
    return rows
