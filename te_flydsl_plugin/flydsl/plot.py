"""``--plot FILE.png`` of ``estimate`` and ``bench``: TFLOP/s of each suite GEMM against the peak.

matplotlib is an optional extra (``pip install te-flydsl-plugin[plot]``), imported only here and only
when a plot is asked for; without it :func:`require` says so in one line before any work starts.
"""

from __future__ import annotations

from typing import Any

# MI355X dense peaks by kind, TFLOP/s (AMD Instinct MI355X datasheet: BF16 / FP16 2.5 PFLOP/s,
# FP8 and MXFP8 5.0 PFLOP/s); estimate rows carry their own config's peak (``share_of_peak``).
DATASHEET_PEAK_TFLOPS = {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0, "mxfp8": 5000.0}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require() -> None:
    """Fail early, in one line, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'te-flydsl-plugin[plot]'") from None


def _peak(row: dict[str, Any]) -> float:
    share = row.get("share_of_peak")
    return row["tflops"] / share if share else DATASHEET_PEAK_TFLOPS[row["kind"]]


def plot(rows: list[dict[str, Any]], path: str, title: str) -> int:
    """Write a PNG of the picked config's TFLOP/s per GEMM and kind (and ``torch.matmul``'s where the
    rows have it), with each kind's peak; returns the number of GEMMs plotted."""
    require()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picked = [r for r in rows if r.get("selected")]
    torch_rows = {(r["shape"], r["kind"]): r["tflops"] for r in rows if r.get("config") == "torch.matmul"}
    labels = [f"{r['shape']} {r['kind']}" for r in picked]
    xs = range(len(picked))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(picked) + 2), 5))
    width = 0.4 if torch_rows else 0.8
    ax.bar([x - (width / 2 if torch_rows else 0) for x in xs], [r["tflops"] for r in picked], width, label="FlyDSL")
    if torch_rows:
        ax.bar([x + width / 2 for x in xs], [torch_rows.get((r["shape"], r["kind"]), 0.0) for r in picked], width,
               label="torch.matmul")  # fmt: skip
    ax.scatter(list(xs), [_peak(r) for r in picked], marker="_", s=200, color="black", label="peak", zorder=3)
    ax.set_xticks(list(xs), labels, rotation=90, fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return len(picked)
