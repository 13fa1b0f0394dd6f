"""`sapo-node judge` (serve held-out questions to nodes) and `sapo-node judge report`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from sapo.node.core.settings import parse_text_value


def cmd_judge(args: argparse.Namespace) -> int:
    if args.judge_command == "report":
        from sapo.node.judge.report import judge_report

        print(judge_report(args.report_data_dir, args.out, window=args.window))
        print(f"wrote {args.out}")
        return 0
    if args.seed is not None:
        print(
            "sapo-node judge: --seed is gone: each question's seed is drawn at random, since a fixed one made "
            "the questions predictable (issue #29); drop the flag",
            file=sys.stderr,
        )
        return 2
    from sapo.node.judge.settings import JudgeSettings

    given = {
        k: v
        for k, v in (("data_dir", args.data_dir), ("listen", args.listen), ("identity_seed", args.identity_seed))
        if v is not None
    }
    if args.tasks:
        given["tasks"] = [t for v in args.tasks for t in parse_text_value("--tasks", list[str], v)]
    settings = JudgeSettings(**given)
    import trio

    from sapo.node.judge.server import run_judge

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    trio.run(run_judge, settings)
    return 0


def add_commands(sub) -> None:
    judge = sub.add_parser(
        "judge",
        help="run the open judge, or `judge report` on its results",
        description="Serve /sapo/judge/1: nodes started with --judge ADDR are asked a held-out ReasoningGYM "
        "question every --judge-every rounds, answer greedily, and every score is stored in "
        "DATA_DIR/judge.sqlite. `sapo-node judge report` prints a leaderboard and writes a PNG.",
    )
    judge.add_argument(
        "--data-dir", type=Path, default=None, help="identity key and judge.sqlite (default: sapo-judge)"
    )
    judge.add_argument("--listen", default=None, help="multiaddr to listen on (default: /ip4/0.0.0.0/tcp/4101)")
    judge.add_argument("--tasks", nargs="*", default=None, help="ReasoningGYM tasks to ask (default: the paper's nine)")
    judge.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)  # refused with why, above
    judge.add_argument(
        "--identity-seed",
        default=None,
        help="derive the judge's identity from this 32-byte hex seed (local demos only)",
    )
    judge.set_defaults(func=cmd_judge, judge_command=None)
    judge_sub = judge.add_subparsers(dest="judge_command")
    report = judge_sub.add_parser("report", help="leaderboard and PNG of the judge's results")
    report.add_argument(
        "--data-dir", dest="report_data_dir", type=Path, default=Path("sapo-judge"), help="the judge's data dir"
    )
    report.add_argument("--out", type=Path, default=Path("judge.png"), help="PNG to write (default: judge.png)")
    report.add_argument("--window", type=int, default=20, help="moving-average window in results (default: 20)")
