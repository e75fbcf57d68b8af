"""``forensics whatif``: what each batching strategy of the story costs in padding, step spread and throughput."""

from __future__ import annotations

import argparse

from rich.table import Table

from forensics.cli.common import add_case_argument, add_command, console, open_case_from, stage_progress, write_json
from forensics.plan.whatif import STORY_TOKENS_PER_S, STRATEGIES, whatif_case
from forensics.schema import DEFAULT_BOUNDARIES, MAX_BATCH_SIZE, MAX_LEN, TOKEN_BUDGET, check_output


def register(sub) -> None:
    p = add_command(
        sub,
        "whatif",
        "What each batching strategy costs: padding, tokens per step, throughput.",
        "forensics whatif --samples forensics-demo/static/samples.parquet --token-budget 16384",
    )
    add_case_argument(p, "its samples and run.toml")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL with sample_id, n_tokens)")
    p.add_argument(
        "--token-budget",
        type=int,
        default=None,
        metavar="T",
        help=f"padded tokens per batch (default: run.toml's, else {TOKEN_BUDGET})",
    )
    p.add_argument(
        "--boundaries",
        default=None,
        metavar="b0,b1,...",
        help="bucket boundaries of the bucketed strategy (default: run.toml's, else the story's "
        f"{','.join(map(str, DEFAULT_BOUNDARIES))})",
    )
    p.add_argument(
        "--tokens-per-s",
        type=float,
        default=STORY_TOKENS_PER_S,
        metavar="X",
        help="real tokens/s measured on the static sorted plan; the others are scaled from it by padding "
        "efficiency, assuming padded tokens cost the same everywhere "
        f"(default {STORY_TOKENS_PER_S:,.0f})",
    )
    p.add_argument("--max-len", type=int, default=None, metavar="L", help=f"length cap (default {MAX_LEN})")
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        metavar="B",
        help=f"samples per batch at most (default {MAX_BATCH_SIZE})",
    )
    p.add_argument("--grad-accum", type=int, default=None, metavar="G", help="micro-batches per optimizer step")
    p.add_argument("--world-size", type=int, default=None, metavar="W", help="data-parallel ranks")
    p.add_argument("--epochs", type=int, default=1, metavar="N", help="epochs built per strategy (default 1)")
    p.add_argument("--seed", type=int, default=0, help="builder seed (default 0)")
    p.add_argument("--json", default=None, metavar="F", help="write the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_output(args.json, (".json",), "--json")
    case = open_case_from(args)
    with stage_progress("building strategies", total=len(STRATEGIES)) as update:
        result = whatif_case(
            case,
            tokens_per_s=args.tokens_per_s,
            epochs=args.epochs,
            seed=args.seed,
            on_strategy=lambda name: update(STRATEGIES.index(name)),
        )
    _render(result, result.n_samples)
    if args.json:
        write_json(result.to_json(), args.json)
    return 0


LABELS = {
    "static_sorted": "static sorted",
    "bucketed_given": "bucketed, given",
    "bucketed_optimal": "bucketed, optimal",
    "shuffle_then_sort": "shuffle-then-sort",
    "random_shuffle": "random",
}


def _k(x: float) -> str:
    return f"{x / 1000:.1f}K"


def _render(result, n_samples: int) -> None:
    out = console()
    cost = Table(
        title=f"per epoch: {n_samples:,} samples, token budget {result.token_budget:,}, "
        f"{result.grad_accum * result.world_size} batch(es) per step"
    )
    for col in ("strategy", "batches", "steps", "pad eff.", "tok/s", "vs sorted"):
        cost.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    spread = Table(title="tokens per step: real | padded")
    for col in ("strategy", "mean", "cv", "p5-p95", "padded", "cv ", "p5-p95 "):
        spread.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    for s in result.strategies:
        label = LABELS.get(s.name, s.name)
        cost.add_row(
            label,
            f"{s.batches_per_epoch:,.0f}",
            f"{s.steps_per_epoch:,.0f}",
            f"{100 * s.padding_efficiency:.1f}%",
            f"{s.tokens_per_s:,.0f}",
            f"{100 * s.throughput_vs_sorted:.0f}%",
        )
        r, p = s.real_tokens_per_step, s.padded_tokens_per_step
        spread.add_row(
            label,
            _k(r.mean),
            f"{r.cv:.2f}",
            f"{_k(r.p5)}-{_k(r.p95)}",
            _k(p.mean),
            f"{p.cv:.2f}",
            f"{_k(p.p5)}-{_k(p.p95)}",
        )
    out.print(cost)
    out.print(spread)
    for s in result.strategies:
        if s.boundaries:
            out.print(f"{LABELS.get(s.name, s.name)} boundaries: {s.boundaries}")
    for w in result.warnings:
        out.print(f"warning: {w}")
    out.print(f"assumption: {result.assumption} (X = {result.tokens_per_s_measured:,.0f} tok/s)")
    out.print(f"random/sorted throughput: {100 * result.random_over_sorted:.0f}%")
