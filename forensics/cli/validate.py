"""``forensics validate``: load a case (or its files) the way every command does, and report what was found."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from forensics.cli.common import add_case_argument, add_command, add_step_mapping_options, console, open_case_from
from forensics.errors import ForensicsError
from forensics.pipeline.audit import validate_case
from forensics.schema.words import counted


def register(sub) -> None:
    p = add_command(
        sub,
        "validate",
        "Check that a case folder's metrics, plan and samples load and agree.",
        "forensics validate forensics-demo/static",
    )
    add_case_argument(p, "metrics, plan, samples and run.toml (default: the current folder)")
    p.add_argument("--metrics", action="append", default=None, metavar="SRC", help="metrics source (repeatable)")
    p.add_argument("--plan", default=None, help="plan table (Parquet/CSV/JSONL)")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL)")
    add_step_mapping_options(p)
    p.add_argument(
        "--json",
        default=None,
        metavar="F",
        help="also write what was found as JSON: found, warnings, compiled {cache, warm, loops}",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.case is None and not (args.metrics or args.plan or args.samples):
        args.case = "."
    from forensics.compiled import compiled_state
    from forensics.compiled.loops import compile_from

    if args.json is not None and not str(args.json).endswith(".json"):
        raise ForensicsError(f"validate --json {args.json}: writes JSON only; name a file ending in .json")
    check = validate_case(open_case_from(args))
    compiled = compiled_state()
    out, err = console(), console(stderr=True)
    for line in check.lines:
        out.print(line, markup=False)
    cold = [name for name, warm in compiled["loops"].items() if not warm]
    rows = f"{compile_from():,}"
    state = (
        "all cached"
        if compiled["warm"]
        else f"not cached yet: {', '.join(cold)} (runs under {rows} rows use plain Python; longer ones compile once)"
    )
    out.print(f"compiled loops: {state}; cache {compiled['cache']}", markup=False)
    for w in check.warnings:
        err.print(f"warning: {w}", markup=False)
    if args.json is not None:
        Path(args.json).write_text(json.dumps({**check.to_json(), "compiled": compiled}, indent=2) + "\n")
    out.print("ok" + (f" ({counted(len(check.warnings), 'warning')})" if check.warnings else ""))
    return 0
