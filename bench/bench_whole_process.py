"""Whole-process timings of ``forensics ingest`` and ``forensics check-plan`` against their named baselines.

Each side is a fresh ``python3`` subprocess timed from the outside (start-up, imports, reading, computing, writing
and exit all count), ``--repeat`` runs a side (5), both sides measured in the same run, alternating; each side's
min and median are printed, and the target is on the ratio of medians:

- **ingest**: ``python3 -m forensics ingest metrics.jsonl -o metrics.parquet`` against a Python process that does
  ``pyarrow.json.read_json`` plus ``pyarrow.parquet.write_table`` of the same file (target: at most 1.1x). The file:
  ``--rows`` rows (default 1,000,000) of a step and ``--metrics`` float metrics (default 10), as ``bench_jsonl.py``
  writes it.
- **check-plan**: ``python3 -m forensics check-plan CASE --json F`` on a case folder holding only ``plan.parquet``
  (the plan of ``bench_pair_retention.py``: ``bucketed_shuffle`` of 1.7M samples x 6 epochs, 10.2M rows) against a
  Python process running ``bench_pair_retention.py``'s DuckDB SQL over the same file (pair retention and identical
  batches for each consecutive epoch pair and first vs last) and writing them as JSON (target: at most 0.8x).
  Both sides' numbers must agree to 1e-12.

Inputs are written once to ``bench/out/`` (git ignores it). The forensics side imports the package this script
belongs to (``PYTHONPATH`` is set to its checkout); run ``python3 -m compileall -q forensics`` first, as an installed
package has its ``.pyc`` files (this script does it for you unless ``--no-compile``).

    python3 bench/bench_whole_process.py                  # both, full size, 5 runs a side
    python3 bench/bench_whole_process.py --only ingest --repeat 3
    python3 bench/bench_whole_process.py --quick          # 100K JSONL rows, 200K-sample plan
    python3 bench/bench_whole_process.py --write-docs     # the table, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT / "bench"))

from _docs import markdown_table, provenance, write_section  # noqa: E402

PYARROW_INGEST = """
import sys
import pyarrow.json as pa_json
import pyarrow.parquet as pq
table = pa_json.read_json(sys.argv[1])
pq.write_table(table, sys.argv[2])
print(table.num_rows)
"""

# The SQL is pasted in (not imported from bench_pair_retention, which would import numpy and pandas): the
# baseline process imports duckdb and json only.
DUCKDB_RETENTION = """
import json, sys
import duckdb
SQL_SETUP, SQL_PAIRS = {setup!r}, {pairs!r}
path, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute(SQL_SETUP.format(path=path.replace("'", "''")))
first, last = con.execute("SELECT min(epoch), max(epoch) FROM sizes").fetchone()
rows = con.execute(SQL_PAIRS.format(condition="z.epoch = a.epoch + 1")).fetchall()
if last - first > 1:
    rows += con.execute(SQL_PAIRS.format(condition=f"a.epoch = {first} AND z.epoch = {last}")).fetchall()
with open(out, "w") as fh:
    json.dump([[int(a), int(b), float(r), float(i)] for a, b, r, i in rows], fh)
