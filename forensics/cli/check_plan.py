"""``forensics check-plan``: the CI gate that fails when batch composition does not vary across epochs.

Exit 0 pass, 1 fail, 2 bad input. The measures, limits and verdict live in :mod:`forensics.plan.gate`.
"""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from forensics.cli.common import (
    add_case_argument,
    add_command,
    add_engine_options,
    console,
    open_case_from,
    stage,
    write_json,
)
from forensics.errors import ForensicsError
from forensics.plan.gate import GateOptions, GateResult, check_case, write_junit
from forensics.schema import RANK_SPLITS, check_output


def register(sub) -> None:
    p = add_command(
        sub,
        "check-plan",
        "CI gate: fail when batch composition does not vary across epochs.",
        "forensics check-plan --builder my_data.py:build_batches --samples samples.parquet --junit check-plan.xml",
    )
    add_case_argument(p, "its plan, samples and run.toml")
    p.add_argument("--plan", help="plan table with an 'epoch' column (Parquet/CSV/JSONL, or a folder of parts)")
    p.add_argument(
        "--builder",
        help="reference builder name, module:function or path/to/file.py:function "
        "(called once per epoch; needs the samples)",
    )
    p.add_argument("--samples", help="samples table (sample_id, n_tokens): size-aware limits, coverage, padding")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        metavar="N",
        help="epochs to compare (default: all in a plan; 3 for a builder)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="K", help="seed passed to the builder (default 0)")
    p.add_argument(
        "--token-budget",
        type=int,
        default=None,
        metavar="T",
        help="padded tokens per batch, for the builder (default 16384) and the reference bucketed "
        "shuffle (default: the plan's largest padded batch)",
    )
    p.add_argument("--max-len", type=int, default=None, metavar="L", help="truncation length (default 8192)")
    p.add_argument(
        "--boundaries",
        default=None,
        metavar="b0,b1,...",
        help="length-bucket boundaries of the reference (default: run.toml's, else fitted to the samples)",
    )
    p.add_argument(
        "--max-pair-retention",
        type=float,
        default=None,
        metavar="X",
        help="override the derived pair-retention limit (0-1)",
    )
    p.add_argument(
        "--max-identical-batches",
        type=float,
        default=None,
        metavar="X",
        help="override the derived identical-batches limit (0-1)",
    )
    p.add_argument(
        "--allow-drop-last",
        type=int,
        default=None,
        metavar="N",
        help="an epoch may miss at most N samples (default: fewer than one of its batches, a dropped "
        "last partial batch, noted; 0: none); repeats always fail",
    )
    p.add_argument(
        "--min-padding-efficiency",
        type=float,
        default=None,
        metavar="X",
        help="fail when an epoch's real/padded tokens is below X (needs the samples)",
    )
    p.add_argument("--grad-accum", type=int, default=None, metavar="G", help="micro-batches per step (cluster runs)")
    p.add_argument("--world-size", type=int, default=None, metavar="W", help="data-parallel ranks (cluster runs)")
    p.add_argument("--rank-split", choices=RANK_SPLITS, default=None, help="how batches go to ranks")
    add_engine_options(p)
    p.add_argument("--json", default=None, metavar="F", help="write the result as JSON")
    p.add_argument("--junit", default=None, metavar="F", help="write a JUnit XML file for CI")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output(args.json, (".json",), "--json")
    check_output(args.junit, (".xml",), "--junit")
    if args.plan and args.builder:
        raise ForensicsError("check-plan: give --plan or --builder, not both")
    options = GateOptions(
        max_pair_retention=args.max_pair_retention,
        max_identical_batches=args.max_identical_batches,
        allow_drop_last=args.allow_drop_last,
        min_padding_efficiency=args.min_padding_efficiency,
    )
    case = open_case_from(args)
    with stage("checking batch composition across epochs"):
        result = check_case(case, builder=args.builder, epochs=args.epochs, seed=args.seed, options=options)
    if args.json:
        write_json(result.to_json(), args.json)
    if args.junit:
        write_junit(result, args.junit)
    render(result)
    return 0 if result.passed else 1


def render(result: GateResult) -> None:
    out = console()
    lim = result.threshold
    pairs = Table(title=f"batch composition: {escape(result.source)}", title_justify="left")
    for col in ("epochs", "pair retention", "identical batches", "order only"):
        pairs.add_column(col, justify="left" if col == "epochs" else "right")
    rows = [(f"{p.earlier}-{p.later}", p) for p in result.pairs]
    if len(result.epochs) > 2:
        rows.append((f"{result.first_last.earlier}-{result.first_last.later} (first-last)", result.first_last))
    for label, p in rows:
        pairs.add_row(
            label,
            _mark(p.pair_retention, lim.pair_retention),
            _mark(p.identical_batches, lim.identical_batches),
            "[red]yes[/]" if p.order_only else "no",
        )
    out.print(pairs)
    epochs = Table(title="per epoch", title_justify="left")
    cols = ["epoch", "missing", "duplicated"]
    if result.epoch_padding_efficiency is not None:
        cols.append("padding eff.")
    if result.cluster_mix:
        cols += ["entropy (bits)", "longest run (steps)"]
    for col in cols:
        epochs.add_column(col, justify="right")
    for i, c in enumerate(result.coverage):
        row = [str(c.epoch), str(c.missing), str(c.duplicated)]
        if result.epoch_padding_efficiency is not None:
            row.append(f"{result.epoch_padding_efficiency[i]:.1%}")
        if result.cluster_mix:
            m = result.cluster_mix[i] if i < len(result.cluster_mix) else None
            row += (
                [f"{m.cluster_entropy:.2f}", f"{m.longest_dominant_run} ({escape(str(m.dominant_cluster))})"]
                if m
                else ["", ""]
            )
        epochs.add_row(*row)
    out.print(epochs)
    out.print(f"limits: pair retention <= {lim.pair_retention:.4g}, identical batches <= {lim.identical_batches:.4g}")
    out.print(f"  [dim]{escape(lim.how)}[/]")
    if result.passed:
        out.print("[green]PASS[/]: batch composition varies across epochs")
    else:
        out.print("[red]FAIL[/]:")
        for f in result.failures:
            out.print(f"  - {escape(f)}")


def _mark(value: float, limit: float) -> str:
    text = f"{value:.2%}" if value >= 0.0001 or value == 0 else f"{value:.2e}"
    return f"[red]{text}[/]" if value > limit else text
