"""ATTACK (h-atk5's finding 3, reasoned there, run here): young links from many /16s hold every
inbound slot that handshakes and counted links leave, and no newcomer gets in.

The connection manager counts a link against its watermarks only once it has lasted its grace,
and closes young links from one /16 only past YOUNG_PER_GROUP while the node is over `high`. A
stranger with addresses in about 20 /16s that remakes 8 links from each before they are counted
stays under both, and holds about 160 of the library's 250 inbound slots; with HANDSHAKING and
`high`, that was all of them. Now a connection that arrives while fewer than one slot in 16 is
free (ROOM_SHARE) closes one that has not proved itself, from the place that holds the most
(protocol/toolkit/inbound.py, `make_room`).

Real py-libp2p in a network namespace of the test's own (`unshare -n`, 11.0.0.0/8 on its
loopback, so that the stranger's links come from public /16s): tests/hardening/many_groups.py,
scaled down. With no room kept newcomers got in 1 of 8, and the stranger held 48 of 48
slots; with it, 8 of 8.

The same run found a second way in: the stranger's links that outlived their grace pushed the
node over `high`, one in each of its 10 groups; the honest links, in groups of their own, held as
many per group, and the trim took among equals at random, so all 4 honest links went (0-1 of 4
kept). The longest-lasting links, up to half of `low`, are now never trimmed (Bitcoin Core
protects the longest-connected), and the honest links, up before the attack, stay.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

NAMESPACE = "ip link set lo up && ip addr add 11.0.0.1/8 dev lo && exec {python} -m tests.hardening.many_groups"


def _missing() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare (util-linux) or ip (iproute2) not found"
    if os.geteuid() != 0:
        return "a network namespace of its own needs root"
    return None


@pytest.mark.skipif(_missing() is not None, reason=f"namespace: {_missing()}")
def test_young_links_from_many_groups_do_not_keep_newcomers_out():
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", NAMESPACE.format(python=sys.executable)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(result)
    assert result["attacker_links_made"] > result["slots"]  # the stranger did try to hold them all
    assert result["honest_before"] == result["honest"]
    assert result["honest_kept"] == result["honest"]  # links that lasted are not what makes room
    assert result["newcomers_in"] >= result["newcomers"] - 1, result
    assert result["slots_held_most"] <= result["slots"]
