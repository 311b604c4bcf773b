"""TE's ``generic_gemm`` signature, for binding a call the way TE's own binding does.

TE 2.20 (notes/te-gemm-api.md): sixteen required parameters, then six with defaults; TE passes the
first sixteen positionally and the rest by keyword. pybind11 names every parameter, so any of them may
also come by keyword. A call TE's binding would refuse (an unknown keyword, a 23rd positional, a
parameter given twice or missing) raises the same ``TypeError`` here, before anything is decided:
the plugin never runs a GEMM with an argument it did not read.
"""

from __future__ import annotations

import inspect
from typing import Any

REQUIRED = (
    "A", "transA", "B", "transB", "D", "quantizer", "output_dtype", "bias", "bias_type", "gelu", "gelu_in",
    "grad", "workspace", "workspace_size", "accumulate", "use_split_accumulator",
)  # fmt: skip
DEFAULTS: dict[str, Any] = {
    "comm_overlap": None,
    "comm_type": None,
    "extra_output": None,
    "bulk_overlap": False,
    "alpha": 1.0,
    "beta": None,
}
TAIL = tuple(DEFAULTS)
TAIL_KEYWORDS = frozenset(TAIL)

_SIGNATURE = inspect.Signature(
    [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in REQUIRED]
    + [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=v) for n, v in DEFAULTS.items()]
)


def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(the sixteen required arguments, the six others by name)``; TypeError where TE's binding raises."""
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"generic_gemm(): {exc}") from None
    bound.apply_defaults()
    values = bound.arguments
    return tuple(values[n] for n in REQUIRED), {n: values[n] for n in TAIL}
