"""``forensics validate``: load a case (or its files) the way every command does, and report what was found."""

from __future__ import annotations

import argparse

from forensics.audit import validate_case
from forensics.cli.common import add_case_argument, add_command, add_step_mapping_options, console, open_case_from
from forensics.schema.words import counted


def register(sub) -> None:
    p = add_command(sub, "validate", "Check that a case folder's metrics, plan and samples load and agree.",
                    "forensics validate forensics-demo/static")
    add_case_argument(p, "metrics, plan, samples and run.toml (default: the current folder)")
    p.add_argument("--metrics", action="append", default=None, metavar="SRC", help="metrics source (repeatable)")
    p.add_argument("--plan", default=None, help="plan table (Parquet/CSV/JSONL)")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL)")
    add_step_mapping_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.case is None and not (args.metrics or args.plan or args.samples):
        args.case = "."
    check = validate_case(open_case_from(args))
    out, err = console(), console(stderr=True)
    for line in check.lines:
        out.print(line, markup=False)
    for w in check.warnings:
        err.print(f"warning: {w}", markup=False)
    out.print("ok" + (f" ({counted(len(check.warnings), 'warning')})" if check.warnings else ""))
    return 0
