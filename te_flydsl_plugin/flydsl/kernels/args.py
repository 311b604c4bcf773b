"""The GEMM kernel's runtime arguments, in order: declared once, by :class:`KernelArgs`.

FlyDSL takes a kernel's arguments from its Python signature (``@flyc.kernel`` and ``@flyc.jit`` bind
them with ``inspect.signature`` and build the kernarg list in that order), so ``gemm.gemm_kernel`` and
``gemm.gemm_launch`` must spell theirs out; :func:`check_signature` holds both to :class:`KernelArgs` at
import. Every other place derives the order from it: ``gemm.kernel_args`` builds the values by name,
``gemm.jit_args`` (FlyDSL's host wrappers) and ``launch.kernarg_values`` (the emulator's kernarg packing,
which is positional) read them in field order, and ``gemm_launch`` forwards its parameters to the kernel
in field order.

No FlyDSL import: the declaration says each argument's kind with a host type (a tensor, an int, a
float) and :data:`FLYDSL_TYPES` names the FlyDSL type it is declared as.
"""

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple


class LaunchShape(NamedTuple):
    """One launch's runtime geometry (``gemm.launch_geometry``): every value a 32-bit kernel argument."""

    m: int
    n: int
    k: int
    ld_lhs: int  # leading strides, in elements
    ld_rhs: int
    ld_out: int


class KernelArgs(NamedTuple):
    """The kernel's runtime arguments in signature order (the compile-time ``GemmParams`` follow them).

    Tensors are torch tensors (the emulator) or FlyDSL's wrappers of them (``gemm.jit_args``); slots a
    config does not read hold an unread placeholder (``gemm.kernel_args``).
    """

    out: Any
    lhs: Any
    rhs: Any
    lhs_scale: Any  # FP8: the per-tensor scale_inv; MXFP8: the packed E8M0 words (kernels/mx.py)
    rhs_scale: Any
    bias: Any  # the fused epilogue's buffers (gemm.epilogue_views)
    aux: Any
    partials: Any
    m: int  # LaunchShape's fields, in its order
    n: int
    k: int
    ld_lhs: int
    ld_rhs: int
    ld_out: int
    alpha: float
    beta: float


# The FlyDSL type (``flydsl.expr`` name) each kind of KernelArgs field is declared as in the signatures.
FLYDSL_TYPES: dict[object, str] = {Any: "Tensor", int: "Int32", float: "Float32"}
TENSORS = tuple(name for name, kind in KernelArgs.__annotations__.items() if kind is Any)


def check_signature(fn: Callable[..., Any], fx: Any, tail: tuple[str, ...]) -> None:
    """Raise TypeError unless ``fn``'s parameters are KernelArgs' fields in order, each annotated with its
    FlyDSL type from the module ``fx``, followed by exactly the parameters ``tail``."""
    params = list(inspect.signature(fn).parameters.values())
    want = [(name, getattr(fx, FLYDSL_TYPES[kind])) for name, kind in KernelArgs.__annotations__.items()]
    got = [(p.name, p.annotation) for p in params[: len(want)]]
    rest = tuple(p.name for p in params[len(want) :])
    if got != want or rest != tail:
        raise TypeError(
            f"{fn.__name__}'s parameters {[p.name for p in params]} must be kernels/args.py's KernelArgs "
            f"{list(KernelArgs._fields)} (typed {[FLYDSL_TYPES[k] for k in KernelArgs.__annotations__.values()]}), "
            f"then {list(tail)}"
        )
