import json
import random

from sapo.node.core.metrics import moving_average
from tests.support.processes import sapo_node


def test_moving_average():
    assert moving_average([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    assert moving_average([], 5) == []


def test_plot_writes_a_png_from_three_nodes(tmp_path):
    rng = random.Random(0)
    dirs = []
    for node in range(3):
        d = tmp_path / f"node-{node}"
        d.mkdir()
        rows = [{"round": r, "reward_mean": min(1.0, r / 200 + rng.random() * 0.1)} for r in range(1, 151)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        dirs.append(str(d))
    out = tmp_path / "curves.png"
    result = sapo_node("plot", *dirs, "--out", str(out), "--window", "20")
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_names_a_missing_metrics_file(tmp_path):
    result = sapo_node("plot", str(tmp_path / "nope"))
    assert result.returncode == 1 and "metrics.jsonl does not exist" in result.stderr
