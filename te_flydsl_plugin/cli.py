"""``te-flydsl-plugin``: capabilities | check | plugins | doctor | precompile | estimate | bench.

``precompile`` prints each backed config's ISA report and its K-loop report (``flydsl/kloop.py``),
with ``--lds`` the LDS bank conflicts of one emulated tile (``flydsl/lds_conflicts.py``).

Every command takes ``--json`` (before or after the command's name). Errors are one line on stderr
with exit status 2, never a traceback. ``check`` exits 0 when the GEMM is supported and 1 when it is
not. Progress (precompile, bench) goes to stderr, so stdout stays the result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import llvm
from .spec import (
    Capabilities,
    CapabilityRow,
    Format,
    GemmBackend,
    GemmCall,
    GemmProblem,
    Layout,
    OperandSpec,
    Reason,
    ReasonCode,
    SettingsError,
    Verdict,
)

FORMAT_CHOICES = [f.value for f in Format if f not in (Format.OTHER, Format.FP8_BLOCK)]
OUT_CHOICES = ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"]
# --output-quantizer: scaling-format, the facts an output quantizer descriptor carries (operands.py).
QUANTIZER_CHOICES = [f"{s}-{f}" for s in ("delayed", "current", "mxfp8") for f in ("e4m3", "e5m2")]


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _arch(name: str) -> str:
    """argparse ``type`` of every ``--arch``: the name normalised by archs.py, or a usage error."""
    from . import archs

    try:
        return archs.normalize(name)
    except archs.ArchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one: a container's or a batch
    job's share, not the whole host)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _exc_line(exc: BaseException) -> str:
    """``Type: message``, or just ``Type`` when the message is empty (``NotImplementedError()``)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


# ---------------------------------------------------------------- capabilities


def _epilogue_words(caps: Capabilities, sep: str) -> str:
    """Each fused epilogue with the layouts it is defined in: ``bias (TN)``."""
    return ", ".join(f"{e} ({sep.join(x.value for x in lays)})" for e, lays in caps.epilogues)


def markdown(caps: Capabilities) -> str:
    """The capability table as Markdown (docs/capabilities.md is exactly this text)."""
    lines = [
        f"# Capabilities of the `{caps.backend}` backend",
        "",
        "Generated from `te_flydsl_plugin/flydsl/matrix.py` by `te-flydsl-plugin capabilities --markdown`;",
        "a test fails when this file differs from the matrix. A and B are TE's operands (A: weight side,",
        "B: input side). *Backed* lists the combinations a compiled gfx950 kernel backs (compiled, ISA-checked",
        "and run in the emulator); the `flydsl` and `emulator` executors accept only those, the `reference`",
        "executor accepts every row. *Kernel* is named as its configs are (`te-flydsl-plugin precompile`):",
        "`gemm_<lhs>_<rhs>_...`, where the kernel's lhs is TE's B (it gives the output rows) and its rhs TE's A,",
        "so the row A=fp8_e4m3, B=fp8_e5m2 runs `gemm_fp8_e5m2_fp8_e4m3`.",
        "",
        f"Target archs: {', '.join(caps.archs)}",
        "",
        f"Every row: layouts {' '.join(x.value for x in caps.layouts)}; outputs "
        f"{' '.join(x.value for x in caps.out_dtypes)}; epilogues {_epilogue_words(caps, ' ')}.",
        "",
        "| A | B | K multiple | kernel | backed |",
        "|---|---|---|---|---|",
    ]
    for r in caps.rows:
        backed = "<br>".join(f"{lay.value} {o.value} {e}" for lay, o, e in r.backed) or "no"
        lines.append(f"| {r.a_format.value} | {r.b_format.value} | {r.k_multiple} | `{r.kernel}` | {backed} |")
    lines += [
        "",
        "## Rules",
        "",
        "What `check` evaluates, rule by rule in its order (`RULES` in `flydsl/matrix.py`).",
        "",
    ]
    lines += [f"- **{topic}**: {rule}" for topic, rule in caps.rules]
    return "\n".join(lines) + "\n"


