"""``check(problem, executor)``: the FlyDSL backend's verdict, the capability matrix's rules evaluated.

Pure and total: it reads only the problem and the matrix (``matrix.py``: the rows and :data:`matrix.RULES`,
each rule's predicate beside its words), never raises, and lists every reason that applies (not just the
first), each with the field it is about, in the order of the rules.
"""

from __future__ import annotations

from ..spec import Capabilities, GemmProblem, Verdict
from . import matrix


def check(problem: GemmProblem, executor: str, caps: Capabilities | None = None) -> Verdict:
    """``problem``'s verdict for ``executor`` under ``caps`` (default: the FlyDSL matrix)."""
    caps = caps or matrix.capabilities()
    case = matrix.Case(problem, executor, caps, caps.row(problem.a.format, problem.b.format))
    for rule in matrix.RULES:
        case.found += rule.reasons(case)
    return Verdict(tuple(case.found))
