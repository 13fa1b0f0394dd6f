#!/usr/bin/env bash
# Container entrypoint: `sapo-node "$@"`. Bootstrap peers and the judge come as /dns4
# multiaddrs (docker-compose.yml: SAPO_PEERS, SAPO_JUDGE) and the node resolves the compose
# service names itself, before every dial, so a peer that starts before its bootstrap or
# outlives its restart keeps finding it.
#
#   SAPO_NODE_BIN   the CLI to run (default: sapo-node; the tests point it elsewhere)
set -euo pipefail

# exec: the node replaces this shell as the container's PID 1, so docker stop's SIGTERM reaches
# it directly and it finishes cleanly (run.py); a shell in between would swallow the signal.
exec "${SAPO_NODE_BIN:-sapo-node}" "$@"
