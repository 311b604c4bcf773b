"""Decoding: LLVM's gfx950 disassembly text into instruction records the emulator can bind.

Decoding the text of ``llvm-objdump -d --mcpu=gfx950`` rather than the binary keeps the emulator
small and exactly as good as LLVM's own decoder (which the compiler shares), and gives every
instruction its address and encoding for error and hazard reports.
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass, field

from .errors import EmulatorError

# Special scalar registers, as indices into the wave's scalar register file.
SPECIAL_SGPRS = {
    "flat_scratch_lo": 102,
    "flat_scratch_hi": 103,
    "xnack_mask_lo": 104,
    "xnack_mask_hi": 105,
    "vcc_lo": 106,
    "vcc_hi": 107,
    "m0": 124,
    "exec_lo": 126,
    "exec_hi": 127,
}
SPECIAL_PAIRS = {"vcc": 106, "exec": 126, "flat_scratch": 102, "xnack_mask": 104}
TTMP_BASE = 108
VCC = 106
EXEC = 126
M0 = 124

_BARE_MODIFIERS = {"offen", "idxen", "lds", "glc", "slc", "sc0", "sc1", "nt", "clamp", "dlc", "tfe", "lwe", "gds"}
_MODIFIER_RE = re.compile(r"^([a-z_][a-z0-9_]*):(.+)$")
_REG_RE = re.compile(r"^(v|s|a|ttmp)(?:(\d+)|\[(\d+):(\d+)\])$")
_LINE_RE = re.compile(r"^\s+(\S+)(.*?)\s*//\s*([0-9A-Fa-f]+):((?:\s[0-9A-F]{8})+)")
_LABEL_RE = re.compile(r"^([0-9a-f]+) <([^>]+)>:")
_SYMBOL_RE = re.compile(r"[A-Za-z_.$][\w.$]*")
_GPR_IDX_RE = re.compile(r"^gpr_idx\(([A-Z0-9,]*)\)$")


@dataclass(frozen=True)
class Operand:
    """One operand: a register range, an immediate, or a named special register.

    ``kind`` is ``v`` / ``s`` / ``a`` (``index`` and ``count`` give the range), ``imm`` (an integer in
    ``value``), ``fimm`` (an inline float constant in ``value``), ``scc`` or ``off``.
    """

    kind: str
    index: int = 0
    count: int = 1
    value: float | int = 0
    neg: bool = False
    abs: bool = False


@dataclass
class Inst:
    """A decoded instruction: its text form split into opcode, operands and modifiers."""

    address: int
    opcode: str
    operands: list[Operand]
    modifiers: dict[str, str]
    text: str
    words: tuple[int, ...]
    branch_target: int | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def mod_int(self, name: str, default: int = 0) -> int:
        """A numeric modifier such as ``offset:16`` or ``cbsz:1`` (hex or decimal)."""
        v = self.modifiers.get(name)
        return default if v is None else int(v, 0)

    def mod_list(self, name: str, n: int, default: int = 0) -> list[int]:
        """A bracketed modifier such as ``op_sel:[0,1]``, padded to ``n`` entries."""
        v = self.modifiers.get(name)
        vals = [int(x) for x in v.strip("[]").split(",")] if v else []
        return vals + [default] * (n - len(vals))


def _is_branch(opcode: str) -> bool:
    """SOPP branches: their target is the instruction word's signed 16-bit dword offset."""
    return opcode.startswith("s_cbranch") or opcode == "s_branch"


def _split_top(text: str, sep: str) -> list[str]:
    """``text`` split at each ``sep`` outside brackets and parentheses."""
    if not any(b in text for b in "[]()"):
        return text.split(sep)  # the same pieces, and most operand lists have no brackets
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


