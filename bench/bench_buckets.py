"""Bench: the exact optimal-boundary DP on 1M sample lengths, against a numpy sort of the same lengths.

The issue asks for "a 1M-sample set in seconds". The baseline is ``np.sort`` of the same lengths in the same run:
any boundary finder has to at least look at every length, and a sort is the cheapest thing that does so in order.
Peak memory is the tracemalloc peak of each call (numpy allocations are traced).

    python3 bench/bench_buckets.py            # 1,000,000 samples, K = 6, 16, 64
    python3 bench/bench_buckets.py --quick    # 100,000 samples
    python3 bench/bench_buckets.py --write-docs  # the table, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np
from _docs import provenance, rich_markdown, write_section
from rich.console import Console
from rich.table import Table

from forensics.plan.optimal_boundaries import (
    boundary_efficiency,
    optimal_boundaries,
    packing_efficiency,
    quantile_boundaries,
)
from forensics.schema import MAX_LEN


def measure(fn, repeat: int = 3) -> tuple[float, float, object]:
    """Best wall time of ``repeat`` runs (s) and the tracemalloc peak of one run (MiB)."""
    best = float("inf")
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return best, peak / 2**20, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="sample lengths (default 1,000,000)")
    ap.add_argument("--k", type=int, nargs="+", default=[6, 16, 64], help="bucket counts (default 6 16 64)")
    ap.add_argument("--max-len", type=int, default=MAX_LEN)
    ap.add_argument("--quick", action="store_true", help="100,000 rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    args = ap.parse_args()
    rows = 100_000 if args.quick else args.rows
    rng = np.random.default_rng(args.seed)
    lengths = np.clip(rng.lognormal(6.3, 1.0, rows).astype(np.int64) + 10, 10, 12_000)
    distinct = len(np.unique(np.minimum(lengths, args.max_len)))

    table = Table(title=f"{rows:,} lengths (lognormal, {distinct:,} distinct after capping at {args.max_len:,})")
    for col in ("what", "time s", "x np.sort", "peak MiB", "to-boundary eff."):
        table.add_column(col, justify="left" if col == "what" else "right")
    base_t, base_m, _ = measure(lambda: np.sort(lengths))
    table.add_row("np.sort (baseline)", f"{base_t:.3f}", "1.0", f"{base_m:.1f}", "")
    for k in args.k:
        t, m, b = measure(lambda k=k: optimal_boundaries(lengths, k, args.max_len))
        eff = boundary_efficiency(lengths, b, args.max_len)
        table.add_row(f"optimal_boundaries K={k}", f"{t:.3f}", f"{t / base_t:.1f}", f"{m:.1f}", f"{eff:.3f}")
        t, m, q = measure(lambda k=k: quantile_boundaries(lengths, k, args.max_len))
        table.add_row(
            f"quantile_boundaries K={k}",
            f"{t:.3f}",
            f"{t / base_t:.1f}",
            f"{m:.1f}",
            f"{boundary_efficiency(lengths, q, args.max_len):.3f}",
        )
    k = args.k[0]
    b = optimal_boundaries(lengths, k, args.max_len)
    t, m, pe = measure(lambda: packing_efficiency(lengths, b, max_len=args.max_len, seeds=[0]), repeat=1)
    table.add_row(
        f"packing_efficiency K={k}, 1 seed", f"{t:.3f}", f"{t / base_t:.1f}", f"{m:.1f}", f"packing {pe.overall:.3f}"
    )
    Console().print(table)
    if args.write_docs:
        write_section("bench_buckets", f"{table.title}. {provenance()}\n\n{rich_markdown(table)}")


if __name__ == "__main__":
    main()
