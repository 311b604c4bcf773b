"""CLI: every command's text and --json output, exit codes, one-line errors, the generated docs table."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from te_flydsl_plugin import cli, llvm
from te_flydsl_plugin.flydsl import family, matrix

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "capabilities.md"
CHECK = ["check", "--layout", "NN", "--m", "300", "--n", "200", "--k", "96", "--a-format", "fp8_e4m3",
         "--b-format", "fp8_e5m2", "--out-dtype", "bf16"]  # fmt: skip


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_docs_capabilities_table_is_generated_from_the_matrix():
    assert DOCS.read_text() == cli.markdown(matrix.capabilities()), (
        "docs/capabilities.md is stale: run `te-flydsl-plugin capabilities --markdown > docs/capabilities.md`"
    )


def test_capabilities_text_and_json(capsys):
    code, out, _ = run(capsys, "capabilities")
    assert code == 0 and "mxfp8_e4m3" in out and "gfx950" in out
    code, out, _ = run(capsys, "capabilities", "--json")
    data = json.loads(out)
    assert code == 0 and data == matrix.capabilities().to_dict()
    assert len(data["rows"]) == len(matrix.capabilities().rows)


def test_capabilities_rejects_an_arch_without_kernels(capsys):
    code, out, err = run(capsys, "capabilities", "--arch", "gfx942")
    assert code == 2 and not out and err.count("\n") == 1 and "gfx942" in err


def test_check_supported_with_reference_exits_0(capsys):
    code, out, _ = run(capsys, *CHECK, "--executor", "reference", "--json")
    data = json.loads(out)
    assert code == 0 and data["supported"] is True and data["reasons"] == []
    assert data["backend"] == "flydsl" and data["problem"]["m"] == 300 and data["problem"]["n"] == 200


def test_check_unbacked_kernel_exits_1_with_reason(capsys):
    code, out, _ = run(capsys, *CHECK, "--json")
    data = json.loads(out)
    row = matrix.capabilities().row(matrix.Format.FP8_E4M3, matrix.Format.FP8_E5M2)
    backed = row.is_backed(matrix.Layout.NN, matrix.Format.BF16, "plain")
    assert data["supported"] is backed and code == (0 if backed else 1)
    if not backed:
        assert [r["code"] for r in data["reasons"]] == ["KERNEL"]


@pytest.mark.parametrize(
    ("layout", "fmts", "out", "flags", "epilogue"),
    [
        ("TN", ("bf16", "bf16"), "bf16", ["--bias"], "bias"),
        ("TN", ("fp8_e4m3", "fp8_e4m3"), "bf16", ["--gelu"], "gelu"),
        ("TN", ("mxfp8_e4m3", "mxfp8_e4m3"), "fp16", ["--bias", "--gelu"], "bias_gelu"),
        ("NN", ("fp8_e4m3", "fp8_e5m2"), "bf16", ["--gelu", "--grad"], "dgelu"),
        ("NN", ("fp16", "fp16"), "fp16", ["--bias", "--gelu", "--grad"], "dgelu_bgrad"),
        ("NT", ("bf16", "bf16"), "fp32", ["--bias", "--grad", "--accumulate"], "bgrad"),
    ],
    ids=lambda x: x if isinstance(x, str) else "-".join(x),
)
def test_check_fused_epilogues_on_gfx950_are_supported(capsys, layout, fmts, out, flags, epilogue):
    """Backed fused-epilogue rows answer supported for the compiled executor (issue 11's CLI item)."""
    code, text, _ = run(capsys, "check", "--layout", layout, "--m", "304", "--n", "256", "--k", "512",
                        "--a-format", fmts[0], "--b-format", fmts[1], "--out-dtype", out, *flags,
                        "--arch", "gfx950", "--executor", "flydsl", "--json")  # fmt: skip
    data = json.loads(text)
    assert code == 0 and data["supported"], data["reasons"]
    assert data["problem"]["epilogue"] == epilogue


def test_check_unbacked_fused_epilogue_says_kernel(capsys):
    """FP8 bgrad has no compiled kernel: declined with KERNEL, naming the epilogue."""
    code, text, _ = run(capsys, "check", "--layout", "NT", "--m", "304", "--n", "256", "--k", "512", "--a-format",
                        "fp8_e4m3", "--b-format", "fp8_e5m2", "--out-dtype", "bf16", "--bias", "--grad",
                        "--arch", "gfx950", "--executor", "flydsl", "--json")  # fmt: skip
    data = json.loads(text)
    assert code == 1 and [r["code"] for r in data["reasons"]] == ["KERNEL"]
    assert "epilogue bgrad" in data["reasons"][0]["message"]


def test_check_lists_every_reason_with_fields(capsys):
    code, out, _ = run(capsys, "check", "--layout", "TT", "--m", "3", "--n", "5", "--k", "7", "--a-format",
                       "nvfp4", "--b-format", "bf16", "--out-dtype", "fp8_e4m3", "--comm-overlap",
                       "--output-quantizer", "mxfp8-e4m3", "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 1 and not data["supported"]
    codes = {(r["code"], r["field"]) for r in data["reasons"]}
    assert {("FORMAT", "a_format"), ("LAYOUT", "layout"), ("FORMAT", "out_dtype"), ("FEATURE", "quantizer"),
            ("FEATURE", "comm_overlap")} <= codes  # fmt: skip
    code, out, _ = run(capsys, "check", "--layout", "TN", "--m", "3", "--n", "5", "--k", "7", "--a-format",
                       "bf16", "--b-format", "bf16", "--out-dtype", "bf16", "--executor", "reference")  # fmt: skip
    assert code == 1 and "[ALIGNMENT] k:" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--layout", "XX", "--m", "1", "--n", "1", "--k", "1"],
        ["check", "--layout", "TN", "--m", "-1", "--n", "1", "--k", "8", "--a-format", "bf16", "--b-format", "bf16",
         "--out-dtype", "bf16"],
        ["nosuchcommand"],
        [],
    ],
)  # fmt: skip
def test_errors_are_one_line_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_plugins_lists_the_flydsl_backend(capsys):
    code, out, _ = run(capsys, "plugins", "--json")
    data = json.loads(out)
    flydsl = next(p for p in data["plugins"] if p["entry_point"] == "flydsl")
    assert code == 0 and flydsl["status"] == "loaded" and flydsl["backends"][0]["name"] == "flydsl"
    code, out, _ = run(capsys, "plugins")
    assert "flydsl" in out and "loaded" in out


