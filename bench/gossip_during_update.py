"""Gossip latency while a node is in its GRPO update (or its generation), against the same node idle.

The node keeps its torch work off the trio thread (`trio.to_thread.run_sync`, as node/core/round.py
does) so that the network stays responsive. This measures whether it does:

- receiver A, this process: a real network (protocol/network.py) on 127.0.0.1 in trio. It loads the policy with
  the project's loader, generates one round with `generate_groups` (in a worker thread, as a
  measured "generate" phase), gives flat-reward groups alternating 0/1 rewards (`--force-signal`,
  as bench/round.py does, so no update is skipped), then alternates `--cycles` times between an
  idle phase (`--idle-seconds`, no torch work) and a busy phase in which it runs the real
  `grpo_update` on that round back to back in a worker thread for `--busy-seconds` (at least
  one update). Every frame it receives is decoded with the real codec, as the node's intake does.
- sender B, its own OS process (so A's GIL does not slow it): a real network (protocol/network.py) that
  publishes real RolloutGroup frames (bench/gossip.py's groups, `to_wire` + `encode`) at a fixed
  `--rate`, each stamped with `created_at = time.time()` just before it is encoded and published,
  and numbered by `sender_round`.

Latency = A's `received_at` (time.time() when the message reached the service) - `created_at`,
on the same machine clock. A message counts for "update" if its flight [sent, received]
overlaps a busy phase, for "idle" only if its whole flight lies inside an idle phase; a
message B sent but A never got is charged to the phase it was sent in. A's trio loop lag (how
late a 10 ms sleep wakes up) is printed beside it: it is what a slow delivery waits for.

    .venv/bin/python -m bench.gossip_during_update                              # tiny, 3 cycles
    .venv/bin/python -m bench.gossip_during_update --model smollm2-135m --lora  # the real figure
    .venv/bin/python -m bench.gossip_during_update --smoke                      # tiny, one 5 s cycle
    .venv/bin/python -m bench.gossip_during_update --busy generate --switch-interval 0.001   # generation

With `--busy generate` the busy phases run `generate_groups` on the round's questions back to back
instead (the per-token decoding loop and the verifier, which hold the GIL between torch ops);
`--switch-interval` tries the GIL remedy a daemon can set.

This file is the command line, sender B and receiver A; the run's record and its report are
bench/update_latency_report.py's.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from bench.gossip_groups import build_groups
from bench.update_latency_report import LAG_PROBE_SECONDS, Record, print_report

BENCH = Path(__file__).resolve().parent
DEFAULT_MODELS_DIR = BENCH / ".cache" / "models"
SWARM = "bench"
TASK = "basic_arithmetic"
SENDER_START_SECONDS = 120.0  # the sender imports libp2p and reasoning-gym: seconds on busy cores
SENT_MARKER = "SENT "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="policy: tiny (default), smollm2-135m, ...")
    parser.add_argument(
        "--lora",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="train a LoRA adapter (r=16) rather than the full model",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: what a node sharing a CPU uses)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help="the update's precision")
    parser.add_argument("--questions", type=int, default=2, help="questions in the round that is trained on")
    parser.add_argument("--generations", type=int, default=4, help="G: completions per question")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="generation cap per completion")
    parser.add_argument(
        "--force-signal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give all-equal-reward groups alternating 0/1 rewards so the update is never skipped",
    )
    parser.add_argument("--rate", type=float, default=5.0, help="frames per second the sender publishes")
    parser.add_argument("--cycles", type=int, default=3, help="idle + busy phase pairs")
    parser.add_argument("--idle-seconds", type=float, default=10.0, help="length of each idle phase")
    parser.add_argument(
        "--busy-seconds",
        type=float,
        default=10.0,
        help="each busy phase runs updates back to back until this long (at least one)",
    )
    parser.add_argument("--settle-seconds", type=float, default=2.0, help="wait after connecting, for the mesh")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval for A, in seconds (Python's default: 0.005); to test the GIL",
    )
    parser.add_argument(
        "--busy",
        choices=("update", "generate"),
        default="update",
        help="what the busy phases run back to back: GRPO updates, or generations of the round",
    )
    parser.add_argument("--seed", type=int, default=0, help="model, task and sampling seed")
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR, help="converted-model cache")
    parser.add_argument("--smoke", action="store_true", help="tiny, one short cycle at 10/s: a quick check it runs")
    # internal: the sender process
    parser.add_argument("--sender", default=None, help=argparse.SUPPRESS)  # A's address
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.lora, args.questions, args.generations, args.max_new_tokens = "tiny", False, 2, 4, 16
        args.cycles, args.idle_seconds, args.busy_seconds, args.settle_seconds, args.rate = 1, 2.5, 2.5, 1.0, 10.0
    for name in ("questions", "generations", "max_new_tokens", "threads", "cycles"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 < args.rate <= 40:
        parser.error(f"--rate must be in (0, 40] (NetworkSettings.peer_message_rate is 50/s), got {args.rate}")
    if args.idle_seconds <= 0 or args.busy_seconds <= 0:
        parser.error("--idle-seconds and --busy-seconds must be > 0")
    return args


def gossip_settings(peers: list[str]):
    from sapo.protocol.settings import NetworkSettings

    return NetworkSettings(listen="/ip4/127.0.0.1/tcp/0", peers=peers, swarm=SWARM, discover_peers=0, exchange="gossip")


# --- sender B: its own process -------------------------------------------------------------------


async def sender_main(args: argparse.Namespace) -> None:
    """Dial A, wait for the mesh, print `ready`; on the line `go` publish at --rate until the
    next line (or EOF) arrives on stdin, then print the send times (`SENT {seq: unix time}`)."""
    from sapo.protocol.network import serve_network
    from sapo.protocol.peers.identity import load_or_create_identity, peer_id_of
    from sapo.protocol.wire.codec import encode
    from sapo.protocol.wire.messages import to_wire
    from sapo.training.problems.tasks import reasoning_gym_version

    groups = build_groups(1, args.seed)
    rg_version = reasoning_gym_version()
    sent: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="sapo-bench-sender-") as tmp:
        key_pair = load_or_create_identity(Path(tmp) / "sender")
        peer_id = peer_id_of(key_pair)
        drop, never_read = trio.open_memory_channel(0)  # A publishes nothing; a full channel just counts
        settings = gossip_settings([args.sender])

        async def publish_forever() -> None:
            started = time.monotonic()
            seq = 0
            while True:
                await trio.sleep(max(0.0, started + seq / args.rate - time.monotonic()))
                stamp = time.time()
                wire = to_wire(
                    groups[seq % len(groups)],
                    sender=peer_id,
                    swarm=SWARM,
                    sender_round=seq,
                    model_id="bench",
                    created_at=stamp,
                    reasoning_gym_version=rg_version,
                )
                if await service.publish(encode(wire)):
                    sent[seq] = stamp
                seq += 1

        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                service = await nursery.start(partial(serve_network, settings, key_pair, drop))
                while not service.connected_peers():
                    await trio.sleep(0.05)
            await trio.sleep(args.settle_seconds)
            print("ready", flush=True)
            if (await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)).strip() == "go":
                nursery.start_soon(publish_forever)
                # The receiver says stop (or dies: EOF).
                await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()
    print(SENT_MARKER + json.dumps(sent), flush=True)


# --- receiver A: this process --------------------------------------------------------------------


@dataclass
class Trainer:
    """The policy, its optimizer and one generated round, all built in a worker thread."""

    policy: object
    optimizer: object
    settings: object
    groups: list
    rng: random.Random
    real_signal: int = 0
    reward_mean: float = 0.0

    @classmethod
    def load(cls, args: argparse.Namespace) -> Trainer:
        import torch

        from sapo.training.config import TrainingSettings, default_learning_rate
        from sapo.training.learning.update import make_optimizer
        from sapo.training.models.policy import LoraOptions, load_policy

        torch.set_num_threads(args.threads)
        args.models_dir.mkdir(parents=True, exist_ok=True)
        policy = load_policy(
            args.model,
            device="cpu",
            lora=LoraOptions() if args.lora else None,
            seed=args.seed,
            models_dir=args.models_dir,
            precision=args.precision,
        )
        settings = TrainingSettings(
            generations=args.generations,
            max_new_tokens=args.max_new_tokens,
            lr=default_learning_rate(args.model, args.lora),
        )
        return cls(policy, make_optimizer(policy, settings), settings, [], random.Random(args.seed))

    def generate(self, args: argparse.Namespace) -> None:
        from sapo.training.completions.generation import generate_groups
        from sapo.training.problems.tasks import TaskSampler, default_task_specs

        tasks = TaskSampler(default_task_specs([TASK]), dataset_seed=args.seed, rng_seed=args.seed)
        result = generate_groups(
            self.policy,
            tasks.sample(args.questions),
            num_generations=args.generations,
            max_new_tokens=args.max_new_tokens,
            temperature=self.settings.temperature,
            seed=args.seed,
        )
        rewards = [r for g in result.groups for r in g.rewards]
        self.reward_mean = sum(rewards) / len(rewards)
        self.real_signal = sum(1 for g in result.groups if len(set(g.rewards)) > 1)
        self.groups = result.groups
        if args.force_signal:
            self.groups = [
                g
                if len(set(g.rewards)) > 1
                else g.model_copy(update={"rewards": [float(i % 2) for i in range(len(g.rewards))]})
                for g in result.groups
            ]
        return result

    def update(self):
        from sapo.sampling.external_use import ExternalUse
        from sapo.sampling.training_set import training_set
        from sapo.training.learning.update import grpo_update

        rows = training_set(self.groups, [], ExternalUse(), self.policy.tokenizer_fingerprint).rows
        return grpo_update(self.policy, self.optimizer, rows, self.settings, self.rng)


async def receive(incoming, record: Record) -> None:
    from sapo.protocol.wire.codec import DecodeLimits, Rejected, decode

    limits = DecodeLimits()
    async for message in incoming:
        try:
            group = decode(message.data, limits)  # what the node's intake spends before its checks
        except Rejected:
            record.rejected += 1
            continue
        record.received[group.sender_round] = (group.created_at, message.received_at)


async def probe_loop_lag(record: Record) -> None:
    while True:
        before = time.perf_counter()
        await trio.sleep(LAG_PROBE_SECONDS)
        record.lag.append((time.time(), time.perf_counter() - before - LAG_PROBE_SECONDS))


async def timed(record: Record, phase: str, fn, *fn_args):
    start = time.time()
    try:
        return await trio.to_thread.run_sync(fn, *fn_args)
    finally:
        record.windows.append((phase, start, time.time()))


async def run_receiver(args: argparse.Namespace) -> tuple[Record, Trainer, dict[int, float]]:
    from sapo.protocol.network import serve_network
    from sapo.protocol.peers.identity import load_or_create_identity

    record = Record()
    with tempfile.TemporaryDirectory(prefix="sapo-bench-update-") as tmp:
        send, incoming = trio.open_memory_channel(4096)
        key_pair = load_or_create_identity(Path(tmp) / "receiver")
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                service = await nursery.start(partial(serve_network, gossip_settings([]), key_pair, send))
            nursery.start_soon(receive, incoming, record)
            command = [
                sys.executable,
                "-m",
                "bench.gossip_during_update",
                "--sender",
                service.listen_addrs[0],
                "--seed",
                str(args.seed),
                "--rate",
                str(args.rate),
                "--settle-seconds",
                str(args.settle_seconds),
            ]
            pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True, "cwd": BENCH.parent}
            sender = subprocess.Popen(command, **pipes)  # noqa: ASYNC220 - it talks over pipes
            try:
                started = time.monotonic()
                # The sender starts up while the policy loads; both take seconds.
                trainer = await trio.to_thread.run_sync(Trainer.load, args)
                record.setup["load policy s"] = time.monotonic() - started
                with trio.fail_after(SENDER_START_SECONDS):
                    line = await trio.to_thread.run_sync(sender.stdout.readline, abandon_on_cancel=True)
                if line.strip() != "ready":
                    raise RuntimeError(f"the sender exited before it was ready (code {sender.wait()})")
                record.setup["sender ready s"] = time.monotonic() - started
                sender.stdin.write("go\n")
                sender.stdin.flush()
                nursery.start_soon(probe_loop_lag, record)
                await timed(record, "generate", trainer.generate, args)
                for _ in range(args.cycles):
                    start = time.time()
                    await trio.sleep(args.idle_seconds)
                    record.windows.append(("idle", start, time.time()))
                    start = time.time()
                    while True:
                        if args.busy == "update":
                            stats = await trio.to_thread.run_sync(trainer.update)
                            record.skipped += stats.skipped
                            record.update_seconds.append(stats.seconds)
                            record.update_tokens.append(stats.tokens)
                        else:
                            result = await trio.to_thread.run_sync(trainer.generate, args)
                            record.update_seconds.append(result.seconds)
                            record.update_tokens.append(result.new_tokens)
                        if time.time() - start >= args.busy_seconds:
                            break
                    record.windows.append((args.busy, start, time.time()))
                await trio.sleep(0.5)  # the last frames in flight land
                sender.stdin.write("stop\n")
                sender.stdin.flush()
                with trio.fail_after(30):
                    out, _ = await trio.to_thread.run_sync(sender.communicate, abandon_on_cancel=True)
            finally:
                if sender.poll() is None:
                    sender.kill()
                    sender.wait()
            sent_line = next((line for line in out.splitlines() if line.startswith(SENT_MARKER)), None)
            if sent_line is None:
                raise RuntimeError(f"the sender printed no send times (code {sender.returncode})")
            sent = {int(seq): at for seq, at in json.loads(sent_line[len(SENT_MARKER) :]).items()}
            record.counters = dict(service.counters)
            nursery.cancel_scope.cancel()
    return record, trainer, sent


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sender:
        trio.run(sender_main, args)
        return 0
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    budget = 300 + args.cycles * (args.idle_seconds + args.busy_seconds)
    try:
        record, trainer, sent = trio.run(_bounded, args, budget)
    except trio.TooSlowError:
        print(f"benchmark did not finish within {budget:.0f} s", file=sys.stderr)
        return 1
    except RuntimeError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 1
    print_report(args, record, trainer, sent)
    return 0


async def _bounded(args: argparse.Namespace, seconds: float):
    with trio.fail_after(seconds):
        return await run_receiver(args)


if __name__ == "__main__":
    sys.exit(main())
