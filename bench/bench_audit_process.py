"""Bench: whole-process audits, against ``losslint check`` and under a loaded machine.

Each measurement is a fresh process (imports, reading, detection, writing), as a user runs it; both sides of a ratio run
in the same bench run, alternated, best of ``--repeat``. ``.pyc`` files are written first (``compileall``) so neither
side pays for compiling its sources, whatever ``PYTHONDONTWRITEBYTECODE`` says; each command runs once untimed first,
so its compiled loops come from their cache, as every run after a user's first does (``bench_cold_start.py`` times
that first run).

1. ``losslint``: a metrics-only audit of a ``--steps``-step JSONL (default 120,000: a decaying loss, grad norm and
   learning rate, Student-t noise, three spikes), JSON out, no report: ``forensics audit --metrics F --json J
   --no-html`` against ``losslint check F --format json`` (``losslint[fast]==0.4.1``, the ``[bench]`` extra: what a
   user who cares about speed installs). Target: the median at most 1.2x losslint's median (the compiled loops loaded
   from numba's own keyed cache; the ahead-of-time module that reached 0.90-0.99x built itself in the background).
2. ``load``: the small demo's audit (``forensics audit CASE --json J --no-html``, plan, samples, text clustering) and
   ``forensics tag CASE``, each 5 times, first on an idle machine and then with one CPU-bound competitor per usable core
   (busy-loop processes this bench starts and stops). Targets under load: the slowest audit at most 4 s, and each
   command's max/min over the 5 runs at most 1.15 times the max/min of a control (a fixed pure-Python loop, timed
   between the command's runs under the same load): a VM's CPU speed drifts with its host's load, and that spread is
   the machine's, not the command's.
3. ``demo``: the full demo's audit with its report (52K steps, 112K samples); target: the median at most 3.5 s.

Every part prints min and median of its runs and its target; every command's import time (``python -X importtime``,
the top-level packages by their cumulative time) and whether it loaded a package the command should not need
(plotly, scikit-learn, torch, streamlit on the metrics-only path).

The case audits run first once (a warm-up), so the timed runs read the text clusters it fitted from the user cache,
as every audit of a case after its first does; a cold row (``FORENSICS_NO_CACHE=1``) times the first audit too.

    python3 bench/bench_audit_process.py                  # all three
    python3 bench/bench_audit_process.py --only losslint  # one part
    python3 bench/bench_audit_process.py --write-docs     # the parts run, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _docs import markdown_table, provenance, write_section

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def write_metrics_jsonl(path: Path, steps: int, seed: int = 0) -> None:
    """An HF-Trainer-like JSONL: step, loss, grad_norm, learning_rate; heavy-tailed noise and three spikes."""
    rng = np.random.default_rng(seed)
    s = np.arange(1, steps + 1)
    loss = 0.9 + 2.0 * np.exp(-s / (steps / 3)) + 0.03 * rng.standard_t(5, steps)
    for at in (steps // 4, steps // 2, 5 * steps // 6):
        loss[at : at + 3] += (3.0, 1.5, 0.5)
    gn = 1.0 + 0.1 * np.abs(rng.standard_normal(steps))
    lr = 3e-4 * np.minimum(1.0, s / 2000) * (0.5 + 0.5 * np.cos(np.pi * s / steps))
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(
            f'{{"step": {a}, "loss": {b!r}, "grad_norm": {c!r}, "learning_rate": {d!r}}}\n'
            for a, b, c, d in zip(s.tolist(), loss.tolist(), gn.tolist(), lr.tolist())
        )


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of one whole process; its failure stops the bench with its stderr."""
    return timed_with_cpu(cmd, env)[0]


def timed_with_cpu(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, its threads included) of one whole process.

    Under load the two part ways: the CPU time is the command's own work, the wall time also the share of the cores
    the scheduler gave it, which is what the spread target measures and what the command controls least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


#: The environment of a cold run: the fitted-cluster cache off, so every run fits the text clusters (the first audit
#: of a case; the timed runs above it read the clusters its warm-up fitted, as every later audit of that case does).
COLD = {**os.environ, "FORENSICS_NO_CACHE": "1"}


#: The machine's own noise floor: a fixed pure-Python loop in a fresh process (about 1 s here), the same work every run,
#: no I/O, no threads. Timed between the command's runs under the same load, its spread is what the machine alone adds
#: (on the 2-core VM this was measured on, 30-50% within a minute, idle or loaded).
CONTROL = [sys.executable, "-c", "x = 0\nfor i in range(6_000_000):\n    x += i"]


def forensics_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "forensics", *args]


