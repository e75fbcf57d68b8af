"""``forensics ingest``: read metrics sources, merge them on step and write the canonical metrics table."""

from __future__ import annotations

import argparse
import sys

from forensics.cli.common import add_command, add_mlflow_uri_option, console, use_mlflow_uri
from forensics.sources.ingest import ingest


def register(sub) -> None:
    p = add_command(
        sub,
        "ingest",
        "Read metrics (JSONL, CSV, TensorBoard, text logs, W&B, MLflow) into one canonical metrics.parquet.",
        "forensics ingest train.log wandb/offline-run-20250101_000000-abc123 -o metrics.parquet",
    )
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="a file or folder, or a case folder (later sources win on a shared step and metric)",
    )
    p.add_argument("-o", "--out", required=True, metavar="FILE", help="the metrics table to write (.parquet)")
    p.add_argument(
        "--keys",
        action="append",
        default=None,
        metavar="K",
        help="keep only this metric (repeatable; glob patterns such as 'train/*' allowed)",
    )
    p.add_argument(
        "--step-key",
        default=None,
        metavar="K",
        help="the key holding the step (default: the first of step, _step, global_step, iter, iteration)",
    )
    p.add_argument(
        "--step-offset",
        type=int,
        default=None,
        metavar="N",
        help="metrics step = logged step - N (a log counting from 1 takes N = 1)",
    )
    p.add_argument(
        "--pattern",
        default=None,
        metavar="REGEX",
        help="text logs: a regex with a group 'step' and one named group per metric",
    )
    p.add_argument("--strict", action="store_true", help="a malformed line is an error (exit 2), not skipped")
    p.add_argument("--run-id", default=None, metavar="ID", help="W&B: the run to read from a folder of several")
    add_mlflow_uri_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    use_mlflow_uri(args)
    table, report = ingest(
        args.sources,
        args.out,
        keys=args.keys,
        step_key=args.step_key,
        step_offset=args.step_offset,
        pattern=args.pattern,
        strict=args.strict,
        run_id=args.run_id,
        progress=sys.stderr.isatty(),
    )
    out, err = console(), console(stderr=True)
    for line in report.summary_lines():
        out.print(line, markup=False)
    for w in report.warnings:
        err.print(f"warning: {w}", markup=False)
    out.print(f"wrote {args.out}", markup=False)
    return 0