@functools.lru_cache(maxsize=4096)
def parse_operand(tok: str) -> Operand:
    """Parse one operand token as LLVM prints it (``v[2:5]``, ``-|v1|``, ``0x7c``, ``1.0``, ``vcc``...).

    Cached: a kernel's few thousand distinct tokens recur across its instructions, and an
    :class:`Operand` is immutable, so instructions can share one."""
    neg = absf = False
    if tok.startswith("-") and not re.match(r"^-\d", tok):
        neg, tok = True, tok[1:]
    if tok.startswith("neg(") and tok.endswith(")"):
        neg, tok = True, tok[4:-1]
    if tok.startswith("|") and tok.endswith("|"):
        absf, tok = True, tok[1:-1]
    if tok.startswith("abs(") and tok.endswith(")"):
        absf, tok = True, tok[4:-1]
    m = _REG_RE.match(tok)
    if m:
        kind, single, lo, hi = m.groups()
        idx = int(single) if single is not None else int(lo)
        count = 1 if single is not None else int(hi) - int(lo) + 1
        if kind == "ttmp":
            kind, idx = "s", idx + TTMP_BASE
        return Operand(kind, idx, count, neg=neg, abs=absf)
    if tok in SPECIAL_SGPRS:
        return Operand("s", SPECIAL_SGPRS[tok], 1, neg=neg, abs=absf)
    if tok in SPECIAL_PAIRS:
        return Operand("s", SPECIAL_PAIRS[tok], 2, neg=neg, abs=absf)
    if tok in ("scc", "src_scc"):
        return Operand("scc")
    if tok in ("off", "null"):
        return Operand("off")
    if tok.startswith("lit(") and tok.endswith(")"):
        tok = tok[4:-1]
    if re.match(r"^-?0x[0-9a-fA-F]+$", tok) or re.match(r"^-?\d+$", tok):
        return Operand("imm", value=int(tok, 0), neg=neg, abs=absf)
    try:
        return Operand("fimm", value=float(tok), neg=neg, abs=absf)
    except ValueError:
        raise EmulatorError(f"cannot parse operand {tok!r}") from None


def parse_line(asm: str, address: int, words: tuple[int, ...]) -> Inst:
    """Split one disassembled instruction into opcode, operands and modifiers."""
    parts = asm.strip().split(None, 1)
    opcode = parts[0]
    rest = parts[1] if len(parts) > 1 else ""
    operands: list[Operand] = []
    modifiers: dict[str, str] = {}
    if opcode == "s_waitcnt":
        for m in re.finditer(r"(vmcnt|expcnt|lgkmcnt)\((\d+)\)", rest):
            modifiers[m.group(1)] = m.group(2)
        if re.fullmatch(r"\s*(0x[0-9a-fA-F]+|\d+)\s*", rest):
            modifiers["raw"] = rest.strip()
        return Inst(address, opcode, operands, modifiers, asm.strip(), words)
    if _is_branch(opcode) and _SYMBOL_RE.fullmatch(rest.strip()):
        # a branch to a named label (hand-written assembly keeps its labels): the target is
        # decoded from the instruction word by ``decode_text``, the name carries nothing more
        return Inst(address, opcode, operands, modifiers, asm.strip(), words)
    for piece in _split_top(rest, ","):
        toks = _split_top(piece.strip(), " ")
        for tok in (t for t in toks if t):
            mm = _MODIFIER_RE.match(tok)
            gm = _GPR_IDX_RE.match(tok)
            if tok in _BARE_MODIFIERS:
                modifiers[tok] = "1"
            elif gm:  # s_set_gpr_idx_on's index mode
                modifiers["gpr_idx"] = gm.group(1)
            elif mm and not _REG_RE.match(tok):
                modifiers[mm.group(1)] = mm.group(2)
            else:
                operands.append(parse_operand(tok))
    return Inst(address, opcode, operands, modifiers, asm.strip(), words)


def decode_text(text: str, kernels: Collection[str] | None = None) -> dict[str, list[Inst]]:
    """Instructions per kernel symbol from ``llvm-objdump -d`` output.

    ``kernels`` names the kernel symbols when known: any other symbol line (a local label that
    hand-written assembly such as AMD's aiter kernels keeps in its symbol table) is then a branch
    target inside the current kernel, not the start of a new one. Without it every symbol starts one.
    """
    out: dict[str, list[Inst]] = {}
    cur: list[Inst] | None = None
    for line in text.splitlines():
        lm = _LABEL_RE.match(line)
        if lm:
            if kernels is None or lm.group(2) in kernels or cur is None:
                cur = out.setdefault(lm.group(2), [])
            continue
        m = _LINE_RE.match(line)
        if not m or cur is None:
            continue
        asm = m.group(1) + m.group(2)
        address = int(m.group(3), 16)
        words = tuple(int(w, 16) for w in m.group(4).split())
        try:
            inst = parse_line(asm, address, words)
        except EmulatorError as e:  # kept, and reported only if the instruction is ever executed
            inst = Inst(address, asm.split()[0], [], {}, asm.strip(), words, extra={"error": str(e)})
        if _is_branch(inst.opcode):
            simm = struct.unpack("<h", struct.pack("<H", words[0] & 0xFFFF))[0]
            inst.branch_target = address + 4 + 4 * simm
        cur.append(inst)
    return out