def _backed_summary(row: CapabilityRow, caps: Capabilities) -> str:
    """The row's backed (layout, output, epilogue) combinations, per epilogue: ``plain TN,NN,NT x fp32,bf16``
    when they are every pair of the layouts and outputs named, else each pair (``TN/fp32``)."""
    if not row.backed:
        return "no"
    parts = []
    for epi in dict.fromkeys(e for _, _, e in row.backed):
        pairs = {(lay, out) for lay, out, e in row.backed if e == epi}
        lays = [x for x in caps.layouts if any(lay is x for lay, _ in pairs)]
        outs = [x for x in caps.out_dtypes if any(out is x for _, out in pairs)]
        if len(pairs) == len(lays) * len(outs):
            parts.append(f"{epi} {','.join(x.value for x in lays)} x {','.join(x.value for x in outs)}")
        else:
            parts.append(f"{epi} " + ",".join(f"{lay.value}/{out.value}" for lay, out in sorted(pairs)))
    return "; ".join(parts)


def _table(caps: Capabilities) -> str:
    head = ("A", "B", "K%", "kernel (B x A)", "backed by compiled kernels")
    rows = [
        (r.a_format.value, r.b_format.value, str(r.k_multiple), r.kernel, _backed_summary(r, caps)) for r in caps.rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [
        f"{caps.backend} backend, archs: {', '.join(caps.archs)}",
        f"every row: layouts {','.join(x.value for x in caps.layouts)}; outputs "
        f"{','.join(x.value for x in caps.out_dtypes)}",
        fmt.format(*head),
    ]
    out += [fmt.format(*row) for row in rows]
    out += ["", f"epilogues: {_epilogue_words(caps, ',')}"]
    out += [f"{topic}: {rule}" for topic, rule in caps.rules]
    return "\n".join(out)


def _flydsl() -> GemmBackend:
    """The FlyDSL backend, as the registry loads it from its entry point (the CLI asks it as the host does)."""
    from .host import registry

    try:
        return registry.registry().get("flydsl")
    except registry.BackendSelectionError as exc:
        raise CliError(str(exc)) from None


def cmd_capabilities(args: argparse.Namespace) -> int:
    from . import archs

    caps = _flydsl().capabilities()
    if args.arch is not None:
        try:
            archs.require(args.arch, caps.archs)
        except archs.ArchError as exc:
            raise CliError(f"--arch: {exc}") from None
    if args.markdown:
        print(
            json.dumps({"markdown": markdown(caps)}) if args.json else markdown(caps),
            end="" if not args.json else "\n",
        )
        return 0
    _emit(args, caps.to_dict(), _table(caps))
    return 0


# ---------------------------------------------------------------- check


def _what_if_quantizer(choice: str | None) -> Any:
    """The descriptor of ``--output-quantizer SCALING-FORMAT``: facts only, never executed."""
    if choice is None:
        return None
    from .operands import OutputQuantizer
    from .spec import QuantizerSpec

    scaling, fmt = choice.split("-")
    return OutputQuantizer(QuantizerSpec(scaling, Format(f"{'mxfp8' if scaling == 'mxfp8' else 'fp8'}_{fmt}")))


def problem_from_args(args: argparse.Namespace) -> GemmProblem:
    """A GemmProblem for the CLI's M/N/K (output rows, output columns, reduction) and formats.

    Built by the wrapper's own builder (``host/problem.py``) from a call as TE would make it, with meta
    tensors (shapes and dtypes, no memory) for what the flags say is given: D when accumulating, the
    bias in the output's 16-bit dtype (bf16 for an fp32 output) sized as the epilogue needs it, dGELU's
    saved pre-activation; ``bias_type`` the bias's dtype, else bf16 (TE's ``general_gemm`` default). A
    what-if is judged as on one real device.
    """
    import torch

    from .dtypes import COMPUTE_DTYPES, FP8_TORCH_DTYPES
    from .host import problem as _problem

    layout = Layout(args.layout)
    m, n, k = args.m, args.n, args.k
    a_shape = (n, k) if layout in (Layout.TN, Layout.TT) else (k, n)
    b_shape = (k, m) if layout in (Layout.NT, Layout.TT) else (m, k)

    def spec(fmt: str, shape: tuple[int, int]) -> OperandSpec:
        f = Format(fmt)
        quant = f.is_quantized
        return OperandSpec(f, shape, rowwise=True, columnwise=quant, nbytes=shape[0] * shape[1] * max(f.itemsize, 1))

    def meta(shape: tuple[int, ...], dtype: Any) -> Any:
        return torch.empty(shape, dtype=dtype, device="meta")

    out_fmt = Format(args.out_dtype)
    out_torch = COMPUTE_DTYPES.get(out_fmt) or FP8_TORCH_DTYPES.get(out_fmt)
    bias_torch = out_torch if out_fmt in (Format.BF16, Format.FP16) else torch.bfloat16
    out_shape = (m, n)
    given_d = args.accumulate or args.beta not in (None, 0.0)
    bias = meta((m if args.grad and not args.gelu else n,), bias_torch) if args.bias else None
    gelu_in = meta(out_shape, out_torch) if args.gelu and args.grad else None
    call = GemmCall(
        A=None, transA=layout in (Layout.TN, Layout.TT), B=None, transB=layout in (Layout.NT, Layout.TT),
        D=meta(out_shape, out_torch) if given_d else None, quantizer=_what_if_quantizer(args.output_quantizer),
        output_dtype=out_fmt, bias=bias, bias_type=bias_torch if args.bias else torch.bfloat16, gelu=args.gelu,
        gelu_in=gelu_in, grad=args.grad, workspace=None, workspace_size=0, accumulate=args.accumulate,
        use_split_accumulator=False, comm_overlap=object() if args.comm_overlap else None, alpha=args.alpha,
        beta=args.beta,
    )  # fmt: skip
    p = _problem.build(call, spec(args.a_format, a_shape), spec(args.b_format, b_shape), args.arch, "")
    return dataclasses.replace(p, devices=())


def cmd_check(args: argparse.Namespace) -> int:
    for name in ("m", "n", "k"):
        if getattr(args, name) < 0:
            raise CliError(f"--{name} must be >= 0, got {getattr(args, name)}")
    p = problem_from_args(args)
    backend = _flydsl()
    # A backend of its own for this question: the process-wide one keeps its executor (spec.GemmBackend).
    verdict = backend.with_executor(args.executor).check(p)  # type: ignore[attr-defined]
    data = {"backend": backend.name, "executor": args.executor, "arch": args.arch, **verdict.to_dict(),
            "problem": p.to_dict()}  # fmt: skip
    if verdict.ok:
        text = f"supported: {p.layout.value} m={p.m} n={p.n} k={p.k} runs on flydsl ({args.executor})"
    else:
        text = "not supported:\n" + "\n".join(f"  [{r.code.value}] {r.field}: {r.message}" for r in verdict.reasons)
    _emit(args, data, text)
    return 0 if verdict.ok else 1


# ---------------------------------------------------------------- plugins


def cmd_plugins(args: argparse.Namespace) -> int:
    from .host import registry

    reg = registry.load()
    rows = [
        {
            "entry_point": p.name,
            "value": p.value,
            "distribution": p.distribution,
            "version": p.version,
            "status": p.status,
            "error": p.error,
            "backends": [{"name": b.name, "version": b.version} for b in p.backends],
        }
        for p in reg.plugins
    ]
    lines = [f"{len(rows)} GEMM backend plugin(s) in entry-point group transformer_engine.gemm_backends"]
    for r in rows:
        names = ", ".join(f"{b['name']} {b['version']}" for b in r["backends"]) or "-"
        lines.append(f"  {r['entry_point']:<12} {r['status']:<7} {names}  ({r['distribution']} {r['version']})")
        if r["error"]:
            lines.append(f"    error: {r['error']}")
    _emit(args, {"plugins": rows}, "\n".join(lines))
    return 0


# ---------------------------------------------------------------- doctor


def _version(mod: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(mod)
    except metadata.PackageNotFoundError:
        return None


def doctor_report() -> dict[str, Any]:
    """Everything ``doctor`` prints, as data; each problem comes with its fix."""
    import os

    import torch

    from .device import current_arch
    from .host import dispatch, hotpath, registry

    problems: list[dict[str, str]] = []
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_engine": _version("transformer_engine"),
        "flydsl": _version("flydsl"),
        "pluggy": _version("pluggy"),
        "te_flydsl_plugin": _version("te-flydsl-plugin"),
    }
    settings = dispatch.Settings.from_env()
    reg = registry.load()
    backend_status = "native (TE's own GEMM; NVTE_GEMM_BACKEND unset, default or native)"
    executor = availability = None
    if settings.backend:
        try:
            b = reg.get(settings.backend)
            settings = dispatch.validate(settings, b)
        except SettingsError as exc:
            backend_status = "none: install() refuses these settings, TE runs its own GEMMs"
            installed = ", ".join(sorted(reg.backends)) or "none"
            fix = f"correct or unset it (backends installed: {installed}; README lists the values)"
            problems.append({"problem": str(exc), "fix": fix})
        else:
            backend_status = f"{b.name} {b.version}"
            try:
                v = b.availability()
                executor = getattr(b, "executor", None)
            except Exception as exc:  # doctor reports a broken backend; the dispatcher declines it alike
                v = Verdict.no(Reason(ReasonCode.UNAVAILABLE, f"availability() raised {_exc_line(exc)}"))
            availability = v.to_dict()
            for r in v.reasons:
                problems.append({"problem": r.message, "fix": "see README: executors and NVTE_FLYDSL_EXECUTOR"})
    for p in reg.plugins:
        if p.error:
            problems.append({"problem": f"plugin {p.name!r} failed to load: {p.error}",
                             "fix": f"reinstall or uninstall {p.distribution or p.value}"})  # fmt: skip
    lld = llvm.find_ld_lld()
    objdump = llvm.llvm_tool("llvm-objdump")
    if lld is None:
        problems.append({"problem": "no ld.lld >= 18: gfx950 code cannot be compiled here",
                         "fix": "apt-get install lld-22 (or install ROCm)"})  # fmt: skip
    if objdump is None:
        problems.append({"problem": "no llvm-objdump >= 18: ISA checks and the emulator cannot read code objects",
                         "fix": "apt-get install llvm-22"})  # fmt: skip
    if versions["flydsl"] is None:
        problems.append({"problem": "flydsl is not installed: no kernels can be compiled",
                         "fix": "pip install flydsl (Linux x86_64 wheels)"})  # fmt: skip
    if hotpath.MODULE is None:
        problems.append({"problem": f"the compiled decision path is {hotpath.WHY_NOT.split(';')[0]}: each GEMM call "
                                    "is decided in Python, a few microseconds more a call",
                         "fix": hotpath.REBUILD})  # fmt: skip
    te_path = None
    try:
        from .host import te_probe

        te_path = te_probe.active_path()
    except Exception as exc:  # doctor reports, it never fails on a broken TE
        te_path = f"unknown ({type(exc).__name__}: {exc})"
    return {
        "versions": versions,
        "device": {
            "arch": current_arch(),
            "cuda_available": torch.cuda.is_available(),
            "hip": torch.version.hip,
        },
        "selected_backend": backend_status,
        "executor": executor,
        "executor_requested": os.environ.get("NVTE_FLYDSL_EXECUTOR", "auto"),
        "availability": availability,
        "target_arch": settings.target_arch or None,
        "strict": settings.strict,
        "te_gemm_path": te_path,
        "decision_path": hotpath.describe(),
        "gfx950_compile": {
            "ld_lld": lld,
            "llvm_objdump": objdump,
            "possible": bool(lld and objdump and versions["flydsl"]),
        },
        "problems": problems,
    }


_PATH_WORDS = {
    "plugin": "the plugin (TE's generic_gemm is the plugin's wrapper)",
    "te": "TE's own generic_gemm",
    "te-in-tree": "TE's in-tree GEMM backend (its get_gemm_backend() takes GEMMs before generic_gemm)",
    "te-not-loaded": "TE is not loaded in this process (doctor does not import it)",
}


def _te_path_words(info: dict[str, Any] | str | None) -> str:
    """host/te_probe.py's ``active_path()`` as one line of words (docs/te-seam.md lists the paths)."""
    if not isinstance(info, dict):
        return info or "unknown"
    words = _PATH_WORDS.get(info["path"], info["path"])
    if info["path"] == "te-not-loaded":
        return words
    tree = info.get("in_tree", {})
    if not tree.get("getter_present"):
        getter = "no in-tree get_gemm_backend()"
    elif tree.get("neutralised"):
        getter = "in-tree get_gemm_backend() neutralised by the plugin"
    else:
        getter = f"in-tree get_gemm_backend() answers {tree.get('answer', '?')}"
    kernels = "; in-tree FlyDSL kernels present" if tree.get("flydsl_kernels_module") else ""
    return f"{words} (TE {info.get('transformer_engine') or '?'}; {getter}{kernels})"


def cmd_doctor(args: argparse.Namespace) -> int:
    rep = doctor_report()
    v = rep["versions"]
    lines = [f"{k}: {v[k] or 'not installed'}" for k in v]
    lines += [
        f"device arch: {rep['device']['arch']}",
        f"selected backend: {rep['selected_backend']}",
        f"executor: {rep['executor'] or '-'} (requested {rep['executor_requested']})",
        f"TE GEMM path: {_te_path_words(rep['te_gemm_path'])}",
        f"decision path: {rep['decision_path']}",
        f"gfx950 compile possible: {rep['gfx950_compile']['possible']} (ld.lld: {rep['gfx950_compile']['ld_lld']})",
    ]
    lines += ["problems: none"] if not rep["problems"] else ["problems:"]
    lines += [f"  - {p['problem']}\n    fix: {p['fix']}" for p in rep["problems"]]
    _emit(args, rep, "\n".join(lines))
    return 0


# ---------------------------------------------------------------- precompile


def _counts(x: Any) -> str:
    """An instruction count, or several (one per K loop) joined by '/'."""
    return "/".join(map(str, x)) if isinstance(x, list) else str(x)


def cmd_precompile(args: argparse.Namespace) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise CliError(f"--jobs must be at least 1, not {args.jobs}")
    try:
        from .flydsl import family, isa
    except ImportError as exc:
        raise CliError(f"the kernel family cannot be loaded: {exc}") from exc
    from . import archs
    from .flydsl import matrix

    try:
        archs.require(args.arch, matrix.ARCHS)
    except archs.ArchError as exc:
        raise CliError(f"--arch: {exc}") from None
    if llvm.find_ld_lld() is None:
        raise CliError("no ld.lld >= 18 found: apt-get install lld-22 (or install ROCm)")
    jobs = args.jobs or _usable_cpus()
    configs = tuple(c for c in family.BACKED if args.only in c.name)
    if not configs:
        raise CliError(f"no backed kernel config's name contains {args.only!r}")
    # Progress always goes to stderr (a cold cache compiles for minutes): one rewritten line on a
    # terminal, a line per config through a pipe or into a log; stdout stays the result.
    tty = sys.stderr.isatty()
    total = len(configs)
    workers = min(jobs, total)
    print(
        f"compiling or loading {total} kernel configs for {args.arch} in {workers} process(es) (cold: minutes)",
        file=sys.stderr,
        flush=True,
    )

    def progress(i: int, n: int, report: dict[str, Any]) -> None:
        how = "cached" if report.get("from_disk") else f"{report['compile_s']}s" if "compile_s" in report else ""
        line = f"[{i}/{n}] {report['config']} {how}".rstrip()
        print(f"\r{line[:100]:<100}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    try:
        rows = isa.precompile(args.arch, progress=progress, configs=configs, jobs=jobs)
        if args.lds:
            from .flydsl import lds_conflicts

            for i, (cfg, row) in enumerate(zip(configs, rows, strict=True)):
                progress(i + 1, len(rows), {"config": f"LDS banks: {cfg.name}"})
                row["kloop"]["lds"] = lds_conflicts.tile_report(cfg, args.arch)
    except (llvm.ToolchainError, isa.CompileCrash) as exc:
        raise CliError(str(exc)) from exc
    if tty:
        print(file=sys.stderr)
    ok = all(r["ok"] for r in rows)
    lines = [f"{len(rows)} kernel config(s) compiled for {args.arch}", *_isa_table(rows), "", *_kloop_table(rows)]
    _emit(args, {"arch": args.arch, "ok": ok, "kernels": rows}, "\n".join(lines))
    return 0 if ok else 1


def _columns(table: list[tuple[Any, ...]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in table) for i in range(len(table[0]))]
    return ["  " + "  ".join(f"{row[i]!s:<{widths[i]}}" for i in range(len(widths))) for row in table]


def _isa_table(rows: list[dict[str, Any]]) -> list[str]:
    head = ("config", "mfma", "count", "vgpr", "agpr", "acc", "lds", "scratch", "spills", "loop", "epi", "plain",
            "hazards", "compile_s", "ok")  # fmt: skip
    by_name = {r["config"]: r for r in rows}

    def acc(r: dict[str, Any]) -> str:  # where the K loop accumulates: "256a" (AGPRs) or "128v" (arch VGPRs)
        return f"{r['agpr_accumulators']}a" if r["agpr_accumulators"] else f"{r['vgpr_accumulators']}v"

    def twin(r: dict[str, Any], key: str) -> str:  # the plain-store twin's figure, beside a fused epilogue's
        other = by_name.get(r["plain_twin"])
        return "-" if other is None or other is r else _counts(other[key])

    return _columns([head] + [
        (r["config"], r["mfma"], r["mfma_count"], r["vgpr"], r["agpr"], acc(r), r["lds_bytes"], r["scratch_bytes"],
         r["spills"], _counts(r["loop_insts"]), r["epilogue_insts"],
         f"{twin(r, 'loop_insts')}, {twin(r, 'epilogue_insts')}", len(r["wait_state_hazards"]), r["compile_s"],
         "ok" if r["ok"] else "FAIL")
        for r in rows
    ])  # fmt: skip


def _kloop_table(rows: list[dict[str, Any]]) -> list[str]:
    """One steady-state K iteration per config (kloop.py); with --lds, bank-conflict cycles per wave."""
    lds = any("lds" in r["kloop"] for r in rows)
    head = ("config", "tiles", "insts", "mfma", "passes", "mca", "floor", "ratio", "slots/pass", "waitcnt", "nop",
            "barrier")  # fmt: skip
    head += ("conflicts/iter", "epilogue") if lds else ()
    table: list[tuple[Any, ...]] = [head]
    notes = sorted({r["kloop"]["mca_note"] for r in rows if r["kloop"].get("mca_note")})
    for r in rows:
        k = r["kloop"]
        if not k["found"]:
            table.append((r["config"], "no K loop", *[""] * (len(head) - 2)))
            continue
        c = k["by_class"]
        row = (r["config"], k.get("k_tiles", 1), k["instructions"], k["mfma"], k["mfma_passes"],
               k["mca_cycles"] or "-", k["xdl_floor"], k["ratio"] or "-", k["slots_per_pass"], c["s_waitcnt"],
               c["s_nop"], c["s_barrier"])  # fmt: skip
        if lds:
            row += (k["lds"]["per_iteration"]["conflict_cycles"], k["lds"]["epilogue"]["conflict_cycles"])
        table.append(row)
    out = [
        "K loop, one steady-state iteration per wave (llvm-mca; cycles of 4 clocks; floor = MFMA passes; "
        "tiles: the K tiles it multiplies):"
    ]
    out += _columns(table)
    out += [f"llvm-mca: {n}" for n in notes]
    if lds:
        out.append(
            "conflicts: LDS bank-conflict cycles per wave (64 banks x 4 B, one emulated tile; epilogue: after the loop)"
        )
    return out


# ---------------------------------------------------------------- bench


def _check_plot(path: str | None) -> None:
    """``--plot``: matplotlib must be there before any work starts (one line when it is not)."""
    if path:
        from .flydsl import plot

        try:
            plot.require()
        except plot.PlotUnavailable as exc:
            raise CliError(str(exc)) from None


def _plot(path: str | None, rows: list[dict[str, Any]], title: str) -> None:
    if path:
        from .flydsl import plot

        n = plot.plot(rows, path, title)
        print(f"plotted {n} GEMM(s) to {path}", file=sys.stderr)


def cmd_bench(args: argparse.Namespace) -> int:
    """Time the backed kernel configs on a gfx950 GPU (flydsl/bench.py); one-line error elsewhere."""
    from .flydsl import bench

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(bench.KINDS))
    if unknown or not kinds:
        raise CliError(f"--kinds takes a comma list of {', '.join(bench.KINDS)}; got {args.kinds!r}")
    if args.iters < 1 or args.tokens < 1:
        raise CliError("--iters and --tokens must be positive")
    shapes = [s for s in bench.SUITES[args.suite](args.tokens) if args.only in s.name]
    if not shapes:
        raise CliError(f"no shape of the {args.suite} suite contains {args.only!r}")
    _check_plot(args.plot)
    try:
        bench.require_gfx950()
    except RuntimeError as exc:
        raise CliError(str(exc)) from exc
    tty = sys.stderr.isatty()  # progress as precompile's: always on stderr, a line per row off a terminal

    def progress(row: dict[str, Any]) -> None:
        line = f"{row['shape'][:40]:<40} {row['kind']:<6} {row['tflops']:8.1f} TFLOP/s"
        print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)

    rows = bench.run(shapes, kinds, args.iters, progress)
    if tty:
        print(file=sys.stderr)
    head = ("shape", "layout", "m", "n", "k", "kind", "config", "selected", "ms", "TFLOP/s")
    table = [head] + [
        (r["shape"], r["layout"], r["m"], r["n"], r["k"], r["kind"], r["config"] or r.get("declined", ""),
         "*" if r.get("selected") else "", f"{r['ms']:.4f}" if "ms" in r else "",
         f"{r['tflops']:.1f}" if "tflops" in r else "")
        for r in rows
    ]  # fmt: skip
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    lines = [f"{len(shapes)} shape(s) x {len(kinds)} kind(s); * = the config select() picks"]
    lines += ["  " + "  ".join(f"{row[i]!s:<{widths[i]}}" for i in range(len(head))) for row in table]
    _emit(args, {"suite": args.suite, "tokens": args.tokens, "iters": args.iters, "rows": rows}, "\n".join(lines))
    _plot(args.plot, rows, f"measured, {args.suite} suite")
    return 0


