"""Benchmark the dashboard on a long live run: first render, a refresh of new rows, and the bytes of figures sent.

A synthetic case (default 1M steps, 4 samples per step: a plan of 4M rows, samples with their clusters, metrics as a
JSONL log the way a run writes it, one-step loss spikes in long-sequence batches) is written once to ``bench/out/``.
Measured in one run, through streamlit's AppTest (the real script, the real fragment, no browser):

- **nothing computed**: the first render of the case without ``findings.json``: the dashboard runs the audit.
- **precomputed**: that audit's ``findings.json`` written into the case: the first render (target < 3 s), then a
  refresh after 1,000 rows were appended to the log (target < 0.5 s; median of ``--refreshes``), then the bytes of
  the figures each view sends to the browser (target < 5 MB for the run view).

Usage: ``python bench/bench_dashboard.py [--steps N] [--refreshes R] [--rows-per-refresh K] [--quick]``
(set OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1 on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BOUNDARIES = [0, 770, 1216, 1728, 2432, 3296, 8192]
NAMES = [
    "qa what how",
    "chat hello thanks",
    "docs api function",
    "code def return",
    "code class import",
    "math solve equation",
]
PER_STEP = 4


def write_case(folder: Path, n_steps: int, n_spikes: int = 20, seed: int = 0) -> list[str]:
    """A case folder with ``n_steps`` steps; returns the metrics lines not yet written (the live tail)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    n_samples = 200_000
    bucket_of = rng.integers(0, len(BOUNDARIES) - 1, n_samples)
    lo = np.array(BOUNDARIES[:-1])[bucket_of] + 1
    hi = np.array(BOUNDARIES[1:])[bucket_of]
    n_tokens = rng.integers(lo, hi + 1).astype(np.int32)
    samples = pd.DataFrame(
        {
            "sample_id": np.arange(n_samples, dtype=np.int64),
            "n_tokens": n_tokens,
            "text": [f"{NAMES[b]} sample {i}" for i, b in enumerate(bucket_of)],
            "cluster": bucket_of.astype(np.int64),
            "cluster_name": pd.array([NAMES[b] for b in bucket_of], dtype="string"),
        }
    )
    samples.to_parquet(folder / "samples.parquet", index=False)
    # each step draws its 4 samples from one bucket (the story's homogeneous batches)
    by_bucket = [np.flatnonzero(bucket_of == b) for b in range(len(BOUNDARIES) - 1)]
    step_bucket = rng.integers(0, len(by_bucket), n_steps)
    ids = np.empty((n_steps, PER_STEP), np.int64)
    for b, pool in enumerate(by_bucket):
        rows = np.flatnonzero(step_bucket == b)
        ids[rows] = pool[rng.integers(0, len(pool), (len(rows), PER_STEP))]
    steps = np.arange(n_steps, dtype=np.int64)
    epochs = 6
    plan = pd.DataFrame(
        {
            "step": np.repeat(steps, PER_STEP),
            "sample_id": ids.ravel(),
            "epoch": np.repeat(steps * epochs // n_steps, PER_STEP),
        }
    )
    plan.to_parquet(folder / "plan.parquet", index=False)
    loss = (
        0.9 + 2.5 * np.exp(-steps / max(1.0, n_steps / 200)) + 0.06 * step_bucket + 0.03 * rng.standard_normal(n_steps)
    )
    spikes = np.sort(rng.choice(np.arange(n_steps // 20, n_steps - n_steps // 20), n_spikes, replace=False))
    spikes = spikes[step_bucket[spikes] == 5] if (step_bucket[spikes] == 5).any() else spikes
    loss[spikes] = 4.0 + rng.random(len(spikes))
    grad = 1.0 + 0.1 * rng.standard_normal(n_steps)
    grad[spikes] *= 4
    lr = np.minimum(1.0, (steps + 1) / 2000) * 3e-4
    ts = 1.7e9 + steps * 0.5
    lines = [
        json.dumps(
            {"step": int(s), "train/loss": float(a), "grad_norm": float(g), "lr": float(r), "_timestamp": float(t)}
        )
        + "\n"
        for s, a, g, r, t in zip(steps, loss, grad, lr, ts)
    ]
    (folder / "run.toml").write_text(
        'metrics = ["metrics.jsonl"]\nplan = "plan.parquet"\nsamples = "samples.parquet"\nloss_key = "train/loss"\n'
        f"boundaries = {BOUNDARIES}\n"
    )
    return lines


def app_test(case: Path):
    from streamlit.testing.v1 import AppTest

    from forensics.dashboard.session import TARGET

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=1800)
    at.session_state[TARGET] = [str(case)]
    return at


CPU: list[float] = []


def timed_run(at) -> float:
    """Wall seconds of one script run; its process CPU seconds go to ``CPU`` (less sensitive to a shared machine)."""
    t, c = time.perf_counter(), time.process_time()
    at.run()
    dt = time.perf_counter() - t
    CPU.append(time.process_time() - c)
    if at.exception:
        raise SystemExit(f"the app raised: {at.exception}")
    return dt


def figure_bytes(at) -> int:
    return sum(len(el.proto.spec.encode()) for el in at.get("plotly_chart"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--refreshes", type=int, default=5)
    ap.add_argument("--rows-per-refresh", type=int, default=1000)
    ap.add_argument("--quick", action="store_true", help="100,000 steps, 3 refreshes")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep the case and findings.json of an earlier run; measure the precomputed part only",
    )
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if args.quick:
        args.steps, args.refreshes = 100_000, 3
    live_rows = args.refreshes * args.rows_per_refresh
    out = ROOT / "bench" / "out" / f"dashboard-{args.steps}"
    os.environ.setdefault("FORENSICS_CACHE_DIR", str(ROOT / "bench" / "out" / "dashboard-cache"))
    t = time.perf_counter()
    from forensics.live import tables as state

    reuse = args.reuse and (out / "findings.json").exists()
    if reuse:
        lines = (out / "all.jsonl").read_text().splitlines(keepends=True)
        head, tail = lines[: len(lines) - live_rows], lines[len(lines) - live_rows :]
        (out / "metrics.jsonl").write_text("".join(head))
        print(f"case reused: {out}")
    else:
        if out.exists():
            shutil.rmtree(out)
        lines = write_case(out, args.steps)
        (out / "all.jsonl").write_text("".join(lines))
        head, tail = lines[: len(lines) - live_rows], lines[len(lines) - live_rows :]
        (out / "metrics.jsonl").write_text("".join(head))
        print(
            f"case: {args.steps:,} steps, {args.steps * PER_STEP:,} plan rows, 200,000 samples "
            f"({time.perf_counter() - t:.1f} s to write) in {out}"
        )

        # 1. nothing computed: the dashboard audits the run at start
        at = app_test(out)
        first_cold = timed_run(at)
        run = at.session_state["forensics_run"]
        n_spikes = len(run.findings.get("spikes") or [])
        print(
            f"first render, nothing computed (the audit runs): {first_cold:.2f} s (CPU {CPU[-1]:.2f} s); "
            f"{n_spikes} spikes found"
        )
        # 2. precomputed: findings.json of that audit in the case; a new session
        (out / "findings.json").write_text(json.dumps(run.findings, allow_nan=False))
        state._AUDITS.clear()
    at = app_test(out)
    first = timed_run(at)
    print(f"first render, findings precomputed: {first:.2f} s (CPU {CPU[-1]:.2f} s; target < 3 s)")
    sent = {"Run": figure_bytes(at)}
    refresh = []
    n_cpu = len(CPU)
    with (out / "metrics.jsonl").open("a") as fh:
        for r in range(args.refreshes):
            fh.write("".join(tail[r * args.rows_per_refresh : (r + 1) * args.rows_per_refresh]))
            fh.flush()
            refresh.append(timed_run(at))
    run = at.session_state["forensics_run"]
    assert int(run.metrics["step"].iloc[-1]) == args.steps - 1, "the refreshes did not read every appended row"
    refresh_cpu = CPU[n_cpu:]
    idle = timed_run(at)
    print(
        f"refresh of {args.rows_per_refresh:,} new rows: median {statistics.median(refresh):.3f} s "
        f"(CPU {statistics.median(refresh_cpu):.3f} s; min {min(refresh):.3f}, max {max(refresh):.3f}; "
        f"target < 0.5 s); with nothing new {idle:.3f} s"
    )
    for view in ("Buckets & clusters", "Composition", "Causes", "Step inspector"):
        at.radio(key="view").set_value(view)
        dt = timed_run(at)
        sent[view] = figure_bytes(at)
        print(f"  view {view!r}: {dt:.2f} s to draw (CPU {CPU[-1]:.2f} s)")
    print(
        "figure bytes sent per view: "
        + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sent.items())
        + " (target < 5 MB)"
    )


if __name__ == "__main__":
    main()
