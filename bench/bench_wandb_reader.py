"""``.wandb`` reading speed: :class:`WandbRunReader` against the JSONL reader on the same rows.

Generates once (cached under ``bench/out/``, which git ignores) ``--rows`` rows (default 200,000) of a step and
``--metrics`` float metrics (default 8), logged as a real W&B offline run by the ``wandb`` package (about 5K rows/s,
so the first run of the default size takes a minute or two) and written as a JSONL file with the same values.
Then times, each in a fresh subprocess (so each peak RSS is its own), ``--repeat`` runs each (5), alternated; min and
median are printed, and the target (the ``wandb`` median at most 1.3x the ``jsonl`` median) on the medians:

- ``jsonl``: ``open_reader(metrics.jsonl).read_all()`` (the baseline);
- ``wandb``: ``open_reader(wandb/).read_all()`` (the compiled path: framing, CRC, protobuf wire format, values
  parsed by Arrow, config/summary, the shared reader), its numba machine code loaded before the clock as the
  protobuf module is (``scanner.warm``: a one-time cost per process, not per row);
- ``wandb_first``: the same, the one-time load included (what a process reading one run pays);
- ``framing``: the LevelDB-log framing and CRC alone in Python (``RecordLog.payloads``), and ``protobuf``: framing
  plus ``Record`` parsing, the exact (Python) path's floor, to show what the compiled path replaced.

Both readers must return the same table (checked on a checksum of every value).

    python bench/bench_wandb_reader.py               # 200K rows x 8 metrics
    python bench/bench_wandb_reader.py --quick       # 20K rows
    python bench/bench_wandb_reader.py --write-docs  # the table, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from _docs import markdown_table, provenance, write_section

OUT = Path(__file__).resolve().parent / "out"

WRITER = """
import sys, numpy as np, wandb
out, values_path = sys.argv[1], sys.argv[2]
values = np.load(values_path)
names = [f"train/m{j}" for j in range(values.shape[1])]
run = wandb.init(dir=out, project="bench", id="bench1", settings=wandb.Settings(
    console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True, disable_git=True,
    save_code=False, x_save_requirements=False, disable_job_creation=True))
for i, row in enumerate(values.tolist()):
    run.log(dict(zip(names, row)))
    if (i + 1) % 5000 == 0:
        print(i + 1, flush=True)