# ---------------------------------------------------------------- estimate


def _shape_arg(text: str) -> Any:
    """``MxNxK`` as a TN suite shape."""
    from .flydsl import bench

    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise CliError(f"--shape takes MxNxK with positive integers, got {text!r}")
    m, n, k = map(int, parts)
    return bench.Shape(text, Layout.TN, m, n, k)


def cmd_estimate(args: argparse.Namespace) -> int:
    """Predicted time of every backed config on each GEMM (flydsl/estimate.py: the calibrated timing model)."""
    try:
        from .flydsl import bench, estimate, isa, tile_timing
    except ImportError as exc:
        raise CliError(f"the kernel family cannot be loaded: {exc}") from exc

    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(bench.KINDS))
    if unknown or not kinds:
        raise CliError(f"--kinds takes a comma list of {', '.join(bench.KINDS)}; got {args.kinds!r}")
    if args.shape:
        shapes = [_shape_arg(args.shape)]
    else:
        shapes = [s for s in bench.SUITES[args.suite](args.tokens) if args.only in s.name]
        if not shapes:
            raise CliError(f"no shape of the {args.suite} suite contains {args.only!r}")
    _check_plot(args.plot)
    if llvm.find_ld_lld() is None:
        raise CliError("no ld.lld >= 18 found: apt-get install lld-22 (or install ROCm)")
    tty = sys.stderr.isatty() and not args.json
    reports: dict[Any, dict[str, Any]] = {}
    timings: dict[Any, dict[str, Any]] = {}

    def lines_of(cfg: Any, resident: int) -> dict[str, Any]:
        if cfg not in timings:
            timings[cfg] = tile_timing.kernel_lines(cfg, resident)
        return timings[cfg]

    def report(cfg: Any) -> dict[str, Any]:
        if cfg not in reports:
            reports[cfg] = isa.isa_report(cfg)
            if not args.no_lds:
                from .flydsl import lds_conflicts

                reports[cfg]["kloop"]["lds"] = lds_conflicts.tile_report(cfg)
        return reports[cfg]

    def progress(i: int, total: int, name: str) -> None:
        print(f"\r[{i}/{total}] {name[:60]:<60}", end="", file=sys.stderr, flush=True)

    try:
        rows = estimate.run(shapes, kinds, report, lines_of, progress if tty or args.progress else None)
    except llvm.ToolchainError as exc:
        raise CliError(str(exc)) from exc
    if tty or args.progress:
        print(file=sys.stderr)
    head = ("shape", "layout", "m", "n", "k", "kind", "config", "selected", "predicted ms", "TFLOP/s", "of peak",
            "limiter", "static TFLOP/s")  # fmt: skip
    table = [head] + [
        (r["shape"], r["layout"], r["m"], r["n"], r["k"], r["kind"], r["config"] or r.get("declined", ""),
         "*" if r.get("selected") else "", f"{r['ms']:.4f}" if "ms" in r else "",
         f"{r['tflops']:.0f}" if "tflops" in r else "", f"{r['share_of_peak']:.0%}" if "tflops" in r else "",
         r.get("limiter", ""), f"{r['static']['tflops']:.0f}" if "static" in r else "")
        for r in rows
    ]  # fmt: skip
    note = "predicted by the calibrated model (docs/perf-model.md; static = the K-loop bound)"
    lines = [f"{len(shapes)} shape(s) x {len(kinds)} kind(s), {note}; * = the config select() picks", *_columns(table)]
    data = {"suite": None if args.shape else args.suite, "model": "timing-v1", "predicted": True, "rows": rows}
    _emit(args, data, "\n".join(lines))
    _plot(args.plot, rows, f"predicted, {args.shape or args.suite + ' suite'}")
    return 0


