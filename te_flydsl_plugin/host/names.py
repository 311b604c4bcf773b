"""The ``NVTE_GEMM_BACKEND`` values that name no plugin backend, read by both the start-up hook
(``autoload.py``) and the dispatcher, so neither imports the other for them."""

from __future__ import annotations

BACKEND_ENV = "NVTE_GEMM_BACKEND"
NATIVE_NAMES = frozenset({"", "default", "native"})  # TE's own GEMM
TE_IN_TREE_NAMES = frozenset({"triton"})  # ROCm TE's own NVTE_GEMM_BACKEND values the plugin does not own
