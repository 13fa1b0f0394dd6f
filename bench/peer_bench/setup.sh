#!/usr/bin/env bash
# Make the peer frameworks' venvs that bench/round.py compares the project with:
#   bench/peers/genrl  Gensyn's genrl 0.1.11 (PyPI name `gensyn-genrl`; PyPI's `genrl` is an
#                      unrelated 2020 project), which pins transformers 4.51.3
#   bench/peers/trl    Hugging Face TRL, the current release, with transformers 5
# They are never project dependencies: each lives in its own venv (bench/peers/ is gitignored),
# and torch is pinned to the project's 2.13.0 in both (the CPU wheel on a CPU box; unpinned,
# pip pulls a multi-GB CUDA build).
#
#   bash bench/peer_bench/setup.sh            # both
#   bash bench/peer_bench/setup.sh trl        # one of them
#   PYTHON=python3.11 bash bench/peer_bench/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
PEERS_DIR=${PEERS_DIR:-bench/peers}
TORCH="torch==2.13.0"
GENRL="gensyn-genrl==0.1.11"
GENRL_TRANSFORMERS="transformers==4.51.3"  # gensyn-genrl 0.1.11 pins it
TRL=${TRL:-trl}                            # e.g. TRL=trl==1.16.0 to repeat a measurement

fresh_venv() {
    rm -rf "$PEERS_DIR/$1"
    "$PYTHON" -m venv "$PEERS_DIR/$1"
    "$PEERS_DIR/$1/bin/python" -m pip install --quiet --upgrade pip
}

setup_genrl() {
    local pip="$PEERS_DIR/genrl/bin/python -m pip"
    fresh_venv genrl
    # The full dependency set includes hivemind, web3 and eth-account (swarm networking and the
    # on-chain coordinator), which the trainer module does not import. If they cannot be installed
    # (hivemind has no wheel for some platforms and its source build downloads a Go binary),
    # install genrl without them and add only what GRPOLanguageTrainerModule and the game
    # classes import.
    if ! $pip install --quiet "$TORCH" "$GENRL" "$GENRL_TRANSFORMERS" peft; then
        echo "setup: the full install of $GENRL failed (its error is above); installing it with" \
             "--no-deps plus only what its trainer imports" >&2
        $pip install --quiet --no-deps "$GENRL"
        $pip install --quiet "$TORCH" "$GENRL_TRANSFORMERS" peft datasets numpy psutil tensorboard wandb
    fi
    "$PEERS_DIR/genrl/bin/python" -c "
from genrl.trainer.grpo_trainer import GRPOLanguageTrainerModule
from genrl.game.game_manager import BaseGameManager
from importlib.metadata import version as v
print('genrl venv ready: gensyn-genrl', v('gensyn-genrl'), '/ transformers', v('transformers'), '/ torch', v('torch'))"
}

setup_trl() {
    fresh_venv trl
    "$PEERS_DIR/trl/bin/python" -m pip install --quiet "$TORCH" "$TRL" peft
    "$PEERS_DIR/trl/bin/python" -c "
from trl import GRPOConfig, GRPOTrainer
from importlib.metadata import version as v
print('trl venv ready: trl', v('trl'), '/ transformers', v('transformers'), '/ torch', v('torch'))"
}

mkdir -p "$PEERS_DIR"
case "${1:-all}" in
    genrl) setup_genrl ;;
    trl) setup_trl ;;
    all) setup_genrl; setup_trl ;;
    *) echo "usage: $0 [genrl|trl|all]" >&2; exit 2 ;;
esac
