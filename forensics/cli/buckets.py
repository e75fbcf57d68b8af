"""``forensics buckets``: the K length buckets that pad least, and what greedy packing reaches with them."""

from __future__ import annotations

import argparse

from rich.progress import Progress
from rich.table import Table

from forensics.cli.common import add_command, console, write_json
from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_range
from forensics.plan.optimal_boundaries import (
    DEFAULT_SEEDS,
    conform_boundaries,
    describe_boundaries,
    optimal_boundaries,
    quantile_boundaries,
)
from forensics.schema import (
    DEFAULT_BOUNDARIES,
    MAX_BATCH_SIZE,
    MAX_LEN,
    N_TOKENS,
    TOKEN_BUDGET,
    load_samples,
    parse_boundaries,
)


def register(sub) -> None:
    p = add_command(sub, "buckets", "Optimal length-bucket boundaries and the padding they leave.",
                    "forensics buckets --samples forensics-demo/static/samples.parquet -k 6 --json buckets.json")
    p.add_argument("--samples", required=True, help="samples table (Parquet/CSV/JSONL with sample_id, n_tokens)")
    p.add_argument("-k", type=int, required=True, metavar="K", help="number of buckets")
    p.add_argument("--max-len", type=int, default=MAX_LEN, metavar="L", help=f"length cap (default {MAX_LEN})")
    p.add_argument("--token-budget", type=int, default=TOKEN_BUDGET, metavar="T",
                   help=f"padded tokens per batch for the packing simulation (default {TOKEN_BUDGET})")
    p.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE, metavar="B",
                   help=f"samples per batch at most (default {MAX_BATCH_SIZE})")
    p.add_argument("--boundaries", default=None, metavar="b0,b1,...", help="boundaries to compare with")
    p.add_argument("--seeds", type=int, default=len(DEFAULT_SEEDS), metavar="N",
                   help=f"epochs of the bucketed shuffle simulated per boundary set (default {len(DEFAULT_SEEDS)})")
    p.add_argument("--json", default=None, metavar="F", help="write the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    given = parse_boundaries(args.boundaries) if args.boundaries else None
    for flag, value in (("--token-budget", args.token_budget), ("--max-batch-size", args.max_batch_size),
                        ("--seeds", args.seeds)):
        if value < 1:
            raise ForensicsError(f"{flag} must be >= 1; got {value}")
    samples = load_samples(args.samples)
    if samples.empty:
        raise ForensicsError(f"samples {args.samples}: the table has no rows")
    lengths = samples[N_TOKENS].to_numpy()
    k, max_len = args.k, args.max_len
    sets = {"optimal": optimal_boundaries(lengths, k, max_len), "quantile": quantile_boundaries(lengths, k, max_len),
            "story": conform_boundaries(DEFAULT_BOUNDARIES, max_len)}
    if given is not None:
        sets["given"] = conform_boundaries(given, max_len)
    figures = {}
    with Progress(console=console(stderr=True), transient=True) as progress:
        task = progress.add_task("packing", total=len(sets))
        for name, b in sets.items():
            progress.update(task, description=f"packing with {name} boundaries")
            figures[name] = describe_boundaries(lengths, b, token_budget=args.token_budget, max_len=max_len,
                                                max_batch_size=args.max_batch_size, seeds=range(args.seeds))
            progress.advance(task)
    result = dict(figures["optimal"])
    result["compared"] = {name: f for name, f in figures.items() if name != "optimal"}
    result["settings"] = {"k": k, "max_len": max_len, "token_budget": args.token_budget,
                          "max_batch_size": args.max_batch_size, "seeds": list(range(args.seeds)),
                          "samples": len(lengths)}
    _render(figures, result["settings"])
    if args.json:
        write_json(result, args.json)
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _render(figures: dict, settings: dict) -> None:
    out = console()
    summary = Table(title=f"{settings['samples']:,} samples, token budget {settings['token_budget']:,}, "
                          f"max_len {settings['max_len']:,}")
    for col in ("", "boundaries", "K", "to-boundary eff.", "packing eff."):
        summary.add_column(col, justify="right" if col in ("K", "to-boundary eff.", "packing eff.") else "left")
    for name, f in figures.items():
        summary.add_row(name, ",".join(map(str, f["boundaries"])), str(len(f["boundaries"]) - 1),
                        _pct(f["boundary_efficiency"]), _pct(f["padding_efficiency"]))
    out.print(summary)
    best = figures["optimal"]
    per_bucket = Table(title="optimal buckets")
    for col in ("bucket", "range", "samples", "to-boundary eff.", "packing eff."):
        per_bucket.add_column(col, justify="right")
    for i, (n, eb, ep) in enumerate(zip(best["bucket_samples"], best["bucket_boundary_efficiency"],
                                        best["bucket_efficiency"])):
        per_bucket.add_row(str(i), bucket_range(i, best["boundaries"]), f"{n:,}", _pct(eb), _pct(ep))
    out.print(per_bucket)
