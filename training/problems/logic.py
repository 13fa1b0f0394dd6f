"""Propositional formulas, parsed by our own grammar and evaluated as truth-table bitmasks.

reasoning-gym's propositional_logic scorer parses an answer by rescanning it once per operator
and per nesting level (quadratic: a 16 KB answer cost 7 s of CPU), then evaluates it row by row
of the truth table. A stranger's answer goes through this parser instead: one left-to-right pass
over at most `MAX_FORMULA_CHARS`, nesting at most `MAX_DEPTH` deep, and every formula becomes one
integer whose bit i is its truth value under assignment i, so entailment over n ≤ 8 variables is
a handful of 256-bit operations.

The grammar is reasoning-gym's own (logic/propositional_logic.py, `parse_expr`), as a proper
precedence grammar: ↔ binds loosest, then →, ∨, ∧, and ¬ tightest; binary operators group to the
left ("P → Q → R" is "(P → Q) → R", as `parse_expr` splits at the rightmost operator); a variable
is one of the problem's capital letters; plain spaces between tokens are skipped. Anything else
(another letter, "->", two variables side by side, an empty operand, any other whitespace, which
could carry a payload) is not a formula.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

AND, OR, NOT, IMPLIES, IFF = "∧", "∨", "¬", "→", "↔"
# Binary operators, loosest first: the precedence levels of the grammar.
_LEVELS = (IFF, IMPLIES, OR, AND)
# An honest conclusion is a few operators long (reasoning-gym's own are depth 2); the longest
# premise of an allowed config (complexity 5) is about 130 characters.
MAX_FORMULA_CHARS = 512
MAX_DEPTH = 64


@dataclass(frozen=True)
class Formula:
    """A parsed formula as its truth table: bit i is its value under assignment i."""

    table: int
    is_variable: bool


class _Parser:
    def __init__(self, text: str, variables: dict[str, int], everything: int):
        self.text = text
        self.pos = 0
        self.variables = variables  # letter -> its truth-table column
        self.everything = everything  # every assignment's bit set

    def peek(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def binary(self, level: int, depth: int) -> Formula | None:
        if level == len(_LEVELS):
            return self.unary(depth)
        left = self.binary(level + 1, depth)
        while left is not None and self.peek() == _LEVELS[level]:
            self.pos += 1
            right = self.binary(level + 1, depth)
            if right is None:
                return None
            left = Formula(_apply(_LEVELS[level], left.table, right.table, self.everything), is_variable=False)
        return left

    def unary(self, depth: int) -> Formula | None:
        if depth > MAX_DEPTH:
            return None
        token = self.peek()
        self.pos += 1
        if token == NOT:
            inner = self.unary(depth + 1)
            return None if inner is None else Formula(self.everything & ~inner.table, is_variable=False)
        if token == "(":
            inner = self.binary(0, depth + 1)
            if inner is None or self.peek() != ")":
                return None
            self.pos += 1
            return inner
        column = self.variables.get(token)
        return None if column is None else Formula(column, is_variable=True)


def _apply(operator: str, left: int, right: int, everything: int) -> int:
    if operator == AND:
        return left & right
    if operator == OR:
        return left | right
    if operator == IMPLIES:
        return (everything & ~left) | right
    return everything & ~(left ^ right)  # IFF


def truth_columns(variables: list[str]) -> tuple[dict[str, int], int]:
    """Each variable's truth-table column over all 2**n assignments, and the all-true mask.

    Assignment i gives variable j (in sorted order) the value of bit j of i, as reasoning-gym does.
    """
    return _columns(tuple(sorted(set(variables))))


@functools.lru_cache(maxsize=64)
def _columns(ordered: tuple[str, ...]) -> tuple[dict[str, int], int]:
    rows = 1 << len(ordered)
    columns = {}
    for j, name in enumerate(ordered):
        columns[name] = sum(1 << i for i in range(rows) if (i >> j) & 1)
    return columns, (1 << rows) - 1  # callers only read the columns


def parse_formula(text: str, variables: list[str]) -> Formula | None:
    """`text` as a formula over `variables` (single capital letters), or None if it is not one."""
    if len(text) > MAX_FORMULA_CHARS or len(variables) > 8:
        return None
    columns, everything = truth_columns(variables)
    parser = _Parser(text, columns, everything)
    formula = parser.binary(0, 0)
    if formula is None or parser.peek() != "":
        return None
    return formula


def premises_hold(premises: list[Formula], variables: list[str]) -> int:
    """The assignments under which every premise is true, as a truth table: 0 when the premises
    contradict each other; a conclusion follows from them when it is true wherever they hold."""
    _, everything = truth_columns(variables)
    holds = everything
    for premise in premises:
        holds &= premise.table
    return holds


def is_tautology(formula: Formula, variables: list[str]) -> bool:
    _, everything = truth_columns(variables)
    return formula.table == everything