run.finish()
"""


def make_values(rows: int, metrics: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, metrics))


def write_jsonl(path: Path, values: np.ndarray) -> None:
    names = [f"train/m{j}" for j in range(values.shape[1])]
    with open(path, "w", encoding="utf-8") as fh:
        for start in range(0, len(values), 50_000):
            chunk = values[start : start + 50_000].tolist()
            fh.write(
                "".join(json.dumps({"step": start + i, **dict(zip(names, row))}) + "\n" for i, row in enumerate(chunk))
            )


def prepare(rows: int, metrics: int) -> Path:
    """The cached inputs for this size: ``wandb/`` (an offline run) and ``metrics.jsonl`` with the same values."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    folder = OUT / f"wandb-bench-{rows}x{metrics}"
    if (folder / "complete").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    values = make_values(rows, metrics)
    np.save(folder / "values.npy", values)
    write_jsonl(folder / "metrics.jsonl", values)
    (folder / "writer.py").write_text(WRITER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(folder / ".config"),
            "WANDB_CACHE_DIR": str(folder / ".cache"),
            "WANDB_DATA_DIR": str(folder / ".data"),
        }
    )
    columns = (TextColumn("writing the .wandb run (once)"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("write", total=rows)
        proc = subprocess.Popen(
            [sys.executable, str(folder / "writer.py"), str(folder), str(folder / "values.npy")],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for line in proc.stdout:
            bar.update(task, completed=int(line))
        if proc.wait() != 0:
            raise SystemExit("the wandb writer failed")
        bar.update(task, completed=rows)
    (folder / "complete").write_text("ok\n")
    return folder


def worker(kind: str, folder: str) -> None:
    """One measurement in this process (imports done before the clock starts); prints JSON: seconds, peak RSS
    (MiB), rows, checksum."""
    import wandb.proto.wandb_internal_pb2  # noqa: F401 - imported by the reader on first use; not what is timed

    from forensics.sources import open_reader
    from forensics.sources.wandb.record_log import RecordLog

    if kind == "wandb":
        from forensics.sources.wandb.scanner import warm

        warm()
    folder_path = Path(folder)
    rows, checksum = 0, 0.0
    t0 = time.perf_counter()
    if kind in ("framing", "protobuf"):
        log = RecordLog(next((folder_path / "wandb").glob("offline-run-*/run-*.wandb")))
        for _ in log.payloads() if kind == "framing" else log.records():
            rows += 1
    else:
        reader = open_reader(folder_path / ("metrics.jsonl" if kind == "jsonl" else "wandb"))
        reader.finished = True
        df = reader.read_all()
        metrics = df[[c for c in df.columns if c.startswith("train/")]]
        rows, checksum = len(df), float(np.nansum(metrics.to_numpy()) + df["step"].sum())
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "seconds": seconds,
                "rows": rows,
                "checksum": checksum,
                "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def measure(kinds: Sequence[str], folder: Path, repeat: int) -> dict[str, list[dict]]:
    """Every kind ``repeat`` times, alternated (a passing load spike hits all alike), each in a fresh process."""
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for _ in range(repeat):
        for kind in kinds:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", kind, str(folder)], check=True, capture_output=True, text=True
            )
            runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20K rows, one repeat")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    if args.quick:
        args.rows, args.repeat = 20_000, 1
    folder = prepare(args.rows, args.metrics)
    size = next((folder / "wandb").glob("offline-run-*/run-*.wandb")).stat().st_size
    kinds = ("jsonl", "wandb", "wandb_first", "protobuf", "framing")
    runs = measure(kinds, folder, args.repeat)
    median = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    jsonl = runs["jsonl"][0]
    for kind in ("wandb", "wandb_first"):
        for wandb in runs[kind]:
            if (jsonl["rows"], round(jsonl["checksum"], 6)) != (wandb["rows"], round(wandb["checksum"], 6)):
                raise SystemExit(f"the readers disagree: jsonl {jsonl}, {kind} {wandb}")
    print(
        f"{args.rows:,} rows x {args.metrics} metrics; .wandb file {size / 2**20:.1f} MiB; {args.repeat} runs each, "
        "alternated"
    )
    print(f"{'reader':<34}{'min s':>8}{'median s':>10}{'rows/s':>12}{'peak MiB':>10}{'vs jsonl':>10}")
    labels = {
        "jsonl": "jsonl (baseline, open_reader)",
        "wandb": "wandb (WandbRunReader)",
        "wandb_first": "  + numba's one-time load",
        "protobuf": "  Python framing + protobuf",
        "framing": "  Python framing + CRC",
    }
    body = []
    for kind, rs in runs.items():
        low = min(r["seconds"] for r in rs)
        peak = max(r["peak_mib"] for r in rs)
        print(
            f"{labels[kind]:<34}{low:>8.2f}{median[kind]:>10.2f}{args.rows / median[kind]:>12,.0f}"
            f"{peak:>10.0f}{median[kind] / median['jsonl']:>9.2f}x"
        )
        body.append(
            [
                labels[kind].strip(),
                f"{low:.2f}",
                f"{median[kind]:.2f}",
                f"{args.rows / median[kind]:,.0f}",
                f"{peak:.0f}",
                f"{median[kind] / median['jsonl']:.2f}x",
            ]
        )
    ratio, first = median["wandb"] / median["jsonl"], median["wandb_first"] / median["jsonl"]
    verdict = (
        f"target: the .wandb reader's median <= 1.3x the JSONL path's: {ratio:.2f}x, "
        f"{'met' if ratio <= 1.3 else 'NOT met'} (with numba's one-time load: {first:.2f}x)"
    )
    print(verdict)
    if args.write_docs:
        header = ["reader", "min s", "median s", "rows/s", "peak MiB", "median vs jsonl"]
        write_section(
            "bench_wandb_reader",
            f"{args.rows:,} rows x {args.metrics} metrics, a {size / 2**20:.0f} MiB `.wandb` file, each reader in a "
            f"fresh process, {args.repeat} runs each, alternated. {provenance()}\n\n"
            f"{markdown_table(header, body)}\n\n{verdict[0].upper() + verdict[1:]}.",
        )


if __name__ == "__main__":
    main()
