"""docs/architecture.dot draws the code as it is: each box is a package (its id is the package's
name, bench/ included), every solid arrow between two boxes is an import, and every import
between two boxes is a solid arrow. A dashed arrow says something else (a program that runs
another) and must not stand for an import. The imports are tests/support/import_graph.py's."""

from __future__ import annotations

import re

from tests.support.import_graph import ROOT, WITH_BENCH, import_graph, package_graph

DRAWING = ROOT / "docs" / "architecture.dot"
# the bare `sapo.node` namespace: an empty __init__ that `from sapo.node import cli` counts
NOT_DRAWN = {"sapo.node"}

BOX = re.compile(r'"([\w.]+)"\s*\[')  # once the arrows are taken out
ARROW = re.compile(r'"([\w.]+)"\s*->\s*"([\w.]+)"\s*(\[[^\]]*\])?')


def drawing(text: str) -> tuple[set[str], set[tuple[str, str]], set[tuple[str, str]]]:
    """(boxes, solid arrows, dashed arrows) of a dot file written as docs/architecture.dot is."""
    text = re.sub(r"//[^\n]*", "", text)
    solid, dashed = set(), set()
    for importer, imported, attributes in ARROW.findall(text):
        (dashed if "dashed" in attributes else solid).add((importer, imported))
    return set(BOX.findall(ARROW.sub("", text))), solid, dashed


def disagreements(text: str, packages: dict[str, set[str]]) -> list[str]:
    """What the drawing `text` gets wrong about the package graph `packages`."""
    boxes, solid, dashed = drawing(text)
    imports = {(a, b) for a, targets in packages.items() for b in targets if a in boxes and b in boxes}
    problems = [f"no box for {p}" for p in sorted(set(packages) - boxes - NOT_DRAWN)]
    problems += [f"a box for {b}, which is no package" for b in sorted(boxes - set(packages))]
    problems += [f"{a} -> {b} is drawn, but {a} does not import {b}" for a, b in sorted(solid - imports)]
    problems += [f"{a} imports {b}, and no arrow says so" for a, b in sorted(imports - solid)]
    problems += [f"{a} -> {b} is dashed, but it is an import: draw it solid" for a, b in sorted(dashed & imports)]
    return problems


def test_the_drawing_is_the_import_graph():
    problems = disagreements(DRAWING.read_text(encoding="utf-8"), package_graph(import_graph(WITH_BENCH)))
    assert not problems, "docs/architecture.dot does not match the code (then `make docs`):\n" + "\n".join(problems)


def test_a_wrong_drawing_is_caught():
    packages = {"a": {"b"}, "b": {"c"}, "c": set(), "d": set()}
    right = '"a" [label="A"]; "b" [label="B"]; "c" [label="C"]; "d" [label="D"];\n"a" -> "b"; "b" -> "c";'
    assert disagreements(right, packages) == []
    assert disagreements(right.replace('"b" -> "c";', '"b" -> "c" [style=dashed]; "a" -> "c";'), packages) == [
        "a -> c is drawn, but a does not import c",
        "b imports c, and no arrow says so",
        "b -> c is dashed, but it is an import: draw it solid",
    ]
    assert disagreements(right.replace('"d" [label="D"];', '"e" [label="E"];'), packages) == [
        "no box for d",
        "a box for e, which is no package",
    ]
