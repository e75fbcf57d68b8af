"""Benchmark the report on a long run: size and build time of the HTML, and spike-preserving downsampling.

A synthetic run (default 1M steps: loss with warm-up, noise and a bucket effect, grad norm, lr, and one tags row per
step) with a few one-step spikes. Measured in the same run:

- downsampling one 1M-point series: tsdownsample MinMax (what the report uses), MinMaxLTTB, the numpy min/max
  fallback, and plain striding (every k-th point) as the baseline; for each, the time (median of ``--repeat``)
  and how many of the spikes survive (striding loses them);
- the whole report: build time, file size (target < 10 MB for 1M steps), the payload besides plotly.js, and
  whether every spike step is among the points the loss curve draws (decoded from the embedded JSON).

Usage: ``python bench/bench_report.py [--steps N] [--spikes K] [--points P] [--repeat R] [--quick] [--out F]
[--write-docs]`` (``--write-docs``: the tables, also into docs/accuracy.md between its markers)
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _docs import markdown_table, provenance, write_section
from plotly.offline import get_plotlyjs

from forensics.report import build_report, minmax_indices, stride_indices
from forensics.report.downsample import numpy_minmax_indices

BOUNDARIES = (0, 770, 1216, 1728, 2432, 3296, 8192)
CLUSTER_NAMES = [
    "qa what how",
    "chat hello thanks",
    "math solve equation",
    "docs api function",
    "code def return",
    "code class import",
    "prose story said",
    "table row column",
]


def synthetic_run(n: int, n_spikes: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, dict, np.ndarray]:
    """Metrics, tags and findings of an ``n``-step run with ``n_spikes`` isolated one-step loss spikes."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n, dtype=np.int64)
    bucket = rng.integers(0, len(BOUNDARIES) - 1, n)
    cluster = np.clip(bucket + rng.integers(0, 3, n), 0, len(CLUSTER_NAMES) - 1)
    loss = 0.9 + 2.5 * np.exp(-steps / max(1.0, n / 200)) + 0.05 * bucket + 0.03 * rng.standard_normal(n)
    spikes = np.sort(rng.choice(np.arange(n // 20, n - n // 20), n_spikes, replace=False))
    loss[spikes] = 4.0 + 2.0 * rng.random(n_spikes)
    grad = 1.0 + 0.1 * rng.standard_normal(n)
    lr = np.minimum(1.0, (steps + 1) / 2000) * 3e-4
    metrics = pd.DataFrame({"step": steps, "train/loss": loss, "grad_norm": grad, "lr": lr})
    ranges = np.array([f"({a}, {b}]" for a, b in zip(BOUNDARIES[:-1], BOUNDARIES[1:])])
    real = rng.integers(8_000, 16_000, n)
    tags = pd.DataFrame(
        {
            "step": steps,
            "epoch": steps * 6 // n,
            "bucket": bucket,
            "bucket_range": ranges[bucket],
            "cluster": cluster,
            "cluster_name": np.array(CLUSTER_NAMES)[cluster],
            "cluster_entropy": rng.random(n),
            "real_tokens": real,
            "padded_tokens": np.full(n, 16_384),
            "padding_ratio": 1 - real / 16_384,
        }
    )
    findings = {
        "spikes": [
            {
                "step": int(s),
                "end_step": int(s),
                "peak_step": int(s),
                "metric": "train/loss",
                "value": float(loss[s]),
                "baseline": 0.95,
                "score": 50.0,
                "suspect_samples": [],
                "bucket": int(bucket[s]),
                "bucket_range": str(ranges[bucket[s]]),
                "cluster": int(cluster[s]),
                "cluster_name": CLUSTER_NAMES[cluster[s]],
                "evidence": [f"loss {loss[s]:.3g} is {loss[s] / 0.95:.1f}x its baseline 0.95"],
                "next_step": f"Replay step {s} from the checkpoint before it.",
            }
            for s in spikes
        ],
        "nonfinite": [],
        "oscillation": {"detected": False, "bucket_variance_share": 0.3},
        "plan": None,
        "warnings": [],
    }
    return metrics, tags, findings, spikes


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


def drawn_loss_steps(html: str) -> np.ndarray:
    """The x values of the loss curve's line trace, decoded from the report's embedded JSON."""
    blob = re.search(r'id="forensics-figures">(.*?)</script>', html, re.S).group(1)
    figs = json.loads(blob)
    xs = []
    for trace in figs["curves"]["data"]:
        if trace.get("mode") == "lines" and trace.get("yaxis", "y") == "y":
            x = trace["x"]
            if isinstance(x, dict):  # plotly typed array: {"dtype": "i8", "bdata": base64}
                xs.append(np.frombuffer(base64.b64decode(x["bdata"]), dtype=np.dtype(x["dtype"])))
            else:
                xs.append(np.asarray(x))
    return np.concatenate(xs) if xs else np.array([], np.int64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000, help="steps in the synthetic run (default 1M)")
    ap.add_argument("--spikes", type=int, default=8, help="one-step loss spikes (default 8)")
    ap.add_argument("--points", type=int, default=4000, help="points per downsampled series (default 4000)")
    ap.add_argument("--repeat", type=int, default=5, help="timing repeats, median reported (default 5)")
    ap.add_argument("--quick", action="store_true", help="100k steps, 3 repeats")
    ap.add_argument("--out", type=Path, default=Path("bench/out/report-bench.html"), help="where to write the report")
    ap.add_argument("--write-docs", action="store_true", help="write the tables into docs/accuracy.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.repeat = min(args.steps, 100_000), 3

    t = time.perf_counter()
    metrics, tags, findings, spikes = synthetic_run(args.steps, args.spikes)
    print(
        f"synthetic run: {args.steps:,} steps, {len(spikes)} spikes, built in {time.perf_counter() - t:.2f} s",
        file=sys.stderr,
    )
    x = metrics["step"].to_numpy()
    y = metrics["train/loss"].to_numpy()

    methods = {
        "striding (baseline)": lambda: stride_indices(len(y), args.points),
        "tsdownsample MinMax (report)": lambda: minmax_indices(x, y, args.points, method="minmax"),
        "tsdownsample MinMaxLTTB": lambda: minmax_indices(x, y, args.points, method="minmaxlttb"),
        "numpy min/max fallback": lambda: numpy_minmax_indices(y, args.points),
    }
    rows = []
    for name, fn in methods.items():
        fn()  # warm-up (imports, page faults)
        sec, idx = timed(fn, args.repeat)
        rows.append((name, sec, len(idx), int(np.isin(spikes, idx).sum())))
    base = rows[0][1]
    print(f"\nDownsampling {args.steps:,} points to {args.points:,} (median of {args.repeat})")
    print(f"{'method':<30} {'time ms':>9} {'x striding':>11} {'points':>8} {'spikes kept':>12}")
    for name, sec, n_pts, kept in rows:
        print(f"{name:<30} {sec * 1e3:>9.2f} {sec / base:>11.0f} {n_pts:>8,} {kept:>7}/{len(spikes)}")

    t = time.perf_counter()
    html = build_report(findings, metrics, tags)
    build_s = time.perf_counter() - t
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(html, encoding="utf-8")
    size = len(html.encode("utf-8"))
    js = len(get_plotlyjs().encode("utf-8"))
    drawn = drawn_loss_steps(html)
    in_report = int(np.isin(spikes, drawn).sum())
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nReport for {args.steps:,} steps with tags ({args.out})")
    print(f"{'build time':<34} {build_s:>10.2f} s")
    print(f"{'file size':<34} {size / 1e6:>10.2f} MB  (target < 10 MB: {'ok' if size < 10e6 else 'OVER'})")
    print(f"{'  of which plotly.js (once)':<34} {js / 1e6:>10.2f} MB")
    print(f"{'  figures, cards, styles':<34} {(size - js) / 1e6:>10.2f} MB")
    print(f"{'loss points drawn':<34} {len(drawn):>10,}")
    print(f"{'spike steps among them':<34} {in_report:>7}/{len(spikes)}")
    print(f"{'peak RSS of this process':<34} {peak_mb:>10.0f} MB")
    ok = size < 10e6 and in_report == len(spikes) and rows[1][3] == len(spikes)
    if args.write_docs:
        down = markdown_table(
            ["method", f"ms (median of {args.repeat})", "vs striding", "points", "spikes kept"],
            [
                [n, f"{sec * 1e3:.2f}", f"{sec / base:.0f}x", f"{k:,}", f"{kept}/{len(spikes)}"]
                for n, sec, k, kept in rows
            ],
        )
        report = markdown_table(
            ["build s", "file MB", "of it plotly.js MB", "loss points drawn", "spike steps drawn", "peak RSS MB"],
            [
                [
                    f"{build_s:.2f}",
                    f"{size / 1e6:.2f}",
                    f"{js / 1e6:.2f}",
                    f"{len(drawn):,}",
                    f"{in_report}/{len(spikes)}",
                    f"{peak_mb:.0f}",
                ]
            ],
        )
        write_section(
            "bench_report",
            f"{args.steps:,} steps with tags, {len(spikes)} one-step spikes, each series downsampled to "
            f"{args.points:,} points. {provenance()}\n\n{down}\n\nThe whole report (target: under 10 MB):\n\n"
            f"{report}",
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
