"""Aligned plain-text tables, as every bench script prints its results."""

from __future__ import annotations


def print_rows(rows: list[list[str]]) -> None:
    """The first row is the header: a rule under it, the first column left-aligned, the rest right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))
