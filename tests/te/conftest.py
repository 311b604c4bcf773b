"""Fixtures for the TE seam tests: a fake TE on CPU, and the gate for real TE on CUDA."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_te import forget_fake_te, write_fake_te

REAL_TE = importlib.util.find_spec("transformer_engine") is not None


def _fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rocm_in_tree: bool) -> Iterator[Path]:
    if REAL_TE:
        pytest.skip("real TE is installed here: the fake must not shadow it (test_te_*.py test the real one)")
    from te_flydsl_plugin.host import te

    root = write_fake_te(tmp_path / "site", rocm_in_tree=rocm_in_tree)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv("NVTE_GEMM_BACKEND", raising=False)
    monkeypatch.setattr(te, "_types_registered", False)
    forget_fake_te()
    yield root
    te.uninstall()
    forget_fake_te()


@pytest.fixture
def fake_te(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh fake TE on ``sys.path``; the seam is uninstalled and the fake forgotten afterwards."""
    yield from _fake(tmp_path, monkeypatch, rocm_in_tree=False)


@pytest.fixture
def fake_rocm_te(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Like ``fake_te``, with a ROCm-style in-tree ``get_gemm_backend()`` that routes flydsl itself."""
    yield from _fake(tmp_path, monkeypatch, rocm_in_tree=True)
