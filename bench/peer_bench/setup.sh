#!/usr/bin/env bash
# Make the peer frameworks' venvs that bench/round.py compares the project with:
#   bench/peers/genrl      Gensyn's genrl 0.1.11 (PyPI name `gensyn-genrl`; PyPI's `genrl` is an
#                          unrelated 2020 project), which pins transformers 4.51.3
#   bench/peers/genrl-0.3  Gensyn's genrl 0.3.0, its current release, which pins no transformers;
#                          it gets the project's transformers (GENRL3_TRANSFORMERS to change it)
#   bench/peers/trl        Hugging Face TRL, the current release, with transformers 5
# They are never project dependencies: each lives in its own venv (bench/peers/ is gitignored),
# and torch is pinned to the project's 2.13.0 in all of them (the CPU wheel on a CPU box;
# unpinned, pip pulls a multi-GB CUDA build).
#
#   bash bench/peer_bench/setup.sh              # all three
#   bash bench/peer_bench/setup.sh genrl-0.3    # one of them: genrl, genrl-0.3 or trl
#   PYTHON=python3.11 bash bench/peer_bench/setup.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
PEERS_DIR=${PEERS_DIR:-bench/peers}
TORCH="torch==2.13.0"
GENRL="gensyn-genrl==0.1.11"
GENRL_TRANSFORMERS="transformers==4.51.3"  # gensyn-genrl 0.1.11 pins it
GENRL3="gensyn-genrl==0.3.0"
GENRL3_TRANSFORMERS=${GENRL3_TRANSFORMERS:-transformers==5.24.0}  # 0.3.0 pins none: the project's
TRL=${TRL:-trl}                            # e.g. TRL=trl==1.16.0 to repeat a measurement

fresh_venv() {
    rm -rf "$PEERS_DIR/$1"
    "$PYTHON" -m venv "$PEERS_DIR/$1"
    "$PEERS_DIR/$1/bin/python" -m pip install --quiet --upgrade pip
}

# setup_genrl VENV GENRL_SPEC TRANSFORMERS_SPEC
setup_genrl() {
    local venv=$1 genrl=$2 transformers=$3
    local pip="$PEERS_DIR/$venv/bin/python -m pip"
    fresh_venv "$venv"
    # The full dependency set includes hivemind, web3 and eth-account (swarm networking and the
    # on-chain coordinator), which the trainer module does not import. If they cannot be installed
    # (hivemind has no wheel for some platforms and its source build downloads a Go binary),
    # install genrl without them and add only what GRPOLanguageTrainerModule and the game
    # classes import.
    if ! $pip install --quiet "$TORCH" "$genrl" "$transformers" peft; then
        echo "setup: the full install of $genrl failed (its error is above); installing it with" \
             "--no-deps plus only what its trainer imports" >&2
        $pip install --quiet --no-deps "$genrl"
        $pip install --quiet "$TORCH" "$transformers" peft datasets numpy psutil tensorboard wandb
    fi
    "$PEERS_DIR/$venv/bin/python" -c "
from genrl.trainer.grpo_trainer import GRPOLanguageTrainerModule
from genrl.game.game_manager import BaseGameManager
from importlib.metadata import version as v
print('$venv venv ready: gensyn-genrl', v('gensyn-genrl'), '/ transformers', v('transformers'), '/ torch', v('torch'))"
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
    genrl) setup_genrl genrl "$GENRL" "$GENRL_TRANSFORMERS" ;;
    genrl-0.3) setup_genrl genrl-0.3 "$GENRL3" "$GENRL3_TRANSFORMERS" ;;
    trl) setup_trl ;;
    all)
        setup_genrl genrl "$GENRL" "$GENRL_TRANSFORMERS"
        setup_genrl genrl-0.3 "$GENRL3" "$GENRL3_TRANSFORMERS"
        setup_trl
        ;;
    *) echo "usage: $0 [genrl|genrl-0.3|trl|all]" >&2; exit 2 ;;
esac
