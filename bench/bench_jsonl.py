"""JSONL reading speed and peak memory: our reader against ``pyarrow.json.read_json`` (the parse floor).

Writes a JSONL file of ``--rows`` rows (default 1,000,000) with a step and ``--metrics`` float metrics (default
10), then times, on that same file in the same run, ``pyarrow.json.read_json(path)`` (Arrow table only) and
``JsonlReader(path).read_all()`` (the canonical metrics table: pandas, step checked, NaN/inf counted, last write
wins). Each measurement runs in a fresh subprocess so that its peak RSS (``ru_maxrss``) is its own; the best of
``--repeat`` runs is reported. Target: our time within 2x of pyarrow's.

    python bench/bench_jsonl.py                 # 1M rows x 10 metrics
    python bench/bench_jsonl.py --rows 100000   # quick
    python bench/bench_jsonl.py --write-docs    # the table, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _docs import markdown_table, provenance, write_section


def write_jsonl(path: Path, rows: int, metrics: int, seed: int = 0) -> None:
    """A training-log-like file: ``{"step": i, "m0": ..., ...}`` per line, floats at full precision."""
    rng = np.random.default_rng(seed)
    names = [f"train/m{j}" for j in range(metrics)]
    with open(path, "w", encoding="utf-8") as fh:
        for start in range(0, rows, 100_000):
            n = min(100_000, rows - start)
            vals = rng.standard_normal((n, metrics))
            lines = []
            for i in range(n):
                rec = {"step": start + i}
                rec.update(zip(names, vals[i].tolist()))
                lines.append(json.dumps(rec))
            fh.write("\n".join(lines) + "\n")


def worker(kind: str, path: str) -> None:
    """Run one measurement and print JSON: seconds, peak RSS (MiB), rows, columns."""
    t0 = time.perf_counter()
    if kind == "pyarrow":
        import pyarrow.json as pa_json

        table = pa_json.read_json(path)
        rows, cols = table.num_rows, table.num_columns
    else:
        from forensics.sources.jsonl import JsonlReader

        reader = JsonlReader(path)
        reader.finished = True
        df = reader.read_all()
        rows, cols = df.shape
    seconds = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mib": peak_mib, "rows": rows, "columns": cols}))


def baseline_rss() -> float:
    """Peak RSS of a subprocess that only imports what the workers import (subtracted from their peaks)."""
    code = (
        "import resource, pyarrow.json, pandas, forensics.sources.jsonl;"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    return float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)


def measure(kind: str, path: Path, repeat: int) -> dict:
    runs = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, __file__, "--worker", kind, str(path)], check=True, capture_output=True, text=True
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    best["peak_mib"] = min(r["peak_mib"] for r in runs)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--metrics", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--file", type=Path, default=None, help="reuse or keep the JSONL file here")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = args.file or Path(tmp) / "metrics.jsonl"
        if not path.exists():
            t0 = time.perf_counter()
            write_jsonl(path, args.rows, args.metrics)
            print(
                f"wrote {path} ({os.path.getsize(path) / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s",
                file=sys.stderr,
            )
        base = baseline_rss()
        arrow = measure("pyarrow", path, args.repeat)
        ours = measure("ours", path, args.repeat)
        size = os.path.getsize(path) / 2**20
        print(
            f"{args.rows:,} rows x {args.metrics} metrics, {size:.0f} MiB, best of {args.repeat}, "
            f"{os.cpu_count()} CPUs; peak RSS above an import-only process ({base:.0f} MiB)"
        )
        print(f"{'reader':<28}{'seconds':>9}{'MiB/s':>8}{'peak MiB':>10}{'ratio':>7}")
        body = []
        for name, r in (("pyarrow.json.read_json", arrow), ("JsonlReader.read_all", ours)):
            print(
                f"{name:<28}{r['seconds']:>9.2f}{size / r['seconds']:>8.0f}{r['peak_mib'] - base:>10.0f}"
                f"{r['seconds'] / arrow['seconds']:>7.2f}"
            )
            body.append(
                [
                    f"`{name}`",
                    f"{r['seconds']:.2f}",
                    f"{size / r['seconds']:.0f}",
                    f"{r['peak_mib'] - base:.0f}",
                    f"{r['seconds'] / arrow['seconds']:.2f}x",
                    f"{(r['peak_mib'] - base) / (arrow['peak_mib'] - base):.2f}x",
                ]
            )
        assert ours["rows"] == arrow["rows"], (ours, arrow)
        ratio = ours["seconds"] / arrow["seconds"]
        verdict = f"time ratio ours/pyarrow: {ratio:.2f} (target <= 2.0: {'met' if ratio <= 2.0 else 'NOT met'})"
        print(verdict)
        if args.write_docs:
            header = ["reader", "best s", "MiB/s", "peak MiB above imports", "time vs pyarrow", "memory vs pyarrow"]
            write_section(
                "bench_jsonl",
                f"{args.rows:,} rows x {args.metrics} metrics ({size:.0f} MiB), each reader in a fresh process, best "
                f"of {args.repeat}. {provenance()}\n\n{markdown_table(header, body)}\n\nTarget: "
                f"{verdict.split('(target ')[1].rstrip(')')}.",
            )


if __name__ == "__main__":
    main()