# ---------------------------------------------------------------- main


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own convention for usage errors)
        raise CliError(f"{self.prog}: {message}")


DESCRIPTION = (
    "What the FlyDSL GEMM backend of Transformer Engine supports, and why a GEMM would or would not run "
    "on it. Every command takes --json; errors are one line on stderr, exit status 2."
)
JSON_HELP = "machine-readable output on stdout (also accepted before the command)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="te-flydsl-plugin", description=DESCRIPTION)
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    # Not required here: main() names a missing command itself, after any unknown option.
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, help="the command to run")

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        # SUPPRESS: absent after the command, the main parser's --json (before it) stands.
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)
        p.set_defaults(fn=fn)
        return p

    p = add("capabilities", cmd_capabilities, "print the capability matrix")
    p.add_argument("--arch", default=None, type=_arch, help="only this arch (default: every arch with kernels)")
    p.add_argument("--markdown", action="store_true", help="the Markdown table of docs/capabilities.md")

    p = add("check", cmd_check, "would this GEMM run on FlyDSL, and if not, why")
    p.add_argument("--layout", required=True, choices=[x.value for x in Layout], help="TE's layout (transA, transB)")
    p.add_argument("--m", type=int, required=True, help="output rows")
    p.add_argument("--n", type=int, required=True, help="output columns")
    p.add_argument("--k", type=int, required=True, help="reduction length")
    p.add_argument("--a-format", required=True, choices=FORMAT_CHOICES, help="TE's A (weight side)")
    p.add_argument("--b-format", required=True, choices=FORMAT_CHOICES, help="TE's B (input side)")
    p.add_argument("--out-dtype", required=True, choices=OUT_CHOICES, help="D's dtype")
    for flag, what in (
        ("bias", "a bias is given (fused bias epilogue; with --grad and no --gelu: the bias gradient)"),
        ("gelu", "fused GELU epilogue (with --grad: dGELU, reading the saved pre-activation)"),
        ("grad", "a backward GEMM (TE's grad flag)"),
        ("accumulate", "D is given and accumulated into"),
        ("comm-overlap", "a communication-overlap object is given"),
    ):
        p.add_argument(f"--{flag}", action="store_true", help=what)
    p.add_argument(
        "--output-quantizer",
        choices=QUANTIZER_CHOICES,
        help="an output quantizer is given: per-tensor FP8 delayed or current scaling (E4M3 or E5M2), or MXFP8",
    )
    p.add_argument("--alpha", type=float, default=1.0, help="scale of A x B (default 1)")
    p.add_argument(
        "--beta", type=float, default=None, help="scale of D's old value (default: 1 with --accumulate, else 0)"
    )
    p.add_argument("--arch", default="gfx950", type=_arch, help="evaluate as for this arch (default: gfx950)")
    p.add_argument("--executor", default="flydsl", choices=["flydsl", "reference"],
                   help="judge for compiled kernels (flydsl, default) or the torch reference")  # fmt: skip

    add("plugins", cmd_plugins, "installed GEMM backends")
    add("doctor", cmd_doctor, "versions, device, selection, toolchain; each problem with its fix")

    p = add("precompile", cmd_precompile, "compile every backed kernel config; its ISA and K-loop report")
    p.add_argument("--arch", default="gfx950", type=_arch, help="compile for this arch (default: gfx950)")
    p.add_argument("--only", default="", help="only configs whose name contains this")
    p.add_argument("--lds", action="store_true", help="also count LDS bank conflicts on one emulated tile per config")
    p.add_argument("--jobs", type=int, default=None,
                   help="compile in this many processes (default: the CPUs this process may use)")  # fmt: skip

    p = add("estimate", cmd_estimate, "predicted time of every backed config on an LLM shape suite or one shape")
    p.add_argument("--suite", default="llm", choices=["llm", "square"], help="the shape suite (default llm)")
    p.add_argument("--kinds", default="bf16,fp8,mxfp8", help="comma list of bf16, fp16, fp8, mxfp8")
    p.add_argument("--shape", default="", help="one TN GEMM MxNxK instead of a suite")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch (M of fprop / dgrad)")
    p.add_argument("--only", default="", help="only suite shapes whose name contains this")
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a terminal")
    p.add_argument("--no-lds", action="store_true", help="no bank-conflict count in the static bound")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="TFLOP/s per GEMM against the peak (matplotlib)")

    p = add("bench", cmd_bench, "time every backed config on an LLM shape suite (gfx950 GPU only)")
    p.add_argument("--suite", default="llm", choices=["llm", "square"], help="the shape suite (default llm)")
    p.add_argument("--kinds", default="bf16,fp8,mxfp8", help="comma list of bf16, fp16, fp8, mxfp8")
    p.add_argument("--tokens", type=int, default=8192, help="tokens per micro-batch (M of fprop / dgrad)")
    p.add_argument("--iters", type=int, default=20, help="timed launches per config, after 3 warm-ups")
    p.add_argument("--only", default="", help="only shapes whose name contains this")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="TFLOP/s per GEMM, torch.matmul and the peak")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        if args.command is None:
            parser.error(f"a command is required: one of {', '.join(_commands(parser))}")
        return args.fn(args)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `te-flydsl-plugin capabilities | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0
    except Exception as exc:  # the CLI's contract: one line, never a traceback
        print(f"error: {_exc_line(exc)}", file=sys.stderr)
        return 2


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]


if __name__ == "__main__":
    sys.exit(main())