def test_doctor_reports_versions_selection_and_problems(capsys, monkeypatch):
    monkeypatch.setenv("NVTE_GEMM_BACKEND", "flydsl")
    monkeypatch.setenv("NVTE_FLYDSL_EXECUTOR", "auto")
    code, out, _ = run(capsys, "doctor", "--json")
    data = json.loads(out)
    assert code == 0 and data["versions"]["torch"] and data["selected_backend"].startswith("flydsl")
    # On a machine without gfx950, auto is unavailable, and doctor says so with a fix.
    if data["device"]["arch"] != "gfx950":
        assert any("gfx950" in p["problem"] for p in data["problems"])
        assert all(p["fix"] for p in data["problems"])
    code, out, _ = run(capsys, "doctor")
    assert code == 0 and "selected backend: flydsl" in out


@pytest.mark.parametrize("layout", ["NN", "TN", "NT"])
@pytest.mark.parametrize("extra", [[], ["--bias"], ["--bias", "--json"]])
def test_check_gelu_grad_answers_instead_of_crashing(capsys, layout, extra):
    """dGELU needs gelu_in; the CLI has no tensors, so it must describe one rather than pass a stand-in."""
    argv = ["check", "--layout", layout, "--m", "256", "--n", "192", "--k", "96", "--a-format", "bf16",
            "--b-format", "bf16", "--out-dtype", "bf16", "--gelu", "--grad", "--executor", "reference",
            *extra]  # fmt: skip
    code, out, err = run(capsys, *argv)
    assert code in (0, 1) and not err, err
    if layout == "NN":  # dgelu (and dgelu_bgrad with --bias) is an NN epilogue: supported
        assert code == 0, out
    else:
        assert code == 1 and "EPILOGUE" in out and f"not {layout}" in out, out


def _one_line_error(code: int, out: str, err: str) -> None:
    assert code == 2 and not out and err.startswith("error: ") and err.count("\n") == 1, (code, out, err)


@pytest.mark.parametrize("command", [["capabilities"], CHECK, ["precompile"]])
@pytest.mark.parametrize("arch", ["bogus", "", "  "])
def test_unknown_arch_names_are_one_line_errors(capsys, command, arch):
    code, out, err = run(capsys, *command, "--arch", arch)
    _one_line_error(code, out, err)
    assert "unknown arch" in err and "gfx950" in err


