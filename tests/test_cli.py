"""CLI: every command's text and --json output, exit codes, one-line errors, the generated docs table."""

from __future__ import annotations

import json
import pathlib

import pytest

from te_flydsl_plugin import cli
from te_flydsl_plugin.flydsl import matrix

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
                       "--output-quantizer", "--json")  # fmt: skip
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
