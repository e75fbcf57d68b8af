"""``forensics buckets``: the K length buckets that pad least, and what greedy packing reaches with them."""

from __future__ import annotations

import argparse

from rich.table import Table

from forensics.cli.common import add_case_argument, add_command, console, open_case_from, stage_progress, write_json
from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_range
from forensics.plan.optimal_boundaries import DEFAULT_SEEDS, BucketsReport, buckets_report
from forensics.schema import check_output, load_samples
from forensics.schema.config import DEFAULT_N_BUCKETS


def register(sub) -> None:
    p = add_command(
        sub,
        "buckets",
        "Optimal length-bucket boundaries and the padding they leave.",
        "forensics buckets --samples forensics-demo/static/samples.parquet -k 6 --json buckets.json",
    )
    add_case_argument(p, "its samples and run.toml (K from its boundaries)")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL with sample_id, n_tokens)")
    p.add_argument(
        "-k",
        type=int,
        default=None,
        metavar="K",
        help=f"number of buckets (default: the case's boundaries', else {DEFAULT_N_BUCKETS})",
    )
    p.add_argument("--max-len", type=int, default=None, metavar="L", help="length cap (default: run.toml's, 8192)")
    p.add_argument(
        "--token-budget",
        type=int,
        default=None,
        metavar="T",
        help="padded tokens per batch for the packing simulation (default: run.toml's, 16384)",
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        metavar="B",
        help="samples per batch at most (default: run.toml's, 64)",
    )
    p.add_argument("--boundaries", default=None, metavar="b0,b1,...", help="boundaries to compare with")
    p.add_argument(
        "--seeds",
        type=int,
        default=len(DEFAULT_SEEDS),
        metavar="N",
        help=f"epochs of the bucketed shuffle simulated per boundary set (default {len(DEFAULT_SEEDS)})",
    )
    p.add_argument("--json", default=None, metavar="F", help="write the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output(args.json, (".json",), "--json")
    case = open_case_from(args)
    cfg = case.config
    k = args.k if args.k is not None else (len(cfg.boundaries) - 1 if cfg.boundaries else DEFAULT_N_BUCKETS)
    if cfg.samples is None:
        raise ForensicsError("buckets needs the samples: give a case folder or --samples")
    samples = load_samples(case.samples_path)
    with stage_progress("packing boundary sets") as update:
        report = buckets_report(samples, k, cfg, seeds=args.seeds, on_set=lambda name, i, n: update(i, n))
    _render(report)
    if args.json:
        write_json(report.to_json(), args.json)
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _render(report: BucketsReport) -> None:
    out = console()
    figures, settings = report.figures, report.settings
    summary = Table(
        title=f"{settings['samples']:,} samples, token budget {settings['token_budget']:,}, "
        f"max_len {settings['max_len']:,}"
    )
    for col in ("", "boundaries", "K", "to-boundary eff.", "packing eff."):
        summary.add_column(col, justify="right" if col in ("K", "to-boundary eff.", "packing eff.") else "left")
    for name, f in figures.items():
        summary.add_row(
            name,
            ",".join(map(str, f["boundaries"])),
            str(len(f["boundaries"]) - 1),
            _pct(f["boundary_efficiency"]),
            _pct(f["padding_efficiency"]),
        )
    out.print(summary)
    best = figures["optimal"]
    per_bucket = Table(title="optimal buckets")
    for col in ("bucket", "range", "samples", "to-boundary eff.", "packing eff."):
        per_bucket.add_column(col, justify="right")
    for i, (n, eb, ep) in enumerate(
        zip(best["bucket_samples"], best["bucket_boundary_efficiency"], best["bucket_efficiency"])
    ):
        per_bucket.add_row(str(i), bucket_range(i, best["boundaries"]), f"{n:,}", _pct(eb), _pct(ep))
    out.print(per_bucket)
