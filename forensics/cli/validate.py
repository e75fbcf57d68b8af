"""``forensics validate``: load a case (or its files) the way every command does, and report what was found."""

from __future__ import annotations

import argparse

from forensics.cli.common import add_command, console
from forensics.plan.step_mapping import assign_steps
from forensics.schema import STEP, alignment_warnings, load_plan, load_samples, open_case
from forensics.sources import read_metrics


def register(sub) -> None:
    p = add_command(sub, "validate", "Check that a case folder's metrics, plan and samples load and agree.",
                    "forensics validate forensics-demo/static")
    p.add_argument("case", nargs="?", help="case folder (metrics.parquet, plan.parquet, samples.parquet, run.toml)")
    p.add_argument("--metrics", action="append", default=None, metavar="SRC", help="metrics source (repeatable)")
    p.add_argument("--plan", default=None, help="plan table (Parquet/CSV/JSONL)")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = console()
    warnings: list[str] = []
    cfg = None
    metrics_src, plan_src, samples_src = args.metrics, args.plan, args.samples
    if args.case:
        case = open_case(args.case)
        cfg = case.config
        warnings += case.warnings
        metrics_src = metrics_src or [str(p) for p in case.metrics_sources]
        plan_src = plan_src or (str(case.plan_path) if case.plan_path else None)
        samples_src = samples_src or (str(case.samples_path) if case.samples_path else None)
    samples = load_samples(samples_src) if samples_src else None
    plan = None
    if plan_src:
        plan = load_plan(plan_src, samples)
        if cfg is not None:
            plan = assign_steps(plan, cfg.grad_accum, cfg.world_size, cfg.rank_split)
        else:
            plan = assign_steps(plan)
    metrics = None
    if metrics_src:
        metrics, report = read_metrics(metrics_src, step_offset=cfg.step_offset if cfg else 0)
        warnings += report.warnings
    if metrics is not None:
        out.print(f"metrics: {len(metrics)} steps ({metrics[STEP].min()}-{metrics[STEP].max()}), "
                  f"{len(metrics.columns) - 1} columns")
    if samples is not None:
        out.print(f"samples: {len(samples)}")
    if plan is not None:
        out.print(f"plan: {len(plan)} rows, {plan[STEP].nunique()} steps")
    if metrics is not None and plan is not None:
        warnings += alignment_warnings(metrics[STEP].to_numpy(), plan[STEP].to_numpy())
    for w in warnings:
        out.print(f"warning: {w}")
    out.print("ok" + (f" ({len(warnings)} warnings)" if warnings else ""))
    return 0
