"""Bench: check-plan, tag and audit per engine on synthetic plans of 10M, 30M and 100M rows, time and peak RSS.

The plans (:mod:`fixtures.scale_plan`): 5M samples on 8 ranks with 2 micro-batches per step, the story's bucketed
fix, 2, 6 and 20 epochs (10M, 30M, 100M rows), written once to ``bench/out/scale/`` as the recorder's flat folder;
the smaller plans are the larger one's first epochs (links to its parts), so their verdicts must agree. Each run is
the real command (``python -m forensics check-plan|tag ... --engine E --memory-limit M``) in a fresh process; its
time is wall-clock, its memory the process's peak RSS (``ru_maxrss`` of the child, which is what the machine must
hold, DuckDB's own allocations included; on Dask the local workers are processes of their own, not counted). Ratios
are against the pandas engine in the same run. The audit's case is the plan with a seeded metrics file of 20K steps
(a decaying loss with two spikes, and its grad norm): the plan runs far ahead of the metrics, as a live run's does.

With ``--finished`` the audit's case is a finished run instead: the plan's steps are remapped onto the 20K metrics
steps (``step * 20000 // n_steps``, written once to ``plan-finished-{N}M/``), so the metrics reach the plan's last step
and every logged step holds about N/20K samples: the audit reads every row of the plan, through the engine.

Each engine's outputs are compared with pandas' at the same size (``same``: the gate's JSON, the tag table and the
audit's findings.json equal, exactly), the largest plan's verdict with the smallest plan's pandas verdict
(``verdict``), and the engine ``auto`` picks for each plan under the bench's memory limit is printed (``auto``).

    python3 bench/bench_scale.py                          # 10M and 30M per engine, 100M on DuckDB under 4GB
    python3 bench/bench_scale.py --rows 10 --engines pandas,duckdb
    python3 bench/bench_scale.py --rows 100 --engines duckdb --memory-limit 4GB
    python3 bench/bench_scale.py --rows 10 --engines pandas,duckdb,dask --commands audit
    python3 bench/bench_scale.py --rows 100 --engines duckdb --commands audit --finished

``--write-docs`` writes the table (per plan size and command: each engine's time and peak RSS, and its ratio to
pandas') into docs/accuracy.md between its markers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _docs import markdown_table, provenance, write_section

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out" / "scale"
N_SAMPLES = 5_000_000
EPOCHS_FOR = {10: 2, 30: 6, 100: 20}  # million rows -> epochs of N_SAMPLES
BOUNDARIES = (0, 770, 1216, 1728, 2432, 3296, 8192)  # the story's (fixtures.scale_plan.BOUNDARIES)
AUDIT_STEPS = 20_000
COMMANDS = ("check-plan", "tag", "audit")


def build(max_epochs: int) -> Path:
    """The full plan (once) and the samples; returns the folder of the full plan."""
    sys.path.insert(0, str(ROOT))
    from fixtures.scale_plan import synthetic_samples, write_plan

    OUT.mkdir(parents=True, exist_ok=True)
    samples_path = OUT / "samples.parquet"
    full = OUT / f"plan-{max_epochs}ep"
    marker = full / ".complete"
    if not samples_path.exists():
        synthetic_samples(N_SAMPLES).to_parquet(samples_path, index=False)
    if not marker.exists():
        import pandas as pd

        t0 = time.perf_counter()
        write_plan(pd.read_parquet(samples_path), full, max_epochs, "flat")
        marker.write_text("")
        print(f"wrote {full} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return full


def audit_case(plan: Path, size: int, label: str = "") -> Path:
    """A case folder for the audit: the plan and samples where they lie, and the seeded 20K-step metrics."""
    import numpy as np
    import pandas as pd

    metrics = OUT / "metrics-20k.parquet"
    if not metrics.exists():
        rng = np.random.default_rng(20)
        step = np.arange(AUDIT_STEPS, dtype=np.int64)
        loss = 1.2 + 2.0 * np.exp(-step / 3000) + rng.normal(0, 0.01, AUDIT_STEPS)
        grad = 0.8 + 0.05 * rng.standard_normal(AUDIT_STEPS)
        for at in (7_000, 15_000):
            loss[at] *= 3.0
            grad[at] *= 6.0
        pd.DataFrame({"step": step, "loss": loss, "grad_norm": grad}).to_parquet(metrics, index=False)
    case = OUT / f"case-{size}M{label}"
    case.mkdir(exist_ok=True)
    (case / "run.toml").write_text(
        f"metrics = [{json.dumps(str(metrics))}]\nplan = {json.dumps(str(plan))}\n"
        f"samples = {json.dumps(str(OUT / 'samples.parquet'))}\n"
        f"boundaries = {list(BOUNDARIES)}\ntoken_budget = 16384\nmax_len = 8192\n"
    )
    return case


def finished_plan(plan: Path, size: int) -> Path:
    """The plan with its steps remapped onto the metrics' :data:`AUDIT_STEPS` steps (written once, by DuckDB)."""
    import duckdb

    out = OUT / f"plan-finished-{size}M"
    marker = out / ".complete"
    if not marker.exists():
        files = f"'{plan}/*.parquet'"
        con = duckdb.connect()
        (last,) = con.execute(f"SELECT max(step) FROM read_parquet({files})").fetchone()
        out.mkdir(parents=True, exist_ok=True)
        con.execute(
            f"COPY (SELECT * REPLACE (CAST(step * {AUDIT_STEPS} // {last + 1} AS BIGINT) AS step) "
            f"FROM read_parquet({files})) TO '{out}/part.parquet' (FORMAT PARQUET)"
        )
        marker.write_text("")
    return out


