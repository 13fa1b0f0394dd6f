"""One GRPO round in Gensyn's genrl (PyPI `gensyn-genrl` 0.1.11 or 0.3.0), through its own public API.

Run by bench/round.py with a genrl venv's python (bench/peer_bench/setup.sh makes them):

    bench/peers/genrl/bin/python bench/peer_bench/genrl_round.py JOB.json      # 0.1.11
    bench/peers/genrl-0.3/bin/python bench/peer_bench/genrl_round.py JOB.json  # 0.3.0

The round is genrl's `GameManager.run_game_round` for a one-stage game, spelled out so that
each step can be timed and an error is raised rather than logged and skipped (the manager
catches every exception of `train`):
  generate  `GRPOLanguageTrainerModule.generate` on the stage's inputs (its own loop: G
            `model.generate` calls of all questions, stopping at EOS or max_new_tokens)
  score     `DefaultRewardManager.update_rewards`, with the same verifier rule as the project
  update    `GRPOLanguageTrainerModule.train`: re-tokenize, one forward/backward over all
            Q x G sequences, one Adam step. 0.1.11: num_iterations=1. 0.3.0 replaced that
            option with ppo_epochs and minibatch_size (default 2 sequences, i.e. Q x G / 2
            Adam steps); here ppo_epochs=1 and minibatch_size=Q x G, its documented way to get
            one minibatch, so one step as in 0.1.11. 0.3.0's `step` also always runs a no-grad
            forward over all Q x G sequences first (the old log-probs; 0.1.11 took them from the
            gradient pass) and skips the update when every reward is 0 (never, with
            --force-signal); both are part of what it costs.

The two versions differ only there in what this adapter calls (game, state, data, reward and
communication classes are unchanged); the trainer config's fields tell which one is installed.
The framework name in the result is the peer name round.py gives in the job ("genrl",
"genrl-0.3").

Same work as the project: the same model directory, prompt text, G, max_new_tokens, lr, LoRA
(r=16, alpha=32, all linear layers), temperature 1, clip range 0.2/0.28, no KL, fp32, threads.
Two settings differ from genrl's defaults, and why:
  - enable_gradient_checkpointing=False: the project does not recompute activations; and with a
    PEFT model genrl's checkpointing (HF's reentrant default) leaves the LoRA weights without
    gradients, so the update would silently do nothing.
  - the tokenizer's chat template is a pass-through of the project's rendered prompt, so genrl
    sees exactly the text the project's model sees (checked below, token for token).
And top_k=0 rather than genrl's None: both mean "no top-k" to transformers 4.51.3, but
transformers 5 (0.3.0's venv) treats a None in a GenerationConfig as unset and fills it with its
global default, top_k=50, so genrl 0.3.0 would sample from the top 50 tokens only (shorter,
cheaper completions: a different job). 0 disables the top-k warper in both. And under
transformers 4 the model's RoPE theta is read from the key transformers 5 writes (`load_model`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
from importlib.metadata import version

from common import (  # this script's own folder, first on sys.path: it runs in a peer's venv
    Clock,
    emit,
    force_signal,
    log,
    one_update_step,
    peak_rss_mb,
    read_job,
    reset_peak_rss,
    score,
    summarize,
    trainable_snapshot,
)

PASS_THROUGH_TEMPLATE = "{{ messages[-1]['content'] }}"


def main(argv: list[str]) -> int:
    job = read_job(argv)
    name = job.get("peer", "genrl")
    import torch

    torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    import datasets
    from genrl.communication.local.null_comm import NullCommunicationBackend
    from genrl.data.text_data_managers import SimpleTextDataManager
    from genrl.game.game_manager import BaseGameManager
    from genrl.rewards import DefaultRewardManager, RewardFnStore, RoundRewardFnStore
    from genrl.state import GameState, WorldState
    from genrl.trainer.grpo_trainer import GRPOLanguageTrainerModule, GRPOTrainerConfig
    from peft import LoraConfig, get_peft_model
    from transformers import PreTrainedTokenizerFast

    datasets.disable_progress_bars()
    started = time.perf_counter()
    # PreTrainedTokenizerFast, not AutoTokenizer: genrl pins transformers 4.51.3, which does not
    # know the "TokenizersBackend" class that transformers 5 writes into tokenizer_config.json.
    tokenizer = PreTrainedTokenizerFast.from_pretrained(job["model_dir"], padding_side="left")
    tokenizer.chat_template = PASS_THROUGH_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = load_model(job["model_dir"])
    if job["lora"]:
        lora = job["lora"]
        model = get_peft_model(
            model,
            LoraConfig(
                r=lora["rank"],
                lora_alpha=lora["alpha"],
                lora_dropout=lora["dropout"],
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        )
    config = GRPOTrainerConfig(
        epsilon=job["eps_low"],
        epsilon_high=job["eps_high"],
        beta=0.0,
        temperature=job["temperature"],
        dtype="float32",
        enable_gradient_checkpointing=False,
        max_new_tokens=job["max_new_tokens"],
        num_generations=job["generations"],
        learning_rate=job["lr"],
        top_k=0,  # no top-k in both versions; see the module docstring for why not None
        **one_update_step(dataclasses.fields(GRPOTrainerConfig), job),
    )
    logs = tempfile.mkdtemp(prefix="genrl-bench-")
    trainer = GRPOLanguageTrainerModule([model], config, processing_class=tokenizer, log_dir=logs)
    check_prompt(tokenizer, job)

    real_rewards: list[list[float]] = []

    def reward_fn(state: GameState) -> dict:
        # genrl's reward functions read the stage's actions (G completions per node) and answers.
        actions, states = state.get_stage_actions(0), state.get_stage_state(0)
        rewards: dict = {}
        for agent in actions:
            rewards[agent] = {}
            for batch_id in actions[agent]:
                rewards[agent][batch_id] = []
                for node_idx, completions in enumerate(actions[agent][batch_id]):
                    oracle = states[agent][batch_id][node_idx].environment_states["answer"]
                    real = [score(c, oracle) for c in completions]
                    real_rewards.append(real)
                    rewards[agent][batch_id].append(force_signal(real) if job["force_signal"] else real)
        return rewards

    rewards = DefaultRewardManager(
        RewardFnStore(max_rounds=len(job["batches"]) + 1, reward_fn_stores=[RoundRewardFnStore(1, [reward_fn])])
    )
    data = SimpleTextDataManager(train_dataset=None, data_generator=lambda **_: None, system_prompt="")
    game = BaseGameManager(
        max_stage=1,
        max_round=len(job["batches"]),
        game_state=GameState(round=0, stage=0),
        reward_manager=rewards,
        trainer=trainer,
        data_manager=data,
        communication=NullCommunicationBackend(),
    )
    pruners, brancher = game.aggregate_game_state_methods()
    game.state.world_state_pruners, game.state.tree_branching_functions = pruners, brancher
    load_s = time.perf_counter() - started
    optimizer_steps = [0]  # counted, not assumed: the versions' configs say "one step" differently

    def count_step(*_) -> None:
        optimizer_steps[0] += 1

    trainer.optimizer.register_step_post_hook(count_step)
    trainable_before = trainable_snapshot(model)
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    peak_is_round_only = reset_peak_rss()

    rounds = []
    for index, batch in enumerate(job["batches"]):
        round_data = [
            (i, WorldState(environment_states={"question": p, "answer": a}, opponent_states=None, personal_states=None))
            for i, (p, a) in enumerate(zip(batch["prompts"], batch["answers"]))
        ]
        game.state.advance_round(round_data, agent_keys=game.agent_ids)
        game.rewards.reset()
        torch.manual_seed(job["seed"] * 1_000_003 + index)
        real_rewards.clear()
        optimizer_steps[0] = 0
        clock = Clock()
        # GameManager.run_game_stage, with the completion ids asked for so tokens can be counted
        inputs, index_mapping = data.prepare_input(game.state.get_latest_state(), game.state.stage)
        outputs, output_ids = trainer.generate(inputs, return_completion_ids=True)
        game.state.append_actions(data.prepare_actions(outputs, index_mapping))
        swarm = game.communication.all_gather_object(game.state.get_latest_communication()[game.rank])
        game.state.advance_stage(data.prepare_states(game.state, swarm))
        clock.lap("generate")
        game.rewards.update_rewards(game.state)
        clock.lap("score")
        trainer.train(game.state, data, game.rewards)
        clock.lap("update")
        tokens = sum(int(t) not in special for per_prompt in output_ids for ids in per_prompt for t in ids.tolist())
        flat = [r for group in real_rewards for r in group]
        rounds.append(
            {
                **clock.times(),
                "tokens": tokens,
                "real_reward_mean": sum(flat) / max(1, len(flat)),
                "real_signal_groups": sum(len(set(g)) > 1 for g in real_rewards),
                "sequences": sum(len(g) for g in outputs),
                "optimizer_steps": optimizer_steps[0],
            }
        )
        log(name, f"round {index}: {clock.summary()}, {tokens} tokens")
    emit(
        {
            "framework": name,
            "version": f"gensyn-genrl {version('gensyn-genrl')}, transformers {version('transformers')}, "
            f"torch {torch.__version__}",
            "model": job["model"],
            "parameters": sum(p.numel() for p in model.parameters()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "load_s": load_s,
            "round_peak_rss_mb": peak_rss_mb(),
            "peak_is_round_only": peak_is_round_only,
            "optimizer_steps": max(r["optimizer_steps"] for r in rounds),
            "decode_batch": len(job["batches"][0]["prompts"]),  # generate runs G times over the Q questions
            "weights_changed": trainable_snapshot(model) != trainable_before,
            "threads": torch.get_num_threads(),
            **summarize(rounds),
        }
    )
    return 0


def load_model(model_dir: str):
    """The model in fp32, as the project's transformers 5 reads it, under either transformers.

    The model directories are written by transformers 5, which keeps RoPE's settings in
    `rope_parameters`; transformers 4.51.3 (genrl 0.1.11's pin) does not read that key and
    silently falls back to rope_theta=10000, while SmolLM2's is 100000: a different model,
    whose completions run longer. So under 4.x the theta is copied where 4.x reads it.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers import __version__ as transformers_version

    if int(transformers_version.split(".")[0]) >= 5:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = AutoConfig.from_pretrained(model_dir)
    rope = getattr(config, "rope_parameters", None)  # 4.x keeps an unknown key as an attribute
    if rope:
        if rope.get("rope_type", "default") != "default" or set(rope) - {"rope_type", "rope_theta"}:
            raise SystemExit(f"rope_parameters {rope} has no plain transformers 4 equivalent here")
        config.rope_theta = rope["rope_theta"]
    return AutoModelForCausalLM.from_pretrained(model_dir, config=config, torch_dtype=torch.float32)


def check_prompt(tokenizer, job: dict) -> None:
    """genrl must see the project's prompt token for token, or the comparison is not the same work."""
    prompt = job["batches"][0]["prompts"][0]
    templated = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text=[templated], truncation=True)["input_ids"][0]
    if templated != prompt or ids != job["prompt_token_ids"]:
        raise SystemExit(
            f"genrl's prompt differs from the project's: {templated!r} -> {ids[:20]}... "
            f"vs {prompt!r} -> {job['prompt_token_ids'][:20]}..."
        )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv))
