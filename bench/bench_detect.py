"""Bench of the spike detector: offline against one pandas rolling median, online against offline.

A synthetic run of ``--rows`` steps (default 1,000,000) with tags: a decaying loss, six length buckets randomly
interleaved (each its own loss level), Student-t noise, a spike every 50,000 steps and a few NaN steps.

- offline: ``SpikeDetector(window=W).detect(metrics, tags)`` against ``metrics[loss].rolling(W).median()`` over the
  same series, in the same process (target: within 3x);
- online: the same detector fed ``update()`` in chunks of ``--chunk`` rows (default 1,000), then ``finish()``,
  against offline (target: within 2x); the findings must be identical;
- peak memory of the offline detection (tracemalloc, Python allocations including numpy buffers) and the process's
  peak resident size.

Timings are the best of ``--repeat`` runs, after a warm-up run that loads (or compiles) the numba kernel.

    python3 bench/bench_detect.py            # 1M rows
    python3 bench/bench_detect.py --quick    # 100k rows
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc

import numpy as np
import pandas as pd
from _docs import markdown_table, provenance, write_section

from forensics.detect.spikes import SpikeDetector


def make_run(rows: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, list[int]]:
    """Metrics and tags of a bucketed run with known spikes."""
    rng = np.random.default_rng(seed)
    step = np.arange(rows, dtype=np.int64)
    bucket = rng.integers(0, 6, rows)
    offsets = np.array([0.15, 0.1, 0.05, 0.0, -0.05, -0.1])
    trend = 0.9 + 6.0 * np.exp(-step / 300.0) - 0.2 * step / rows
    loss = trend + offsets[bucket] + 0.01 * rng.standard_t(3, rows) / np.sqrt(3)
    spikes = list(range(25_000, rows, 50_000))
    loss[spikes] = 4.5
    loss[rng.choice(rows, size=max(1, rows // 100_000), replace=False)] = np.nan
    metrics = pd.DataFrame({"step": step, "train/loss": loss})
    tags = pd.DataFrame({"step": step, "bucket": bucket})
    return metrics, tags, spikes


def best_of(repeat: int, fn):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def key(findings) -> list:
    return sorted((f.kind, f.step, f.end_step, f.peak_step) for f in findings)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="100,000 rows")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write-docs", action="store_true", help="write the figures into docs/accuracy.md")
    args = ap.parse_args(argv)
    rows = 100_000 if args.quick else args.rows

    metrics, tags, spikes = make_run(rows)
    series = metrics["train/loss"]
    chunks = [metrics.iloc[i : i + args.chunk] for i in range(0, rows, args.chunk)]
    SpikeDetector(window=args.window).detect(metrics.iloc[:2000], tags)  # load or compile the kernel

    t_pandas, _ = best_of(args.repeat, lambda: series.rolling(args.window).median())

    def offline():
        return SpikeDetector(window=args.window).detect(metrics, tags)

    def online():
        det = SpikeDetector(window=args.window)
        det.reset()
        found = []
        for c in chunks:
            found += det.update(c, tags)
        return found + det.finish()

    t_off, f_off = best_of(args.repeat, offline)
    t_on, f_on = best_of(args.repeat, online)

    tracemalloc.start()
    offline()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    found_spikes = sorted(f.step for f in f_off if f.kind == "spike")
    same = key(f_off) == key(f_on)
    print(f"rows: {rows:,}  window: {args.window}  chunk: {args.chunk:,}  repeat: {args.repeat} (best)")
    print(f"{'what':<44}{'seconds':>10}{'ratio':>9}  target")
    print(f"{'pandas rolling(W).median()':<44}{t_pandas:>10.3f}{1.0:>9.2f}")
    print(f"{'SpikeDetector.detect (offline, with tags)':<44}{t_off:>10.3f}{t_off / t_pandas:>9.2f}  <= 3x pandas")
    print(f"{'SpikeDetector.update in chunks (online)':<44}{t_on:>10.3f}{t_on / t_off:>9.2f}  <= 2x offline")
    print(f"peak memory of offline detection (tracemalloc): {peak / 2**20:.1f} MiB; process peak RSS: {rss:.0f} MiB")
    hit = len(set(spikes) & set(found_spikes))
    print(
        f"spikes found: {len(found_spikes)}, of which planted: {hit}/{len(spikes)} (the others are Student-t "
        f"noise excursions of >= 1.5x the baseline); online == offline: {same}"
    )
    if args.write_docs:
        table = markdown_table(
            ["what", "seconds (best of " + str(args.repeat) + ")", "ratio", "target"],
            [
                ["pandas `rolling(" + str(args.window) + ").median()`", f"{t_pandas:.3f}", "1.00x", ""],
                [
                    "`SpikeDetector.detect`, offline, with tags",
                    f"{t_off:.3f}",
                    f"{t_off / t_pandas:.2f}x pandas",
                    "<= 3x pandas",
                ],
                [
                    f"`SpikeDetector.update` in chunks of {args.chunk:,} rows",
                    f"{t_on:.3f}",
                    f"{t_on / t_off:.2f}x offline",
                    "<= 2x offline",
                ],
            ],
        )
        write_section(
            "bench_detect",
            f"{rows:,} steps with tags. {provenance()}\n\n{table}\n\n"
            f"Online findings equal offline: {same}; planted spikes found: {hit} of {len(spikes)}.",
        )
    return 0 if same and set(spikes) <= set(found_spikes) else 1


if __name__ == "__main__":
    sys.exit(main())
