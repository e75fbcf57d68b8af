"""Bench: the first audit after an install against the same audit warm.

Cold: the small demo's audit (``forensics audit CASE --json J --no-html``) in a fresh process with an empty user cache
(``FORENSICS_CACHE_DIR`` a new empty folder: no compiled loops, no fitted clusters, no near-duplicate counts). Warm: the
same command run again on that cache. Target: the cold median at most 3x the warm median. The compile's share is
printed from what the command itself says on stderr ("compiled ... in S s"), and ``--long`` adds a metrics-only audit
of 120,000 steps, whose first run compiles the spike kernel (runs under ``forensics.compiled.loops.COMPILE_FROM`` rows
judge with the kernel's plain-Python reference instead).

    python3 bench/bench_cold_start.py            # the small demo, 3 cold and 3 warm runs, alternated
    python3 bench/bench_cold_start.py --long     # and the 120K-step metrics-only audit, cold then warm
    python3 bench/bench_cold_start.py --write-docs  # the table, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _docs import markdown_table, provenance, write_section

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
TARGET = 3.0
#: One row per workload measured, for ``--write-docs``.
DOCS_ROWS: list[list[str]] = []


def run(cmd: list[str], cache: Path) -> tuple[float, float]:
    """Wall seconds of one whole process, and the seconds it said it spent compiling."""
    env = {**os.environ, "FORENSICS_CACHE_DIR": str(cache)}
    env.pop("FORENSICS_COMPILE_FROM", None)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    compiled = sum(float(x) for x in re.findall(r"compiled .* in ([0-9.]+) s", done.stderr))
    return seconds, compiled


def forensics(*args: str) -> list[str]:
    return [sys.executable, "-m", "forensics", *args]


def demo_case() -> Path:
    out = OUT / "demo-small"
    if not (out / "static" / "run.toml").exists():
        subprocess.run(
            forensics("demo", "--out", str(out), "--scale", "small", "--no-wandb"),
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
    return out / "static"


def compare(name: str, cmd: list[str], repeat: int) -> None:
    cold, warm, compile_s = [], [], []
    for _ in range(repeat):
        cache = Path(tempfile.mkdtemp(prefix="forensics-cold-"))
        try:
            seconds, compiled = run(cmd, cache)
            cold.append(seconds)
            compile_s.append(compiled)
            warm.append(run(cmd, cache)[0])
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    ratio = statistics.median(cold) / statistics.median(warm)
    print(f"{name}, {repeat} fresh caches, cold then warm:")
    print(
        f"  cold  min {min(cold):6.2f} s  median {statistics.median(cold):6.2f} s  "
        f"(compiling: median {statistics.median(compile_s):.2f} s, "
        f"{statistics.median(compile_s) / statistics.median(cold):.0%} of the cold run)"
    )
    print(f"  warm  min {min(warm):6.2f} s  median {statistics.median(warm):6.2f} s")
    print(f"  ratio of medians {ratio:.2f}x; target <= {TARGET:.0f}x: {'met' if ratio <= TARGET else 'NOT met'}")
    DOCS_ROWS.append(
        [
            f"{name}, {repeat} fresh caches",
            f"median {statistics.median(cold):.2f} s, {statistics.median(compile_s):.2f} s of it compiling",
            f"median {statistics.median(warm):.2f} s",
            f"{ratio:.2f}x",
            f"<= {TARGET:.0f}x: {'met' if ratio <= TARGET else 'not met'}",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--long", action="store_true", help="also the 120K-step metrics-only audit")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "forensics")],
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
    )
    case = demo_case()
    compare(
        "small demo audit",
        forensics("audit", str(case), "--json", str(OUT / "cold-small.json"), "--no-html"),
        args.repeat,
    )
    if args.long:
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_audit_process import write_metrics_jsonl

        path = OUT / "metrics-120000.jsonl"
        if not path.exists():
            write_metrics_jsonl(path, 120_000)
        compare(
            "metrics-only audit, 120,000 steps",
            forensics("audit", "--metrics", str(path), "--json", str(OUT / "cold-long.json"), "--no-html"),
            1,
        )
    if args.write_docs:
        header = ["audit", "cold (empty caches)", "warm", "ratio of medians", "target"]
        write_section("bench_cold_start", f"{provenance()}\n\n{markdown_table(header, DOCS_ROWS)}")


if __name__ == "__main__":
    main()
