"""TE's ``generic_gemm`` signature, for binding a call the way TE's own binding does.

TE 2.20 (notes/te-gemm-api.md): sixteen required parameters, then six with defaults; TE passes the
first sixteen positionally and the rest by keyword. pybind11 names every parameter, so any of them may
also come by keyword. A parameter given twice or missing raises the ``TypeError`` TE's binding raises.
An argument this list does not know (a keyword, a 23rd positional) is not the plugin's to judge: a newer
TE may have added it. :func:`bind` names it, and the host sends the call to TE's own ``generic_gemm``
exactly as it came, where TE 2.20 raises its ``TypeError`` and a newer TE does what it means. Either way
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


_NAMES = frozenset(REQUIRED) | TAIL_KEYWORDS


def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], tuple[str, ...]]:
    """``(the sixteen required arguments, the six others by name, the arguments TE 2.20 has not)``.

    TypeError, as TE's binding raises it, for a parameter given twice or missing.
    """
    unknown = tuple(sorted(k for k in kwargs if k not in _NAMES))
    unknown += tuple(f"positional argument {i + 1}" for i in range(len(_SIGNATURE.parameters), len(args)))
    known = {k: v for k, v in kwargs.items() if k in _NAMES} if unknown else kwargs
    try:
        bound = _SIGNATURE.bind(*args[: len(_SIGNATURE.parameters)], **known)
    except TypeError as exc:
        raise TypeError(f"generic_gemm(): {exc}") from None
    bound.apply_defaults()
    values = bound.arguments
    return tuple(values[n] for n in REQUIRED), {n: values[n] for n in TAIL}, unknown
