"""One GRPO round in Hugging Face TRL's `GRPOTrainer`, through its own public API.

Run by bench/round.py with the TRL venv's python (bench/peer_bench/setup.sh makes it):

    bench/peers/trl/bin/python bench/peer_bench/trl_round.py JOB.json

One `trainer.train()` of max_steps = rounds, where one optimizer step is one round: the
dataset holds each round's Q prompts in order (shuffle_dataset=False), num_generations = G,
and per_device_train_batch_size x gradient_accumulation_steps = Q x G (micro-batches of
`peer_micro_batch` sequences, TRL's way of bounding memory; steps_per_generation defaults to
the accumulation steps), so every step generates G completions for each of the Q questions in
one generate call, scores them, and takes one optimizer step on all Q x G sequences
(num_iterations=1). The adapter checks that each step saw exactly its round's questions.

TRL does not return a breakdown, so it is read from TRL's own profiling contexts (which it
sends only to wandb/mlflow/trackio; here their durations are also kept):
  generate  "GRPOTrainer.transformers.generate" (one HF generate call on all Q x G sequences)
  score     "GRPOTrainer._calculate_rewards" (the reward function, same verifier rule)
  update    the rest of the step: step time (callback on_step_begin -> on_step_end) minus the two
            above; it holds tokenization, the loss forward/backward and the optimizer step,
            as the project's "encode+update" does.
Each is measured in wall and in CPU seconds (process_time, taken around the same contexts).

Same work as the project: the same model directory, prompt text (a plain-text prompt, so TRL
applies no chat template; checked token for token), G, max_new_tokens, lr (constant), LoRA
(r=16, alpha=32, all linear layers), temperature 1, top_k off, clip 0.2/0.28, no KL, threads.
Two TRL defaults are changed, and why: bf16=False (TRL defaults to bf16, which this CPU has
no units for; every framework here runs fp32), and gradient_checkpointing=False (TRL defaults
to on; the project does not recompute activations).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import defaultdict
from importlib.metadata import version

from common import (  # this script's own folder, first on sys.path: it runs in a peer's venv
    emit,
    force_signal,
    log,
    peak_rss_mb,
    read_job,
    reset_peak_rss,
    score,
    summarize,
    trainable_snapshot,
)


def main(argv: list[str]) -> int:
    job = read_job(argv)
    import torch

    torch.set_num_threads(job["threads"])
    import datasets
    import trl.extras.profiling as profiling
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    datasets.disable_progress_bars()
    # TRL's profiling names -> wall and CPU seconds this step
    profiled: dict[str, float] = defaultdict(float)
    profiled_cpu: dict[str, float] = defaultdict(float)
    enter, report_metrics = profiling.ProfilingContext.__enter__, profiling.ProfilingContext._log_metrics

    def enter_with_cpu(self):
        self.cpu_started = time.process_time()
        return enter(self)

    def keep_metrics(self, duration: float) -> None:
        profiled[self.name] += duration
        profiled_cpu[self.name] += time.process_time() - self.cpu_started
        report_metrics(self, duration)

    profiling.ProfilingContext.__enter__ = enter_with_cpu
    profiling.ProfilingContext._log_metrics = keep_metrics

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"], padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32)
    check_prompt(tokenizer, job)
    questions = len(job["batches"][0]["prompts"])
    rows = [{"prompt": p, "answer": a} for b in job["batches"] for p, a in zip(b["prompts"], b["answers"])]
    G = job["generations"]
    micro = min(job["peer_micro_batch"], questions * G)
    if (questions * G) % micro:
        raise SystemExit(f"peer_micro_batch {micro} must divide Q x G = {questions * G}")
    lora = job["lora"]
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=questions * G // micro,
        num_generations=G,
        max_completion_length=job["max_new_tokens"],
        max_steps=len(job["batches"]),
        learning_rate=job["lr"],
        lr_scheduler_type="constant",
        beta=0.0,
        epsilon=job["eps_low"],
        epsilon_high=job["eps_high"],
        temperature=job["temperature"],
        top_k=0,
        num_iterations=1,
        shuffle_dataset=False,
        seed=job["seed"],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    real_rewards: list[list[float]] = []
    step_prompts: list[set[str]] = []
    tokens = [0]
    stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}

    def exact_answer(prompts, completions, completion_ids, answer, **_):
        step_prompts.append(set(prompts))
        by_prompt: dict[str, list[int]] = defaultdict(list)
        for i, p in enumerate(prompts):
            by_prompt[p].append(i)
        rewards = [0.0] * len(completions)
        for indices in by_prompt.values():
            real = [score(completions[i], answer[i]) for i in indices]
            real_rewards.append(real)
            for i, r in zip(indices, force_signal(real) if job["force_signal"] else real):
                rewards[i] = r
        tokens[0] += sum(t not in stop_ids for ids in completion_ids for t in ids)
        return rewards

    rounds: list[dict] = []
    trainable_before: list[float] = []

    class RoundClock(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            trainable_before.append(trainable_snapshot(model))

        def on_step_begin(self, args, state, control, **kwargs):
            profiled.clear()
            profiled_cpu.clear()
            real_rewards.clear()
            tokens[0] = 0
            torch.manual_seed(job["seed"] * 1_000_003 + state.global_step)
            self.started, self.cpu_started = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            total, total_cpu = time.perf_counter() - self.started, time.process_time() - self.cpu_started

            def seconds(table: dict[str, float], suffix: str) -> float:
                # profiling_context names are "<trainer class>.<name>"
                return sum(s for name, s in table.items() if name.endswith(suffix))

            generate, generate_cpu = (
                seconds(profiled, ".transformers.generate"),
                seconds(profiled_cpu, ".transformers.generate"),
            )
            scoring, scoring_cpu = (
                seconds(profiled, "._calculate_rewards"),
                seconds(profiled_cpu, "._calculate_rewards"),
            )
            if not generate:
                raise RuntimeError(f"TRL reported no generate time; its profiling names were {sorted(profiled)}")
            flat = [r for g in real_rewards for r in g]
            rounds.append(
                {
                    "generate_s": generate,
                    "score_s": scoring,
                    "update_s": total - generate - scoring,
                    "total_s": total,
                    "generate_cpu_s": generate_cpu,
                    "score_cpu_s": scoring_cpu,
                    "update_cpu_s": total_cpu - generate_cpu - scoring_cpu,
                    "total_cpu_s": total_cpu,
                    "tokens": tokens[0],
                    "real_reward_mean": sum(flat) / max(1, len(flat)),
                    "real_signal_groups": sum(len(set(g)) > 1 for g in real_rewards),
                    "sequences": len(flat),
                    "threads": torch.get_num_threads(),
                }
            )
            r = rounds[-1]
            steps = ", ".join(
                f"{s} {r[f'{s}_s']:.2f}s (CPU {r[f'{s}_cpu_s']:.2f}s)" for s in ("generate", "score", "update")
            )
            log("trl", f"round {len(rounds) - 1}: {steps}, {r['tokens']} tokens, {r['sequences']} sequences")

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_answer,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=lora["rank"],
            lora_alpha=lora["alpha"],
            lora_dropout=lora["dropout"],
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        if lora
        else None,
        callbacks=[RoundClock()],
    )
    load_s = time.perf_counter() - started
    peak_is_round_only = reset_peak_rss()
    trainer.train()
    wrong = [r["sequences"] for r in rounds if r["sequences"] != questions * G]
    if len(rounds) != len(job["batches"]) or wrong:
        raise SystemExit(
            f"TRL ran {len(rounds)} steps with {[r['sequences'] for r in rounds]} sequences; "
            f"expected {len(job['batches'])} steps of {questions * G}"
        )
    if step_prompts != [set(b["prompts"]) for b in job["batches"]]:
        raise SystemExit("TRL's steps did not see the rounds' questions in order")
    emit(
        {
            "framework": "trl",
            "version": f"trl {version('trl')}, transformers {version('transformers')}, torch {torch.__version__}",
            "model": job["model"],
            "parameters": sum(p.numel() for p in trainer.model.parameters()),
            "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            "load_s": load_s,
            "round_peak_rss_mb": peak_rss_mb(),
            "peak_is_round_only": peak_is_round_only,
            "optimizer_steps": 1,
            "micro_batch": micro,
            "decode_batch": questions * G,  # one generate call for the whole generation batch
            "weights_changed": trainable_snapshot(trainer.model) != trainable_before[0],
            "threads": min(r["threads"] for r in rounds),
            **summarize(rounds),
        }
    )
    return 0


def check_prompt(tokenizer, job: dict) -> None:
    """TRL must see the project's prompt token for token, or the comparison is not the same work."""
    prompt = job["batches"][0]["prompts"][0]
    ids = tokenizer(text=[prompt])["input_ids"][0]
    if ids != job["prompt_token_ids"]:
        raise SystemExit(
            f"TRL's prompt tokens differ from the project's: {ids[:20]}... vs {job['prompt_token_ids'][:20]}..."
        )


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv))
