"""Bench: pair retention on a 10M-row plan, against DuckDB SQL over the same Parquet file in the same run.

The plan is the story's fix at the story's scale: ``bucketed_shuffle`` of 1.7M samples for 6 epochs (10.2M rows),
written once to ``bench/out/`` as Parquet (epoch, batch_id, sample_id). Both sides start from that file and produce
the same numbers for every consecutive epoch pair and for first vs last: pair retention (from the counts of
(batch in e, batch in e+1) per sample) and the share of identical batches. Each side runs in a fresh Python process;
its time is the best of ``--repeat`` runs of read + compute, and its memory the process's peak RSS above what it held
after imports (the kernel's peak mark ``VmHWM``, reset after the imports; DuckDB's allocations are invisible to
tracemalloc, so RSS is the common yardstick). DuckDB uses every core it finds; forensics runs on one. The numbers must
agree to 1e-12.

``--calibrate`` prints instead the table behind the gate's default limit (see :mod:`forensics.plan.gate`): for
several dataset sizes and length distributions, the reference retention (length_grouped, seed 0, epochs 0-1), the
derived limit, and the largest retention each builder reaches over ``--seeds`` seeds, with the verdict.

    python3 bench/bench_pair_retention.py                 # 1.7M samples x 6 epochs (10.2M rows)
    python3 bench/bench_pair_retention.py --quick         # 200K samples x 6 epochs
    python3 bench/bench_pair_retention.py --calibrate     # the limit's calibration table, 2K..200K samples
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

OUT = Path(__file__).resolve().parent / "out"

# Competent DuckDB: each sample's first batch per epoch and the batch sizes materialised once, then one join of
# epoch e with e + 1 (and one of the first with the last epoch) grouped by (batch in e, batch in e + 1).
SQL_SETUP = """
CREATE TEMP TABLE first AS
  SELECT epoch, sample_id, min(batch_id) AS b FROM read_parquet('{path}') GROUP BY epoch, sample_id;
CREATE TEMP TABLE sizes AS SELECT epoch, b, count(*) AS n FROM first GROUP BY epoch, b;
"""
SQL_PAIRS = """
WITH joint AS (
  SELECT a.epoch AS earlier, z.epoch AS later, a.b AS ba, z.b AS bz, count(*) AS k
  FROM first a JOIN first z ON z.sample_id = a.sample_id AND {condition}
  GROUP BY a.epoch, z.epoch, a.b, z.b),
