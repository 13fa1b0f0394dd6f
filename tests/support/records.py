"""Round records as a node writes them, with plausible numbers, for the status and metrics tests."""

from sapo.node.core.metrics import RoundRecord

PEER = "12D3KooWPeerAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


def record(n: int, **changes) -> RoundRecord:
    """Round `n` of a node that trades with PEER; `changes` overrides any field."""
    values = dict(
        round=n,
        time=1000.0 + n,
        reward_mean=n / 10,
        cumulative_reward=sum(i / 10 for i in range(1, n + 1)),
        format_rate=0.5,
        accuracy=n / 20,
        per_task={"basic_arithmetic": n / 10},
        local_groups=2,
        external_groups=2,
        external_reward_mean=0.25,
        inbox_size=7,
        received=10 * n,
        accepted=8 * n,
        rejected={"duplicate": 2 * n},
        transport={"peers_banned": 1},
        published=2 * n,
        accepted_from={PEER: 8 * n},
        peers=[PEER],
        generate_seconds=1.5,
        train_seconds=0.5,
        round_seconds=2.1,
        generated_tokens=100,
        tokens_per_second=66.0,
        loss=0.1,
        clip_fraction=0.0,
    )
    return RoundRecord(**(values | changes))