"""


def duckdb_script() -> str:
    from bench_pair_retention import SQL_PAIRS, SQL_SETUP

    return DUCKDB_RETENTION.replace("{setup!r}", repr(SQL_SETUP)).replace("{pairs!r}", repr(SQL_PAIRS))


def env(root: Path = ROOT) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(root) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.pop("PYTHONDONTWRITEBYTECODE", None)
    return e


def timed(cmd: list[str], ok=(0,)) -> float:
    root = ROOT
    if cmd[0] == "BEFORE":
        root, cmd = Path(cmd[1]), cmd[2:]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env(root), capture_output=True, text=True, cwd=ROOT / "bench")
    seconds = time.perf_counter() - t0
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return seconds


def alternated(sides: dict[str, list[str]], repeat: int, ok=(0,)) -> dict[str, list[float]]:
    """Alternate the sides so that a passing load spike hits both alike."""
    runs: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(repeat):
        for name, cmd in sides.items():
            runs[name].append(timed(cmd, ok))
    return runs


#: One row per workload measured, for ``--write-docs``.
DOCS_ROWS: list[list[str]] = []


def report(title: str, runs: dict[str, list[float]], ours: str, base: str, target: float, cmp: str) -> None:
    """Min and median of each side; the target is on the ratio of medians (min/min printed beside it)."""
    print(title)
    t_base = statistics.median(runs[base])
    print(f"  {'side':<44}{'min s':>8}{'median s':>10}{'ratio':>7}")
    for name in (base, ours):
        print(
            f"  {name:<44}{min(runs[name]):>8.2f}{statistics.median(runs[name]):>10.2f}"
            f"{statistics.median(runs[name]) / t_base:>7.2f}"
        )
    ratio = statistics.median(runs[ours]) / t_base
    ok = ratio <= target if cmp == "<=" else ratio < target
    print(
        f"  ratio of medians forensics / baseline: {ratio:.2f} (min/min {min(runs[ours]) / min(runs[base]):.2f}); "
        f"target {cmp} {target}: {'met' if ok else 'NOT met'}"
    )
    DOCS_ROWS.append(
        [
            title,
            f"{min(runs[ours]):.2f} / {statistics.median(runs[ours]):.2f}",
            f"{base}: {min(runs[base]):.2f} / {t_base:.2f}",
            f"{ratio:.2f}x ({min(runs[ours]) / min(runs[base]):.2f}x)",
            f"{cmp} {target}x: {'met' if ok else 'not met'}",
        ]
    )


def bench_ingest(args: argparse.Namespace, tmp: Path) -> None:
    from bench_jsonl import write_jsonl

    rows = 100_000 if args.quick else args.rows
    path = OUT / f"whole_metrics_{rows}x{args.metrics}.jsonl"
    if not path.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"writing {path.name} (once)", file=sys.stderr)
        write_jsonl(path, rows, args.metrics)
    ours_out, base_out = tmp / "ours.parquet", tmp / "pyarrow.parquet"
    sides = {
        "pyarrow.json.read_json + pq.write_table": [sys.executable, "-c", PYARROW_INGEST, str(path), str(base_out)],
        "forensics ingest": [sys.executable, "-m", "forensics", "ingest", str(path), "-o", str(ours_out)],
    }
    if args.before:
        sides["forensics ingest, before"] = (
            ["BEFORE", str(args.before)] + sides["forensics ingest"][:-2] + ["-o", str(tmp / "before.parquet")]
        )
    runs = alternated(sides, args.repeat)
    import pyarrow.parquet as pq

    ours_t, base_t = pq.read_table(ours_out), pq.read_table(base_out)
    assert ours_t.num_rows == base_t.num_rows == rows, (ours_t.num_rows, base_t.num_rows)
    size = path.stat().st_size / 2**20
    report(
        f"ingest: {rows:,} rows x {args.metrics} metrics JSONL ({size:.0f} MiB), whole process, "
        f"{args.repeat} runs, {os.cpu_count()} CPUs",
        runs,
        "forensics ingest",
        "pyarrow.json.read_json + pq.write_table",
        1.1,
        "<=",
    )
    if args.before:
        report_before(runs, "forensics ingest", "forensics ingest, before", "pyarrow.json.read_json + pq.write_table")


def report_before(runs: dict[str, list[float]], ours: str, before: str, base: str) -> None:
    """The same command from another checkout (``--before``), measured in the same run."""
    b, o, t = min(runs[before]), min(runs[ours]), min(runs[base])
    print(f"  before ({before}): best {b:.2f} s, {b / t:.2f} x the baseline; now {o:.2f} s: {b / o:.2f} x faster")


def bench_check_plan(args: argparse.Namespace, tmp: Path) -> None:
    from bench_pair_retention import make_plan

    n = 200_000 if args.quick else args.samples
    print(f"preparing the plan ({n:,} samples x {args.epochs} epochs, once)", file=sys.stderr)
    plan = make_plan(n, args.epochs)
    case = OUT / f"whole_case_{plan.stem}"
    case.mkdir(parents=True, exist_ok=True)
    link = case / "plan.parquet"
    if not link.exists():
        os.symlink(plan, link)
    ours_json, duck_json = tmp / "check.json", tmp / "duckdb.json"
    sides = {
        "DuckDB SQL script (read + retention, JSON)": [
            sys.executable,
            "-c",
            duckdb_script(),
            str(plan),
            str(duck_json),
        ],
        "forensics check-plan CASE --json": [
            sys.executable,
            "-m",
            "forensics",
            "check-plan",
            str(case),
            "--json",
            str(ours_json),
        ],
    }
    if args.before:
        sides["forensics check-plan, before"] = (
            ["BEFORE", str(args.before)] + sides["forensics check-plan CASE --json"][:-1] + [str(tmp / "before.json")]
        )
    runs = alternated(sides, args.repeat, ok=(0, 1))
    ours = json.loads(ours_json.read_text())
    duck = json.loads(duck_json.read_text())
    mine = list(zip(ours["pair_retention"], ours["identical_batches"]))
    mine.append((ours["pair_retention_first_last"], ours["identical_batches_first_last"]))
    same = len(mine) == len(duck) and all(
        abs(a - c) < 1e-12 and abs(b - d) < 1e-12 for (a, b), (_, _, c, d) in zip(mine, duck)
    )
    import pyarrow.parquet as pq

    n_rows = pq.ParquetFile(plan).metadata.num_rows
    report(
        f"check-plan: {n_rows:,} plan rows ({n:,} samples x {args.epochs} epochs), whole process, "
        f"{args.repeat} runs, {os.cpu_count()} CPUs",
        runs,
        "forensics check-plan CASE --json",
        "DuckDB SQL script (read + retention, JSON)",
        0.8,
        "<=",
    )
    if args.before:
        report_before(
            runs,
            "forensics check-plan CASE --json",
            "forensics check-plan, before",
            "DuckDB SQL script (read + retention, JSON)",
        )
    print(f"  numbers agree with DuckDB: {'yes' if same else 'NO'}")
    if not same:
        print(f"  forensics {mine}\n  duckdb {duck}")
        sys.exit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["ingest", "check-plan"], default=None)
    ap.add_argument("--repeat", type=int, default=5, help="runs per side (default 5)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="JSONL rows for ingest (default 1,000,000)")
    ap.add_argument("--metrics", type=int, default=10, help="metrics per JSONL row (default 10)")
    ap.add_argument("--samples", type=int, default=1_700_000, help="samples in the plan (default 1,700,000)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs in the plan (default 6)")
    ap.add_argument("--quick", action="store_true", help="100K JSONL rows and a 200K-sample plan")
    ap.add_argument("--no-compile", action="store_true", help="do not byte-compile forensics/ first")
    ap.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="CHECKOUT",
        help="also time the same command from another checkout (e.g. the base commit), same run",
    )
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    args = ap.parse_args()
    if not args.no_compile:
        for root in [ROOT] + ([args.before] if args.before else []):
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "forensics")], check=True, env=env())
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "ingest"):
            bench_ingest(args, Path(tmp))
        if args.only in (None, "check-plan"):
            bench_check_plan(args, Path(tmp))
    if args.write_docs:
        header = ["workload", "forensics, min / median s", "baseline, min / median s", "ratio of medians (min/min)"]
        write_section("bench_whole_process", f"{provenance()}\n\n{markdown_table([*header, 'target'], DOCS_ROWS)}")


if __name__ == "__main__":
    main()