scored AS (
  SELECT j.earlier, j.later, sum(j.k * (j.k - 1) // 2) AS retained,
         count(*) FILTER (WHERE j.k = sa.n AND j.k = sz.n AND sz.n >= 2) AS identical
  FROM joint j JOIN sizes sa ON sa.epoch = j.earlier AND sa.b = j.ba
               JOIN sizes sz ON sz.epoch = j.later AND sz.b = j.bz
  GROUP BY j.earlier, j.later),
totals AS (
  SELECT epoch, sum(n * (n - 1) // 2) AS pairs, count(*) FILTER (WHERE n >= 2) AS multi FROM sizes GROUP BY epoch)
SELECT s.earlier, s.later, s.retained / t.pairs, s.identical / t.multi
FROM scored s JOIN totals t ON t.epoch = s.later ORDER BY s.earlier
"""


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> float:
    """Reset the kernel's peak-RSS mark (so the imports' transient peak does not count); the current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_mib("VmRSS")


def peak_rss_mib() -> float:
    return _status_mib("VmHWM")


def make_plan(n_samples: int, epochs: int, seed: int = 0) -> Path:
    """The bench plan (cached in bench/out/): bucketed_shuffle of lognormal lengths, one Parquet file."""
    from forensics.plan.builders import bucketed_shuffle
    from forensics.plan.rebuild import rebuild_plan

    path = OUT / f"plan_{n_samples}x{epochs}_seed{seed}.parquet"
    if path.exists():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    samples = pd.DataFrame(
        {
            "sample_id": np.arange(n_samples, dtype=np.int64) * 7 + 1_000_000,
            "n_tokens": np.clip(rng.lognormal(6.3, 1.0, n_samples).astype(np.int64) + 10, 10, 12_000).astype(np.int32),
        }
    )
    plan = rebuild_plan(samples, bucketed_shuffle, epochs, seed)
    plan.to_parquet(path, index=False)
    return path


def ours(path: Path) -> list[tuple[int, int, float, float]]:
    from forensics.plan.composition import compare_epochs, consecutive_pairs, index_plan

    plan = pd.read_parquet(path, columns=["epoch", "batch_id", "sample_id"])
    m = index_plan(plan)
    pairs = consecutive_pairs(m)
    if len(m.epochs) > 2:
        pairs.append(compare_epochs(m.epochs[0], m.epochs[-1]))
    return [(p.earlier, p.later, p.pair_retention, p.identical_batches) for p in pairs]


def duckdb_sql(path: Path) -> list[tuple[int, int, float, float]]:
    import duckdb

    con = duckdb.connect()
    con.execute(SQL_SETUP.format(path=str(path).replace("'", "''")))
    first, last = con.execute("SELECT min(epoch), max(epoch) FROM sizes").fetchone()
    rows = con.execute(SQL_PAIRS.format(condition="z.epoch = a.epoch + 1")).fetchall()
    if last - first > 1:
        rows += con.execute(SQL_PAIRS.format(condition=f"a.epoch = {first} AND z.epoch = {last}")).fetchall()
    con.close()
    return [(int(a), int(b), float(r), float(i)) for a, b, r, i in rows]


def worker(which: str, path: Path, repeat: int) -> None:
    fn = {"forensics": ours, "duckdb": duckdb_sql}[which]
    if which == "duckdb":
        import duckdb  # noqa: F401  (imported before the baseline RSS is taken)
    import forensics.plan.composition  # noqa: F401

    base = reset_peak_rss()
    best, result = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn(path)
        best = min(best, time.perf_counter() - t)
    print(json.dumps({"seconds": best, "peak_mib": peak_rss_mib() - base, "result": result}))


def run_worker(which: str, path: Path, repeat: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", which, "--plan", str(path), "--repeat", str(repeat)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(args: argparse.Namespace) -> None:
    n = 200_000 if args.quick else args.samples
    console = Console()
    with console.status(f"writing the plan ({n:,} samples x {args.epochs} epochs) to bench/out/"):
        path = make_plan(n, args.epochs)
    rows = pd.read_parquet(path, columns=["epoch"]).shape[0]
    with console.status("measuring forensics and DuckDB"):
        res = {w: run_worker(w, path, args.repeat) for w in ("forensics", "duckdb")}
    a, b = res["forensics"]["result"], res["duckdb"]["result"]
    same = len(a) == len(b) and all(
        x[:2] == y[:2] and abs(x[2] - y[2]) < 1e-12 and abs(x[3] - y[3]) < 1e-12 for x, y in zip(a, b)
    )
    table = Table(
        title=f"pair retention of {rows:,} plan rows ({n:,} samples x {args.epochs} epochs), "
        f"read from Parquet; best of {args.repeat}"
    )
    for col in ("what", "time s", "x DuckDB", "peak RSS MiB"):
        table.add_column(col, justify="left" if col == "what" else "right")
    t_duck = res["duckdb"]["seconds"]
    for w, label in (("forensics", "forensics (numpy, 1 core)"), ("duckdb", "DuckDB SQL (all cores)")):
        r = res[w]
        table.add_row(label, f"{r['seconds']:.2f}", f"{r['seconds'] / t_duck:.2f}", f"{r['peak_mib']:.0f}")
    console.print(table)
    console.print("epoch pairs: " + ", ".join(f"{e}-{f}: {pr:.6f} (identical {ib:.4f})" for e, f, pr, ib in a))
    console.print(f"numbers agree with DuckDB: {'yes' if same else 'NO'}")
    if not same:
        console.print(f"forensics {a}\nduckdb {b}")
        sys.exit(1)


# --- calibration of the default limit ------------------------------------------------------------------------------
def lengths_of(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """The length distributions the limit is calibrated on."""
    if kind == "lognormal":  # a realistic mix, median ~550 tokens, few ties per length
        return np.clip(rng.lognormal(6.3, 1.0, n).astype(int) + 10, 10, 12_000)
    if kind == "bimodal":  # short QA and long code, as in the story
        qa, code = rng.lognormal(5.5, 0.6, n), rng.lognormal(7.8, 0.5, n)
        return np.clip(np.where(rng.random(n) < 0.6, qa, code).astype(int) + 5, 5, 16_000)
    if kind == "short-ties":  # chat turns of 20-600 tokens: every length shared by many samples
        return rng.integers(20, 600, n)
    if kind == "ties64":  # lengths in multiples of 64: the hardest case for a sort to keep pairs together
        return np.clip((rng.lognormal(6.3, 1.0, n) // 64 + 1) * 64, 64, 8192).astype(int)
    raise ValueError(kind)


def finer_buckets(samples: pd.DataFrame, epoch: int, seed: int, **kw) -> list[list[int]]:
    """A legitimate design the gate is strict with: bucketed shuffle over 24 quantile buckets instead of 6."""
    from forensics.plan.builders import bucketed_shuffle, capped_lengths

    q = np.unique(np.quantile(capped_lengths(samples), np.linspace(0, 1, 25)).astype(int))
    bounds = [0] + [int(x) for x in q[1:-1] if x > 0] + [8192]
    return bucketed_shuffle(samples, epoch, seed, boundaries=bounds, **kw)


def group_by_length(samples: pd.DataFrame, epoch: int, seed: int, **kw) -> list[list[int]]:
    """Another: shuffle, cut into mega-batches of 50 x 64 samples, sort each by length, pack (as the
    ``group_by_length`` samplers of common trainers do)."""
    from forensics.plan.builders import capped_lengths, pack_greedy

    rng = np.random.default_rng([seed, epoch])
    lengths = capped_lengths(samples)
    perm = rng.permutation(len(lengths))
    batches = []
    for i in range(0, len(perm), 50 * 64):
        chunk = perm[i : i + 50 * 64]
        batches += pack_greedy(chunk[np.argsort(-lengths[chunk], kind="stable")], lengths)
    ids = samples["sample_id"].to_numpy()
    return [ids[b].tolist() for b in batches]


def calibrate(args: argparse.Namespace) -> None:
    from forensics.plan.builders import REFERENCE_BUILDERS
    from forensics.plan.gate import check_plan
    from forensics.plan.rebuild import rebuild_plan

    builders = dict(REFERENCE_BUILDERS, finer_buckets=finer_buckets, group_by_length=group_by_length)
    short = {
        "static_sorted": "static",
        "shuffle_then_sort": "shuffle+sort",
        "bucketed_shuffle": "bucketed",
        "random_shuffle": "random",
        "finer_buckets": "24 buckets",
        "group_by_length": "group_by_length",
    }
    console = Console(width=180)
    table = Table(
        title=f"largest pair retention over {args.seeds} seeds x 2 epoch pairs, as a multiple of the "
        "reference, and the gate's verdict"
    )
    for col in ("lengths", "samples", "reference", "limit", *(short[b] for b in builders)):
        table.add_column(col, justify="left" if col == "lengths" else "right")
    grid = [(kind, n) for kind in args.kinds for n in args.sizes]
    with Progress(console=Console(stderr=True), transient=True) as progress:
        for kind, n in progress.track(grid, description="building plans"):
            samples = pd.DataFrame(
                {"sample_id": np.arange(n), "n_tokens": lengths_of(kind, n, np.random.default_rng(n)).astype(np.int32)}
            )
            cells, limits = [], []
            for name, builder in builders.items():
                seeds = range(1, 2 if name == "static_sorted" else args.seeds + 1)
                results = [check_plan(rebuild_plan(samples, builder, 3, s), samples) for s in seeds]
                worst = max(max(r.pair_retention) for r in results)
                ref = min(r.threshold.reference_pair_retention for r in results)
                limits += [r.threshold.pair_retention for r in results]
                verdict = "FAIL" if any(r.static for r in results) else "pass"
                cells.append(
                    f"{worst:.4f} {worst / ref:.0f}x {verdict}"
                    if worst / ref >= 10
                    else f"{worst:.4f} {worst / ref:.1f}x {verdict}"
                )
            ref = derive_reference(samples)
            lim = f"{min(limits):.4f}" + (f"-{max(limits):.4f}" if max(limits) > min(limits) * 1.001 else "")
            table.add_row(kind, f"{n:,}", f"{ref:.5f}", lim, *cells)
    console.print(table)
    console.print(
        "reference: length_grouped of the samples, seed 0, epochs 0-1 (batch-size limit 64); the limit "
        "uses the plan's own largest batch and padded size, hence a range"
    )


def derive_reference(samples: pd.DataFrame) -> float:
    from forensics.plan.gate import derive_limits

    return float(derive_limits(samples).reference_pair_retention)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_700_000, help="samples in the plan (default 1,700,000)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs in the plan (default 6)")
    ap.add_argument("--quick", action="store_true", help="200,000 samples")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the best time counts (default 3)")
    ap.add_argument("--calibrate", action="store_true", help="print the calibration table of the default limit")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 10_000, 50_000, 200_000])
    ap.add_argument("--kinds", nargs="+", default=["lognormal", "bimodal", "short-ties", "ties64"])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per builder in --calibrate (default 3)")
    ap.add_argument("--worker", choices=["forensics", "duckdb"], help=argparse.SUPPRESS)
    ap.add_argument("--plan", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.plan, args.repeat)
    elif args.calibrate:
        calibrate(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
