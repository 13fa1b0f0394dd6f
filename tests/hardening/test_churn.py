"""Churn, short: bench/churn.py's swarm (gossip peers on 127.0.0.1) with 4 nodes, one leaving
(SIGTERM or SIGKILL, in turn) and one joining every 6 s for 24 s. Every group must reach every
node that was up from before it was published until 10 s after, and no node may stop on its own.
The 12-node, 3-minute run is `bench/churn.py` (docs/bench/network.md has its figures)."""

from bench import churn


def test_groups_reach_the_nodes_that_are_up_while_nodes_leave_and_join():
    args = churn.parse_args(["--nodes", "4", "--every", "6", "--minutes", "0.4"])
    result = churn.run(args)  # raises if a node stops on its own or a SIGTERMed one exits unclean
    churn.print_report(args, result)
    assert result["left"] == result["joined"] == 4 and result["killed"] == 2
    assert result["stayed"] == 4
    assert result["expected"] > 0
    assert result["delivered"] / result["expected"] >= 0.99, result["missed_by"]
