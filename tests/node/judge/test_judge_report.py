"""`judge report`: leaderboard order, swarm/isolated classes, and the PNG."""

from sapo.node.judge.report import is_swarm_peer, judge_report, plot_judged
from sapo.node.judge.server import DB_FILE_NAME, JudgeResult, ResultStore, load_results


def fill(path, peer, rounds, score, peers_seen):
    store = ResultStore(path)
    for r in rounds:
        store.add(
            JudgeResult(
                f"{peer}{r:08x}".ljust(16, "0")[:16], peer, "tiny", r, peers_seen, 0, "bf", "{}", "", score(r), r
            )
        )
    store.close()


def test_leaderboard_ranks_by_mean_and_names_each_peers_class(tmp_path):
    db = tmp_path / DB_FILE_NAME
    fill(db, "aaaa", range(1, 41), lambda r: min(1.0, r / 40), peers_seen=3)  # swarm, 40 rounds
    fill(db, "bbbb", range(1, 11), lambda r: 0.1, peers_seen=0)  # isolated, 10 rounds
    out = tmp_path / "plots" / "judge.png"
    text = judge_report(tmp_path, out, window=5)
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["1", "aaaa", "tiny", "swarm"]
    assert lines[2].split()[:4] == ["2", "bbbb", "tiny", "isolated"]
    assert out.read_bytes()[:4] == b"\x89PNG"
    rows = load_results(db)
    assert is_swarm_peer([r for r in rows if r["peer_id"] == "aaaa"])
    assert not is_swarm_peer([r for r in rows if r["peer_id"] == "bbbb"])


def test_an_empty_judge_still_writes_a_png(tmp_path):
    out = plot_judged([], tmp_path / "empty.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
