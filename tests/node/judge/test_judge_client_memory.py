"""A node judged for weeks holds no more of its judging than one judged for an hour."""

import trio

from sapo.node.judge import client as judge_client

JUDGE = "/ip4/127.0.0.1/tcp/4101/p2p/12D3KooWJPtxrHVDPoETNfPJY4WWVzX7Ti4WPemtXDgb5qmFrDiv"


async def test_scores_and_peers_seen_are_bounded_but_counted_in_full(monkeypatch):
    from libp2p.crypto.ed25519 import create_new_key_pair

    client = judge_client.JudgeClient(JUDGE, 1, create_new_key_pair(), None, trio.Lock(), 8)

    async def scored(node_round: int) -> float:  # the judge's answer, without a judge
        return 1.0 if node_round % 4 == 0 else 0.0

    monkeypatch.setattr(client, "_evaluate", scored)
    rounds = 3 * judge_client.SCORES_KEPT
    for node_round in range(1, rounds + 1):
        await client.evaluate(node_round)
    assert len(client.scores) == judge_client.SCORES_KEPT and client.scores[-1] == (rounds, 1.0)
    assert client.judged == rounds and client.score_sum == rounds // 4

    from sapo.node.core.metrics import RoundRecord

    many = [f"12D3KooWpeer{i}" for i in range(judge_client.PEERS_SEEN_KEPT + 500)]
    for start in range(0, len(many), 100):
        record = RoundRecord.model_construct(
            round=start + 1, peers=many[start : start + 100], accepted_from={}, external_groups=0
        )
        client.round_done(record)
    assert judge_client.PEERS_SEEN_KEPT <= len(client._peers_seen) < judge_client.PEERS_SEEN_KEPT + 100
