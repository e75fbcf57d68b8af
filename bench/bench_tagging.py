"""Bench: tagging a 10M-row plan and clustering 1M texts (time and peak memory), against named baselines.

- Tagging: a plan of ``--rows`` rows (1M samples x 10 epochs, batches of 64, grad_accum 4 on 8 ranks), mapped to steps
  (``assign_steps``) and tagged (``tag_steps``). Baseline: ``plan.groupby("step").size()`` on the same plan, the least
  any per-step computation costs (one grouping pass).
- Clustering: ``--texts`` demo snippets (5 sources) clustered with k = 5 (``cluster_samples``: TF-IDF + LSA fitted on
  20,000, k-means, applied to all). Baseline: ``TfidfVectorizer(sublinear_tf=True).fit_transform`` of all texts, the
  tool a user would run to get text features at all (target: at most 1.2x it at 1M texts). Both sides run on one
  thread (BLAS and OpenMP pools limited to 1 by threadpoolctl), so the ratio does not depend on the machine's cores or
  load from other processes' threads. The adjusted Rand index against the true sources is printed as a check.

Time is one run's wall clock; peak memory is the tracemalloc peak of a second run (numpy and pandas allocations are
traced), so the time is not slowed by tracing.

    python3 bench/bench_tagging.py            # 10,000,000 plan rows, 1,000,000 texts
    python3 bench/bench_tagging.py --quick    # 1,000,000 rows, 100,000 texts
    python3 bench/bench_tagging.py --skip tagging --texts 1000000 --repeat 3   # clustering only, best of 3
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from forensics.plan.step_mapping import assign_steps
from forensics.schema import DEFAULT_BOUNDARIES


def measure(fn, repeat: int = 1) -> tuple[float, float, object]:
    """Wall time (s; the best of ``repeat`` runs: on a shared machine the others measure the neighbours) and the
    tracemalloc peak of one more run (MiB)."""
    seconds = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        seconds = min(seconds, time.perf_counter() - t)
        del out
    tracemalloc.start()
    out = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, peak / 2**20, out


def synthetic_plan(rows: int, epochs: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``rows // epochs`` samples (lognormal lengths, 8 given clusters), each epoch a fresh order in batches of 64."""
    rng = np.random.default_rng(seed)
    n = rows // epochs
    samples = pd.DataFrame(
        {
            "sample_id": np.arange(n, dtype=np.int64),
            "n_tokens": np.clip(rng.lognormal(6.3, 1.0, n), 10, 12_000).astype(np.int32),
            "cluster": rng.integers(0, 8, n),
        }
    )
    plan = pd.DataFrame(
        {
            "epoch": np.repeat(np.arange(epochs, dtype=np.int64), n),
            "batch_id": np.tile(np.arange(n, dtype=np.int64) // 64, epochs),
            "sample_id": np.concatenate([rng.permutation(n) for _ in range(epochs)]).astype(np.int64),
        }
    )
    return plan, samples


def bench_tagging(rows: int, table: Table) -> None:
    from forensics.tagging import tag_steps

    plan, samples = synthetic_plan(rows, 10, 0)
    t_map, m_map, steps = measure(lambda: assign_steps(plan, grad_accum=4, world_size=8))
    t_base, m_base, _ = measure(lambda: steps.groupby("step").size())
    t_tag, m_tag, tags = measure(lambda: tag_steps(steps, samples, DEFAULT_BOUNDARIES))
    label = f"{len(plan):,} plan rows -> {len(tags):,} steps"
    table.add_row("baseline: groupby(step).size()", label, f"{t_base:.2f}", "1.0", f"{m_base:,.0f}")
    table.add_row("assign_steps (G=4, W=8)", label, f"{t_map:.2f}", f"{t_map / t_base:.1f}", f"{m_map:,.0f}")
    table.add_row("tag_steps", label, f"{t_tag:.2f}", f"{t_tag / t_base:.1f}", f"{m_tag:,.0f}")


def bench_clustering(texts: int, table: Table, repeat: int = 1) -> str:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics import adjusted_rand_score
    from threadpoolctl import threadpool_limits

    from forensics.datasets.samples import make_samples
    from forensics.tagging import cluster_samples

    samples = make_samples(texts, 0)
    with threadpool_limits(limits=1):
        t_base, m_base, _ = measure(lambda: TfidfVectorizer(sublinear_tf=True).fit_transform(samples["text"]), repeat)
        t_cl, m_cl, (clustered, info) = measure(lambda: cluster_samples(samples, k=5, max_fit=20_000, seed=0), repeat)
    label = f"{len(samples):,} texts, 1 thread"
    table.add_row("baseline: TF-IDF fit_transform", label, f"{t_base:.2f}", "1.0", f"{m_base:,.0f}")
    table.add_row("cluster_samples (k=5)", label, f"{t_cl:.2f}", f"{t_cl / t_base:.2f}", f"{m_cl:,.0f}")
    ari = adjusted_rand_score(samples["source"], clustered["cluster"])
    return f"clusters vs true sources: adjusted Rand index {ari:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="plan rows (default 10,000,000)")
    ap.add_argument("--texts", type=int, default=1_000_000, help="texts to cluster (default 1,000,000)")
    ap.add_argument("--quick", action="store_true", help="1,000,000 rows and 100,000 texts")
    ap.add_argument("--repeat", type=int, default=1, help="clustering: best of this many runs per side (default 1)")
    ap.add_argument("--skip", choices=["tagging", "clustering"], default=None, help="leave one part out")
    args = ap.parse_args()
    rows, texts = (1_000_000, 100_000) if args.quick else (args.rows, args.texts)
    table = Table(title="tagging and clustering")
    for col in ("what", "size", "time s", "x baseline", "peak MiB"):
        table.add_column(col, justify="left" if col in ("what", "size") else "right")
    notes = []
    if args.skip != "tagging":
        bench_tagging(rows, table)
    if args.skip != "clustering":
        notes.append(bench_clustering(texts, table, args.repeat))
    con = Console()
    con.print(table)
    for note in notes:
        con.print(note)
    con.print(f"max RSS of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:,.0f} MiB")


if __name__ == "__main__":
    main()
