#!/usr/bin/env bash
# Container entrypoint: `sapo-node "$@"`, after turning a compose service name into a
# bootstrap multiaddr. py-libp2p dials /ip4 addresses, so the name is resolved here.
#
#   SAPO_BOOTSTRAP_HOST  service name (or address) of the bootstrap node, e.g. "bootstrap"
#   SAPO_BOOTSTRAP_ID    its peer id (fixed in docker-compose.yml through its identity seed)
#   SAPO_BOOTSTRAP_PORT  its port (default 4001)
#   SAPO_JUDGE_HOST      service name of the judge (optional); SAPO_JUDGE_ID its peer id,
#   SAPO_JUDGE_PORT      its port (default 4101): adds --judge <multiaddr>
#   SAPO_NODE_BIN        the CLI to run (default: sapo-node; the tests point it elsewhere)
set -euo pipefail

bin="${SAPO_NODE_BIN:-sapo-node}"
args=("$@")

# resolve NAME: print its first IPv4 address; a just-started compose network can take a
# moment to resolve names, so retry for up to 30 s.
resolve() {
  local ip=""
  for _ in $(seq 1 30); do
    ip="$(getent ahostsv4 "$1" | awk 'NR==1 {print $1}')" || true
    [[ -n "$ip" ]] && { echo "$ip"; return 0; }
    sleep 1
  done
  echo "sapo-entrypoint: cannot resolve host '$1'" >&2
  return 2
}

if [[ -n "${SAPO_BOOTSTRAP_HOST:-}" ]]; then
  if [[ -z "${SAPO_BOOTSTRAP_ID:-}" ]]; then
    echo "sapo-entrypoint: SAPO_BOOTSTRAP_HOST is set but SAPO_BOOTSTRAP_ID (the bootstrap peer id) is not" >&2
    exit 2
  fi
  ip="$(resolve "$SAPO_BOOTSTRAP_HOST")" || exit 2
  args+=(--peers "/ip4/${ip}/tcp/${SAPO_BOOTSTRAP_PORT:-4001}/p2p/${SAPO_BOOTSTRAP_ID}")
fi

if [[ -n "${SAPO_JUDGE_HOST:-}" ]]; then
  if [[ -z "${SAPO_JUDGE_ID:-}" ]]; then
    echo "sapo-entrypoint: SAPO_JUDGE_HOST is set but SAPO_JUDGE_ID (the judge's peer id) is not" >&2
    exit 2
  fi
  ip="$(resolve "$SAPO_JUDGE_HOST")" || exit 2
  args+=(--judge "/ip4/${ip}/tcp/${SAPO_JUDGE_PORT:-4101}/p2p/${SAPO_JUDGE_ID}")
fi

exec "$bin" "${args[@]}"
