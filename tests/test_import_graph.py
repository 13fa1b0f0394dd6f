"""The import graph of sapo.training, sapo.sampling, sapo.protocol and sapo.node has no cycle,
and its layers point one way (STYLE.md, "Layout shows the architecture"). The graph is
tests/support/import_graph.py's: every import counts, those inside functions and under
`if TYPE_CHECKING:` included. `python -m tests.test_import_graph` rewrites docs/import-graph.md."""

from __future__ import annotations

from tests.support.import_graph import ROOT, cycles, import_graph, render, within

# (importer, what it may not import): an importer or a forbidden name covers its submodules
LAYERS = [
    ("sapo.training", "sapo.sampling"),
    ("sapo.training", "sapo.protocol"),
    ("sapo.training", "sapo.node"),
    ("sapo.sampling", "sapo.node"),
    ("sapo.sampling", "sapo.protocol"),
    ("sapo.protocol", "sapo.node"),
    ("sapo.protocol", "sapo.sampling"),
    ("sapo.node.core", "sapo.node.daemon"),
    ("sapo.node.core", "sapo.node.study"),
    ("sapo.node.core", "sapo.node.judge"),
    ("sapo.node.core", "sapo.node.swarm"),
    ("sapo.node.core", "sapo.node.flags"),
    ("sapo.node.flags", "sapo.node.daemon"),
    ("sapo.node.flags", "sapo.node.study"),
    ("sapo.node.study", "sapo.node.daemon"),
    ("sapo.node.daemon", "sapo.node.study"),
    ("sapo.node.judge", "sapo.node.daemon"),
    ("sapo.node.judge", "sapo.node.study"),
    ("sapo.node.swarm", "sapo.node.daemon"),
    ("sapo.node.swarm", "sapo.node.study"),
]


def test_the_graph_is_read():
    graph = import_graph()
    assert "sapo.protocol.exchange.gossip" in graph and "sapo.node.daemon.run" in graph
    assert "sapo.protocol.settings" in graph["sapo.node.core.settings"]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (each line one set of modules that import each other):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_layers_point_one_way():
    graph = import_graph()
    wrong = sorted(
        f"{importer} imports {target}"
        for importer, targets in graph.items()
        for target in targets
        for upper, lower in LAYERS
        if within(importer, upper) and within(target, lower)
    )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_published_graph_is_current():
    page = ROOT / "docs" / "import-graph.md"
    assert page.read_text(encoding="utf-8") == render(import_graph()), "docs/import-graph.md is stale: run `make docs`"


if __name__ == "__main__":
    (ROOT / "docs" / "import-graph.md").write_text(render(import_graph()), encoding="utf-8")