@pytest.mark.parametrize("arch", ["GFX950", " gfx950 ", "gfx950:sramecc+:xnack-"])
def test_arch_names_are_case_insensitive(capsys, arch):
    code, out, _ = run(capsys, *CHECK, "--executor", "reference", "--arch", arch, "--json")
    assert code == 0 and json.loads(out)["arch"] == "gfx950"
    code, out, _ = run(capsys, *CHECK, "--arch", arch, "--json")
    assert "ARCH" not in {r["code"] for r in json.loads(out)["reasons"]}


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_precompile_jobs_below_one_is_a_one_line_error(capsys, jobs):
    code, out, err = run(capsys, "precompile", "--jobs", jobs)
    _one_line_error(code, out, err)
    assert f"--jobs must be at least 1, not {jobs}" in err


def test_a_known_arch_without_kernels_is_not_supported_and_nothing_compiles(capsys, monkeypatch):
    from te_flydsl_plugin.flydsl import isa

    def no_compile(*_a, **_k):
        raise AssertionError("precompile compiled for an arch without kernels")

    monkeypatch.setattr(isa, "isa_report", no_compile)
    code, out, err = run(capsys, "precompile", "--arch", "gfx942")
    _one_line_error(code, out, err)
    assert "gfx942 is not supported" in err
    with pytest.raises(ValueError, match="gfx942 is not supported"):
        isa.precompile("GFX942")
    code, out, _ = run(capsys, *CHECK, "--arch", "gfx942", "--json")
    assert code == 1 and "ARCH" in {r["code"] for r in json.loads(out)["reasons"]}


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"NVTE_GEMM_BACKEND": "bogus"}, "NVTE_GEMM_BACKEND='bogus' names no installed GEMM backend"),
        ({"NVTE_GEMM_BACKEND": "flydsl", "NVTE_FLYDSL_EXECUTOR": "bogus"}, "NVTE_FLYDSL_EXECUTOR='bogus'"),
        ({"NVTE_GEMM_BACKEND": "flydsl", "NVTE_FLYDSL_TARGET_ARCH": "bogus"}, "unknown NVTE_FLYDSL_TARGET_ARCH"),
    ],
)
def test_doctor_reports_a_bad_setting(env, problem):
    """In a fresh process (the backend reads NVTE_FLYDSL_EXECUTOR when it is first loaded)."""
    import os
    import subprocess
    import sys

    full = {**os.environ, "NVTE_FLYDSL_EXECUTOR": "", "NVTE_FLYDSL_TARGET_ARCH": "", **env}
    full["PYTHONPATH"] = os.pathsep.join(sys.path)
    r = subprocess.run([sys.executable, "-m", "te_flydsl_plugin.cli", "doctor", "--json"], env=full,
                       capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert "unset" not in data["selected_backend"] and data["selected_backend"].startswith("none"), data
    assert any(problem in p["problem"] and p["fix"] for p in data["problems"]), data["problems"]


def test_doctor_survives_a_backend_whose_availability_raises(capsys, monkeypatch):
    from te_flydsl_plugin.host import registry
    from te_flydsl_plugin.spec import Verdict

    class Broken:
        name, version = "broken", "0.0"

        def capabilities(self):
            raise NotImplementedError

        def availability(self) -> Verdict:
            raise NotImplementedError

        def check(self, problem) -> Verdict:
            return Verdict.yes()

        def run(self, problem, call):
            raise AssertionError

    reg = registry.Registry(backends={"broken": Broken()}, providers={"broken": "entry point 'broken'"})
    monkeypatch.setattr(registry, "load", lambda *_: reg)
    monkeypatch.setenv("NVTE_GEMM_BACKEND", "broken")
    code, out, err = run(capsys, "doctor", "--json")
    assert code == 0 and not err, err
    data = json.loads(out)
    assert data["selected_backend"].startswith("broken 0.0")
    assert any("availability() raised NotImplementedError" in p["problem"] for p in data["problems"])


def test_an_unknown_option_is_named_even_without_a_command(capsys):
    for argv in (["--bogus"], ["--bogus", "plugins"], ["plugins", "--bogus"]):
        code, out, err = run(capsys, *argv)
        _one_line_error(code, out, err)
        assert "unrecognized arguments: --bogus" in err, err
    code, out, err = run(capsys)
    _one_line_error(code, out, err)
    assert "capabilities" in err and "doctor" in err  # names the commands


@pytest.mark.parametrize("command", [["capabilities"], ["plugins"], [*CHECK, "--executor", "reference"]])
def test_json_is_accepted_before_the_command_too(capsys, command):
    code, before, _ = run(capsys, "--json", *command)
    assert code == 0 and isinstance(json.loads(before), dict)
    code, after, _ = run(capsys, *command, "--json")
    assert json.loads(after) == json.loads(before)
    code, text, _ = run(capsys, *command)
    with pytest.raises(ValueError):
        json.loads(text)


def test_help_is_plain_text_and_every_flag_says_what_it_does():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, cli.argparse._SubParsersAction)]
    for name, p in [("te-flydsl-plugin", parser), *sub.choices.items()]:
        assert p.description and "``" not in p.description and ":func:" not in p.description, name
        for action in p._actions:
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest}"