def _busy(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


class Competitors:
    """One busy-loop process per usable core, for the 'loaded machine' of the issue."""

    def __init__(self, n: int) -> None:
        self.n, self.stop, self.procs = n, mp.Event(), []

    def __enter__(self) -> Competitors:
        self.procs = [mp.Process(target=_busy, args=(self.stop,), daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(5)


#: Packages a command should not load unless it uses them (the metrics-only audit uses none of them).
HEAVY = ("plotly", "sklearn", "torch", "streamlit", "transformers", "wandb", "tensorboard", "dask", "duckdb")


def import_profile(cmd: list[str], top: int = 6) -> str:
    """One line: the command's total import time and its slowest top-level packages (``-X importtime``), and the
    heavy packages (:data:`HEAVY`) it loaded."""
    done = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True, cwd=ROOT)
    package_time: dict[str, int] = {}  # a package's own import, its subimports included (microseconds)
    total = 0
    loaded: set[str] = set()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or line.count("|") != 2:
            continue
        _, cum, raw = line[len("import time:") :].split("|")
        name = raw.strip()
        if not cum.strip().isdigit():
            continue
        loaded.add(name.split(".")[0])
        if len(raw) - len(raw.lstrip()) == 1:  # imported by the command itself: the sum is the whole import time
            total += int(cum)
        if "." not in name and name != "forensics":
            package_time[name] = max(package_time.get(name, 0), int(cum))
    slowest = sorted(package_time.items(), key=lambda kv: -kv[1])[:top]
    total /= 1e6
    heavy = [h for h in HEAVY if h in loaded]
    return (
        f"imports {total:.2f} s: "
        + ", ".join(f"{k} {v / 1e6:.2f}" for k, v in slowest)
        + f"; heavy packages loaded: {', '.join(heavy) if heavy else 'none'}"
    )


#: One row per measurement (workload, forensics, baseline, ratio, target), for ``--write-docs``.
DOCS_ROWS: list[list[str]] = []

#: The metrics-only audit's median over losslint's, at most.
LOSSLINT_TARGET = 1.2


def bench_losslint(steps: int, repeat: int) -> None:
    if shutil.which("losslint") is None:
        print("losslint: not installed (pip install 'losslint[fast]==0.4.1'); skipped")
        return
    path = OUT / f"metrics-{steps}.jsonl"
    if not path.exists():
        write_metrics_jsonl(path, steps)
    ours = forensics_cmd("audit", "--metrics", str(path), "--json", str(OUT / "audit-metrics-only.json"), "--no-html")
    theirs = ["losslint", "check", str(path), "--format", "json", "--json-out", str(OUT / "losslint.json")]
    timed(ours), timed(theirs)  # warm: numba's cache, the page cache
    a, b = [], []
    for _ in range(repeat):
        a.append(timed(ours))
        b.append(timed(theirs))
    print(f"metrics-only audit of {steps:,} JSONL steps, whole process, {repeat} runs each, alternated:")
    print(f"  forensics audit  min {min(a):6.2f} s   median {statistics.median(a):.2f} s")
    print(f"  losslint check   min {min(b):6.2f} s   median {statistics.median(b):.2f} s")
    ratio = statistics.median(a) / statistics.median(b)
    print(
        f"  ratio of medians {ratio:6.2f}x (min/min {min(a) / min(b):.2f}x); target <= {LOSSLINT_TARGET}x: "
        f"{'met' if ratio <= LOSSLINT_TARGET else 'NOT met'}"
    )
    print(f"  forensics audit {import_profile(ours)}")
    DOCS_ROWS.append(
        [
            f"metrics-only audit of {steps:,} JSONL steps, every rule on, {repeat} runs each, alternated",
            f"min {min(a):.2f} s, median {statistics.median(a):.2f} s",
            f"`losslint check` min {min(b):.2f} s, median {statistics.median(b):.2f} s",
            f"{ratio:.2f}x (min/min {min(a) / min(b):.2f}x)",
            f"<= {LOSSLINT_TARGET}x: {'met' if ratio <= LOSSLINT_TARGET else 'not met'}",
        ]
    )


def ensure_demo(scale: str) -> Path:
    out = OUT / f"demo-{scale}"
    if not (out / "static" / "run.toml").exists():
        subprocess.run(
            forensics_cmd("demo", "--out", str(out), "--scale", scale, "--no-wandb"),
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
    return out


def _spread(xs: list[float]) -> str:
    return (
        f"min {min(xs):5.2f}  median {statistics.median(xs):5.2f}  max {max(xs):5.2f} s  "
        f"spread {max(xs) / min(xs) - 1:5.1%}"
    )


def bench_load(runs: int) -> None:
    from forensics._threads import usable_cores

    demo = ensure_demo("small")
    case = demo / "static"
    audit = forensics_cmd("audit", str(case), "--json", str(OUT / "audit-small.json"), "--no-html")
    tag = forensics_cmd("tag", str(case), "-o", str(OUT / "tags-small.parquet"))
    n = usable_cores()
    timed(audit), timed(tag)
    results = {}
    for label, loaded in (("idle", False), (f"loaded ({n} competitors)", True)):
        for name, cmd in (("audit", audit), ("tag", tag)):
            runs_, control = [], []
            with Competitors(n if loaded else 0):
                for _ in range(runs):
                    runs_.append(timed_with_cpu(cmd))
                    control.append(timed(CONTROL))
            xs, cpu = [w for w, _ in runs_], [c for _, c in runs_]
            results[(label, name)] = xs
            results.setdefault((label, "control"), []).extend(control)
            print(f"small demo {name:5s} {label:24s} {_spread(xs)}")
            print(
                f"  {'':34s} cpu {_spread(cpu)}; share of a core {min(c / w for w, c in runs_):.2f}-"
                f"{max(c / w for w, c in runs_):.2f}"
            )
            print(f"  {'':34s} control (fixed loop, between its runs) {_spread(control)}")
    with Competitors(n):
        cold = [timed(audit, COLD) for _ in range(runs)]
    print(f"small demo audit loaded, cold (FORENSICS_NO_CACHE=1: clusters fitted every run) {_spread(cold)}")
    loaded = f"loaded ({n} competitors)"
    ratio = {name: max(results[(loaded, name)]) / min(results[(loaded, name)]) for name in ("audit", "tag", "control")}
    slowest = max(results[(loaded, "audit")])
    for name in ("audit", "tag"):
        ok = ratio[name] <= 1.15 * ratio["control"]
        print(
            f"  target under load: {name} max/min {ratio[name]:.2f} <= 1.15 x the fixed loop's {ratio['control']:.2f}"
            f" = {1.15 * ratio['control']:.2f}: {'met' if ok else 'NOT met'}"
        )
    print(f"  target under load: slowest audit {slowest:.2f} s <= 4 s: {'met' if slowest <= 4 else 'NOT met'}")
    print(f"  audit {import_profile(audit)}")
    for name in ("audit", "tag"):
        xs = results[(loaded, name)]
        ok = ratio[name] <= 1.15 * ratio["control"] and (name != "audit" or slowest <= 4)
        DOCS_ROWS.append(
            [
                f"small demo `{name}`, {runs} runs, one busy loop per core ({n})",
                f"slowest {max(xs):.2f} s, max/min {ratio[name]:.2f}",
                f"a fixed loop's max/min {ratio['control']:.2f}",
                "",
                ("slowest <= 4 s and " if name == "audit" else "")
                + f"max/min <= 1.15x the loop's: {'met' if ok else 'not met'}",
            ]
        )


def bench_demo(repeat: int) -> None:
    demo = ensure_demo("full")
    case = demo / "static"
    cmd = forensics_cmd("audit", str(case), "--json", str(OUT / "audit-full.json"), "--html", str(OUT / "report.html"))
    timed(cmd)
    xs = [timed(cmd) for _ in range(repeat)]
    print(
        f"full demo audit with its report, clusters cached: {_spread(xs)}; target median <= 3.5 s: "
        f"{'met' if statistics.median(xs) <= 3.5 else 'NOT met'}"
    )
    print(f"  {import_profile(cmd)}")
    cold = [timed(cmd, COLD) for _ in range(repeat)]
    print(f"full demo audit with its report, cold (FORENSICS_NO_CACHE=1): {_spread(cold)}")
    median = statistics.median(xs)
    DOCS_ROWS.append(
        [
            f"full demo audit with its report, clusters cached, {repeat} runs",
            f"median {median:.2f} s (cold, `FORENSICS_NO_CACHE=1`: median {statistics.median(cold):.2f} s)",
            "",
            "",
            f"median <= 3.5 s: {'met' if median <= 3.5 else 'not met'}",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=("losslint", "load", "demo"), default=None)
    ap.add_argument("--steps", type=int, default=120_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--write-docs", action="store_true", help="write the parts run into docs/accuracy.md")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(ROOT / "forensics")],
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
    )
    if args.only in (None, "losslint"):
        bench_losslint(args.steps, args.repeat)
    if args.only in (None, "load"):
        bench_load(args.repeat)
    if args.only in (None, "demo"):
        bench_demo(args.repeat)
    if args.write_docs:
        header = ["workload", "forensics", "baseline", "ratio of medians", "target"]
        write_section("bench_audit_process", f"{provenance()}\n\n{markdown_table(header, DOCS_ROWS)}")


if __name__ == "__main__":
    main()