def prefix(full: Path, epochs: int) -> Path:
    sys.path.insert(0, str(ROOT))
    from fixtures.scale_plan import prefix_folder

    return prefix_folder(full, OUT / f"plan-first-{epochs}ep", epochs)


def run(cmd: list[str]) -> dict:
    """One command in a fresh process: exit code, wall seconds, peak RSS (GB)."""
    import tempfile

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty command never blocks on it
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        log.seek(0)
        err = log.read()
    rc = os.waitstatus_to_exitcode(status)
    return {
        "rc": rc,
        "s": round(wall, 2),
        "rss_gb": round(usage.ru_maxrss / 2**20, 2),
        "err": err.strip().splitlines()[-1] if rc not in (0, 1) and err.strip() else "",
    }


def outputs_equal(size: int, engine: str, command: str, label: str = "") -> bool | None:
    """Whether an engine's gate JSON (check-plan), tag table (tag) or findings.json (audit) is exactly pandas' at the
    same size (None: an output is missing: pandas not run at that size, or a run failed)."""
    import pyarrow.parquet as pq

    name = {
        "check-plan": "gate-{size}M-{engine}.json",
        "tag": "tags-{size}M-{engine}.parquet",
        "audit": "findings-{size}M-{engine}" + label + ".json",
    }[command]
    ours, ref = (OUT / name.format(size=size, engine=e) for e in (engine, "pandas"))
    if not (ours.exists() and ref.exists()):
        return None
    if command != "tag":
        return json.loads(ours.read_text()) == json.loads(ref.read_text())
    return pq.read_table(ours).equals(pq.read_table(ref))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="10,30,100", help="plan sizes in million rows (10, 30, 100)")
    ap.add_argument("--engines", default="pandas,duckdb", help="engines to run (pandas, duckdb, dask)")
    ap.add_argument("--memory-limit", default="4GB", help="--memory-limit of every run")
    ap.add_argument("--commands", default=",".join(COMMANDS), help="commands to run (check-plan, tag, audit)")
    ap.add_argument("--pandas-max", type=int, default=30, help="largest plan (M rows) the pandas engine runs")
    ap.add_argument(
        "--finished",
        action="store_true",
        help="audit a finished run: the plan's steps remapped so the metrics reach its last step",
    )
    ap.add_argument("--json", default=str(OUT / "bench_scale.json"))
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    args = ap.parse_args()
    sizes = [int(x) for x in args.rows.split(",")]
    full = build(max(EPOCHS_FOR[s] for s in sizes))
    samples = OUT / "samples.parquet"
    results = []
    label = "-finished" if args.finished else ""
    from forensics.engine import choose_engine

    for size in sizes:
        plan = prefix(full, EPOCHS_FOR[size]) if EPOCHS_FOR[size] < max(EPOCHS_FOR[s] for s in sizes) else full
        print(json.dumps({"rows_M": size, "auto": choose_engine("auto", plan, args.memory_limit)}), flush=True)
        for engine in args.engines.split(","):
            if engine == "pandas" and size > args.pandas_max:
                continue
            base = [
                "--plan",
                str(plan),
                "--samples",
                str(samples),
                "--engine",
                engine,
                "--memory-limit",
                args.memory_limit,
            ]
            gate_json = OUT / f"gate-{size}M-{engine}.json"
            commands = {
                "check-plan": ["check-plan", *base, "--json", str(gate_json)],
                "tag": [
                    "tag",
                    *base,
                    "--boundaries",
                    ",".join(map(str, BOUNDARIES)),
                    "-o",
                    str(OUT / f"tags-{size}M-{engine}.parquet"),
                ],
                "audit": [
                    "audit",
                    "AUDIT-CASE",
                    "--engine",
                    engine,
                    "--memory-limit",
                    args.memory_limit,
                    "--no-html",
                    "--json",
                    str(OUT / f"findings-{size}M-{engine}{label}.json"),
                ],
            }
            outputs = {
                "check-plan": gate_json,
                "tag": OUT / f"tags-{size}M-{engine}.parquet",
                "audit": OUT / f"findings-{size}M-{engine}{label}.json",
            }
            for what in args.commands.split(","):
                cmd = commands[what]
                if what == "audit":  # the case is built only when the audit runs
                    audited = finished_plan(plan, size) if args.finished else plan
                    cmd[1] = str(audit_case(audited, size, label))
                outputs[what].unlink(missing_ok=True)  # a failed run must not be judged by an older run's output
                r = run([sys.executable, "-m", "forensics", *cmd])
                if what == "check-plan" and gate_json.exists() and r["rc"] in (0, 1):
                    r["passed"] = json.loads(gate_json.read_text())["passed"]
                row = {"rows_M": size, "engine": engine, "command": what + (label if what == "audit" else ""), **r}
                results.append(row)
                print(json.dumps(row), flush=True)
    for row in results:  # ratios against pandas at the same size and command
        ref = next(
            (
                r
                for r in results
                if r["engine"] == "pandas" and r["rows_M"] == row["rows_M"] and r["command"] == row["command"]
            ),
            None,
        )
        if ref and ref["s"]:
            row["time_vs_pandas"] = round(row["s"] / ref["s"], 2)
            row["rss_vs_pandas"] = round(row["rss_gb"] / ref["rss_gb"], 2)
        if row["engine"] != "pandas":
            row["same"] = outputs_equal(row["rows_M"], row["engine"], row["command"].removesuffix(label), label)
    smallest = next((r for r in results if r["engine"] == "pandas" and r["command"] == "check-plan"), None)
    for row in results:
        if smallest and row["command"] == "check-plan" and row["rows_M"] == max(sizes) and "passed" in row:
            row["verdict"] = "same" if row["passed"] == smallest.get("passed") else "differs"
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"{'rows':>5} {'engine':8} {'command':11} {'s':>8} {'RSS GB':>7} {'t/pd':>5} {'rss/pd':>6} passed same verdict"
    )
    for r in results:
        print(
            f"{r['rows_M']:>4}M {r['engine']:8} {r['command']:11} {r['s']:8.1f} {r['rss_gb']:7.2f} "
            f"{r.get('time_vs_pandas', ''):>5} {r.get('rss_vs_pandas', ''):>6} {str(r.get('passed', '')):>6} "
            f"{str(r.get('same', '')):>5} {r.get('verdict', '')} {r['err']}"
        )
    if args.write_docs:
        write_section("bench_scale", docs_table(results, args.engines.split(","), args.memory_limit))