def test_doctor_prints_the_te_gemm_path_as_words(capsys, monkeypatch):
    from te_flydsl_plugin.host import te_probe

    info = {"path": "te-in-tree", "transformer_engine": "2.9.0", "plugin_installed": False,
            "in_tree": {"getter_present": True, "neutralised": False, "flydsl_kernels_module": True,
                        "answer": "'flydsl'"}}  # fmt: skip
    monkeypatch.setattr(te_probe, "active_path", lambda: info)
    code, out, _ = run(capsys, "doctor")
    (line,) = [x for x in out.splitlines() if x.startswith("TE GEMM path:")]
    assert code == 0 and "{" not in line and "TE 2.9.0" in line and "in-tree" in line and "'flydsl'" in line, line


def test_capabilities_text_says_which_combinations_are_backed_and_how_kernels_are_named(capsys):
    code, out, _ = run(capsys, "capabilities")
    assert code == 0 and "combos" not in out
    row = next(x for x in out.splitlines() if x.split()[:2] == ["fp8_e4m3", "fp8_e5m2"])
    caps = matrix.capabilities()
    (mine,) = [r for r in caps.rows if (r.a_format.value, r.b_format.value) == ("fp8_e4m3", "fp8_e5m2")]
    epilogues = {e for _, _, e in mine.backed}  # this row's own: fused epilogues are backed per row
    assert epilogues and all(e in row for e in epilogues) and "TN,NN,NT x fp32,bf16,fp16" in row, row
    assert "gemm_fp8_e5m2_fp8_e4m3" in row and "kernel (B x A)" in out  # the config's order: lhs=B, rhs=A
    assert "lhs" in cli.markdown(caps) and "gemm_fp8_e5m2_fp8_e4m3" in cli.markdown(caps).split("|")[0]


def test_precompile_through_a_pipe_reports_progress_on_stderr(capsys, monkeypatch):
    from te_flydsl_plugin.flydsl import isa

    def report(cfg, arch):
        return {"config": cfg.name, "mfma": "m", "mfma_count": 1, "vgpr": 1, "agpr": 0, "agpr_accumulators": 0,
                "vgpr_accumulators": 1, "lds_bytes": 0, "scratch_bytes": 0, "spills": 0, "compile_s": 1.5,
                "from_disk": False, "ok": True, "kloop": {"found": False}, "loop_insts": [1], "epilogue_insts": 1,
                "wait_state_hazards": [],
                "plain_twin": cfg.name}  # fmt: skip

    monkeypatch.setattr(isa, "isa_report", report)
    monkeypatch.setattr(llvm, "find_ld_lld", lambda: "/usr/bin/ld.lld")
    total = len(family.BACKED)
    for json_flag in ([], ["--json"]):
        code, out, err = run(capsys, "precompile", "--jobs", "1", *json_flag)  # in this process: the patch
        assert code == 0 and out
        lines = err.splitlines()
        assert f"{total} kernel configs for gfx950 in 1 process(es)" in lines[0], err
        assert lines[1].startswith(f"[1/{total}] ") and lines[-1].startswith(f"[{total}/{total}] "), err
        assert len(lines) == total + 1 and "\r" not in err


def test_bench_through_a_pipe_reports_progress_on_stderr(capsys, monkeypatch):
    from te_flydsl_plugin.flydsl import bench

    row = {"shape": "square4096", "layout": "TN", "m": 4096, "n": 4096, "k": 4096, "kind": "bf16",
           "config": "gemm_bf16_bf16", "selected": True, "ms": 1.0, "tflops": 137.4}  # fmt: skip

    def fake_run(shapes, kinds, iters, progress):
        progress(row)
        return [row]

    monkeypatch.setattr(bench, "require_gfx950", lambda: None)
    monkeypatch.setattr(bench, "run", fake_run)
    code, out, err = run(capsys, "bench", "--suite", "square", "--only", "square4096", "--kinds", "bf16", "--json")
    assert code == 0 and json.loads(out)["rows"] == [row]
    assert err.count("\n") == 1 and "square4096" in err and "137.4 TFLOP/s" in err and "\r" not in err


