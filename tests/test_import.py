"""Importing the package is cheap and touches neither TE, flydsl nor a GPU."""

from __future__ import annotations

import subprocess
import sys


def test_import_pulls_in_neither_te_nor_flydsl():
    code = (
        "import sys, torch; import te_flydsl_plugin; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('flydsl', 'transformer_engine', "
        "'transformer_engine_torch')]; print(bad); assert not bad; "
        "assert not torch.cuda.is_initialized()"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