def docs_table(results: list[dict], engines: list[str], memory_limit: str) -> str:
    """The docs' table: per plan size and command, each engine's time and peak RSS, and its ratios to pandas'."""
    names = {"pandas": "pandas", "duckdb": "DuckDB", "dask": "Dask"}
    others = [e for e in engines if e != "pandas"]
    header = ["plan rows", "command", *(names.get(e, e) for e in engines)]
    header += [f"{names.get(e, e)} / pandas (time, peak RSS)" for e in others if "pandas" in engines]
    body = []
    for key in dict.fromkeys((r["rows_M"], r["command"]) for r in results):
        of = {r["engine"]: r for r in results if (r["rows_M"], r["command"]) == key}
        cells = [f"{key[0]}M", key[1]]
        for e in engines:
            r = of.get(e)
            if r is None:
                cells.append("not run")
            else:
                failed = "" if r["rc"] in (0, 1) else " (failed)"
                cells.append(f"{r['s']:.1f} s, {r['rss_gb']:.2f} GB{failed}")
        if "pandas" in engines:
            for e in others:
                r = of.get(e, {})
                cells.append(f"{r['time_vs_pandas']:.2f}x, {r['rss_vs_pandas']:.2f}x" if "time_vs_pandas" in r else "")
        body.append(cells)
    same = [r for r in results if r.get("same") is not None]
    differ = [f"{r['rows_M']}M {r['command']} on {names.get(r['engine'], r['engine'])}" for r in same if not r["same"]]
    agree = ""
    if same:
        agree = (
            f" Outputs that differ from pandas': {', '.join(differ)}." if differ else " Every output equals pandas'."
        )
    return (
        f"`--memory-limit {memory_limit}`; time is wall-clock, memory the process's peak RSS. {provenance()}{agree}"
        f"\n\n{markdown_table(header, body)}"
    )


if __name__ == "__main__":
    main()
