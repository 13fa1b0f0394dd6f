#!/usr/bin/env bash
# Container entrypoint: `sapo-node "$@"`. Bootstrap peers and the judge come as /dns4
# multiaddrs (docker-compose.yml: SAPO_PEERS, SAPO_JUDGE) and the node resolves the compose
# service names itself, before every dial, so a peer that starts before its bootstrap or
# outlives its restart keeps finding it.
#
# Identities are made per deployment, never derived from a published seed: each node's key is
# created on first start in its own volume (DATA_DIR/identity.key, 0600), and a node that others
# must dial by id announces only its public peer id in the shared ids volume:
#   SAPO_ANNOUNCE_ID  a file to write this node's peer id to (creating its key first if need be),
#                     e.g. /ids/bootstrap
#   /p2p/@<name>      in SAPO_PEERS or SAPO_JUDGE: replaced by the peer id in $SAPO_IDS_DIR/<name>,
#                     waiting up to $SAPO_ID_WAIT_SECONDS (120) for that node to announce it
#   SAPO_IDS_DIR      where announced ids are read (default /ids)
#   SAPO_NODE_BIN     the CLI to run (default: sapo-node; the tests point it elsewhere)
#   SAPO_PYTHON       the Python with sapo installed (default: python3, the image's venv)
set -euo pipefail

python="${SAPO_PYTHON:-python3}"
ids_dir="${SAPO_IDS_DIR:-/ids}"

if [[ -n "${SAPO_ANNOUNCE_ID:-}" ]]; then
    peer_id=$("$python" -c 'import sys
from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
print(peer_id_of(load_or_create_identity(sys.argv[1])))' "${SAPO_DATA_DIR:-/data}")
    # Earlier compose files derived these two from seeds published in the repository, and an
    # upgraded deployment keeps its old volume: anyone could sign as such a node.
    case "$peer_id" in
        12D3KooWAiuDqrAu34MJemTVcjU4AtGeryEYP7BRcPRvQtkK87sm|12D3KooWJPtxrHVDPoETNfPJY4WWVzX7Ti4WPemtXDgb5qmFrDiv)
            echo "sapo-entrypoint: ${SAPO_DATA_DIR:-/data}/identity.key ($peer_id) comes from a seed published in" \
                 "this repository, so anyone can act as this node. Delete it to make a new one (docker compose" \
                 "down -v, or remove identity.key from the volume)" >&2
            exit 1 ;;
    esac
    # Write then rename: a reader never sees half an id.
    printf '%s\n' "$peer_id" > "$SAPO_ANNOUNCE_ID.tmp"
    mv "$SAPO_ANNOUNCE_ID.tmp" "$SAPO_ANNOUNCE_ID"
fi

announced_id() {  # the peer id node $1 announced, once it has
    local file="$ids_dir/$1" waited=0 id
    while [[ ! -s "$file" ]]; do
        if (( waited >= ${SAPO_ID_WAIT_SECONDS:-120} )); then
            echo "sapo-entrypoint: no peer id in $file after ${waited} s: is the '$1' service running, with" \
                 "the ids volume mounted and SAPO_ANNOUNCE_ID=$file?" >&2
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    id=$(tr -d '[:space:]' < "$file")
    if [[ ! "$id" =~ ^[1-9A-HJ-NP-Za-km-z]{32,128}$ ]]; then
        echo "sapo-entrypoint: $file holds no peer id ('${id:0:60}'); delete it and restart '$1'" >&2
        return 1
    fi
    printf '%s' "$id"
}

for variable in SAPO_PEERS SAPO_JUDGE; do
    value="${!variable:-}"
    while [[ "$value" =~ /p2p/@([A-Za-z0-9_.-]+) ]]; do
        name="${BASH_REMATCH[1]}"
        id=$(announced_id "$name")
        value="${value//\/p2p\/@$name//p2p/$id}"
    done
    if [[ -n "$value" ]]; then
        export "$variable=$value"
    fi
done

# exec: the node replaces this shell as the container's PID 1, so docker stop's SIGTERM reaches
# it directly and it finishes cleanly (run.py); a shell in between would swallow the signal.
exec "${SAPO_NODE_BIN:-sapo-node}" "$@"