# Per option: (valid values, junk values). Each option is junk one time in sixteen, left out rarely.
_CHECK_VALUES = {
    "--layout": (["TN", "NN", "NT", "TT"], ["tn", "XX", ""]),
    "--m": (["0", "1", "300", "4096"], ["-1", "x", "1e3"]),
    "--n": (["0", "4", "200", "99999999999"], ["-5", ""]),
    "--k": (["0", "7", "16", "96"], ["-3", "nan"]),
    "--a-format": (cli.FORMAT_CHOICES, ["fp4", ""]),
    "--b-format": (cli.FORMAT_CHOICES, ["int8"]),
    "--out-dtype": (cli.OUT_CHOICES, ["fp64"]),
    "--alpha": (["1", "0", "-2.5", "nan", "inf"], ["x"]),
    "--beta": (["0", "1", "nan", "-inf"], [""]),
    "--arch": (["gfx950", "GFX942", "gfx950:xnack-"], ["bogus", "", "sm_90"]),
    "--executor": (["flydsl", "reference"], ["emulator", "bogus"]),
    "--output-quantizer": (cli.QUANTIZER_CHOICES, ["delayed", "fp8", ""]),
}
_CHECK_FLAGS = ["--bias", "--gelu", "--grad", "--accumulate", "--comm-overlap", "--json"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    picks=st.fixed_dictionaries({o: st.tuples(st.integers(0, 15), st.integers(0, 20)) for o in _CHECK_VALUES}),
    left_out=st.one_of(st.just(()), st.just(()), st.just(()), st.tuples(st.sampled_from(sorted(_CHECK_VALUES)))),
    flags=st.lists(st.sampled_from(_CHECK_FLAGS), unique=True),
    json_first=st.booleans(),
)
def test_check_with_any_arguments_answers_or_errors_in_one_line(capsys, picks, left_out, flags, json_first):
    argv = ["--json"] if json_first else []
    argv.append("check")
    for opt, (junk, i) in picks.items():
        if opt not in left_out:
            values = _CHECK_VALUES[opt][junk == 0]
            argv += [opt, values[i % len(values)]]
    code, out, err = run(capsys, *argv, *flags)
    assert code in (0, 1, 2), (argv, code)
    if code == 2:
        assert not out and err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert not re.match(r"error: \w+(Error|Exception)\b", err), f"a crash, not a usage error: {argv} {err}"
    else:
        assert not err and out, (argv, err)
        if json_first or "--json" in flags:
            assert json.loads(out)["supported"] is (code == 0)


def test_compiling_for_an_arch_without_kernels_is_an_error_not_an_abort(tmp_path, monkeypatch):
    from te_flydsl_plugin.archs import ArchError
    from te_flydsl_plugin.flydsl import compiled

    monkeypatch.setenv("TE_FLYDSL_CACHE_DIR", str(tmp_path))
    with pytest.raises(ArchError, match="gfx942 is not supported"):
        compiled.compile_config(family.BACKED[0], "gfx942")


def test_capabilities_and_check_ask_the_backend_through_the_registry(capsys, monkeypatch):
    """The CLI reads no matrix of its own: it asks the registry's backend, and check --executor goes through
    with_executor, leaving the process-wide backend as it was."""
    import dataclasses

    from te_flydsl_plugin.flydsl.plugin import backend
    from te_flydsl_plugin.host import registry
    from te_flydsl_plugin.spec import Verdict

    before = backend().requested
    code, out, _ = run(capsys, *CHECK, "--executor", "reference", "--json")
    assert code == 0 and json.loads(out)["supported"] is True and backend().requested == before
    asked = []

    class Fake:
        name, version = "flydsl", "fake"

        def capabilities(self):
            return dataclasses.replace(matrix.capabilities(), archs=("gfx-fake",))

        def availability(self):
            return Verdict.yes()

        def check(self, problem):
            return Verdict.yes()

        def run(self, problem, call):
            raise AssertionError("the CLI never runs a GEMM")

        def with_executor(self, name):
            asked.append(name)
            return self

    monkeypatch.setattr(registry, "_cached", registry.Registry(backends={"flydsl": Fake()}))
    code, out, _ = run(capsys, "capabilities", "--json")
    assert code == 0 and json.loads(out)["archs"] == ["gfx-fake"]
    code, out, _ = run(capsys, *CHECK, "--json")
    assert code == 0 and json.loads(out)["supported"] is True and asked == ["flydsl"]
