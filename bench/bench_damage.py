"""Damaged run files: rows kept and wrong values after random single-bit flips, before and after; reader speed.

Before = the readers of ``--baseline`` (default ``3dba1fc``, main before the damage checks: TensorBoard checksums not
checked,
``.wandb`` reading stopped at the first damage), extracted with ``git archive`` under ``bench/out/`` (git ignores
it). After = this working tree. Each side runs in its own subprocess (``PYTHONPATH`` = that tree).

1. Rows kept: a TensorBoard file (torch's ``SummaryWriter``) and a ``.wandb`` file (``wandb`` offline) of
   ``--steps`` logged steps (default 400; ``train/loss``, ``grad_norm``, ``lr`` per step), written once and cached.
   ``--trials`` (default 25) seeded random single-bit flips of each; per trial and side: rows kept (steps read of
   the true steps), values kept, and values that differ from the truth at their step (must be 0). Target: >= 98%
   of rows kept on average for both formats.
2. Speed: ``open_reader(...).read_all()`` of a TensorBoard file of ``--tb-events`` scalars (default 200,000;
   ``SummaryWriter``, cached: ~1 minute to write once) and of a ``.wandb`` run of ``--wandb-rows`` rows x 8 metrics
   (default 50,000; the cached input of ``bench_wandb_reader.py``), before and after alternately, ``--repeat``
   times each: best and median CPU seconds (process time: steadier than wall time on a shared machine). Target:
   after within 10%.

    python bench/bench_damage.py                       # both parts
    python bench/bench_damage.py --quick               # smaller speed inputs, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
METRICS = ("train/loss", "grad_norm", "lr")


def truth_values(steps: int) -> np.ndarray:
    """The logged values: a loss curve with noise, a grad norm, a schedule (float32-exact, as TensorBoard stores)."""
    rng = np.random.default_rng(0)
    s = np.arange(steps)
    loss = 2.1 + 0.5 * np.exp(-s / 100) + 0.02 * rng.standard_normal(steps)
    grad = 1.0 + 0.1 * rng.standard_normal(steps)
    lr = 1e-3 * np.minimum(1.0, (s + 1) / 50)
    return np.stack([loss, grad, lr], axis=1).astype(np.float32).astype(np.float64)


WANDB_WRITER = """
import sys, numpy as np, wandb
out, values = sys.argv[1], np.load(sys.argv[2])
names = sys.argv[3].split(",")
run = wandb.init(dir=out, project="bench", id="damage1", settings=wandb.Settings(
    console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True, disable_git=True,
    save_code=False, x_save_requirements=False, disable_job_creation=True))
for row in values.tolist():
    run.log(dict(zip(names, row)))
run.finish()
"""


def wandb_env(folder: Path) -> dict[str, str]:
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
    return env


def prepare_flip_inputs(steps: int) -> tuple[Path, Path, np.ndarray]:
    """The cached TensorBoard and ``.wandb`` files of ``steps`` steps, and the values they hold."""
    folder = OUT / f"damage-{steps}"
    values = truth_values(steps)
    tb = folder / "tb"
    if not (folder / "complete").exists():
        from torch.utils.tensorboard import SummaryWriter

        folder.mkdir(parents=True, exist_ok=True)
        with SummaryWriter(tb) as w:
            for s, row in enumerate(values.tolist()):
                for name, x in zip(METRICS, row):
                    w.add_scalar(name, x, s)
        np.save(folder / "values.npy", values)
        (folder / "writer.py").write_text(WANDB_WRITER)
        subprocess.run(
            [sys.executable, str(folder / "writer.py"), str(folder), str(folder / "values.npy"), ",".join(METRICS)],
            env=wandb_env(folder),
            check=True,
            capture_output=True,
            timeout=300,
        )
        (folder / "complete").write_text("ok\n")
    (tb_file,) = tb.glob("events.out.tfevents.*")
    (wandb_file,) = folder.glob("wandb/offline-run-*/run-damage1.wandb")
    return tb_file, wandb_file, values


def baseline_tree(ref: str) -> Path:
    """``forensics/`` as of ``ref``, extracted once under ``bench/out/``."""
    tree = OUT / f"baseline-{ref}"
    if not (tree / "forensics").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "forensics"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def run_side(tree: Path, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *args], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- workers (run inside a side's subprocess) ------------------------------------------------------------------------
def worker_flips(kind: str, source: str, values_path: str, flips_path: str) -> None:
    """Read each flipped copy of ``source``; print per trial rows kept, values kept, values wrong."""
    import tempfile

    from forensics.sources import open_reader

    values = np.load(values_path)
    data = Path(source).read_bytes()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "wandb":
            copy = Path(tmp) / "offline-run-20250101_000000-damage1" / Path(source).name
            copy.parent.mkdir()
        else:
            copy = Path(tmp) / Path(source).name
        for bit in json.loads(Path(flips_path).read_text()):
            buf = bytearray(data)
            buf[bit // 8] ^= 1 << (bit % 8)
            copy.write_bytes(bytes(buf))
            try:
                reader = open_reader(copy)
                reader.finished = True
                df = reader.read_all()
            except Exception as exc:  # a side that fails on a damaged file keeps nothing
                results.append({"bit": bit, "rows": 0, "values": 0, "wrong": 0, "error": str(exc)[:120]})
                continue
            steps = df["step"].to_numpy()
            inside = (steps >= 0) & (steps < len(values))
            got = np.column_stack(
                [df[m].to_numpy(np.float64) if m in df else np.full(len(df), np.nan) for m in METRICS]
            )[inside]
            want = values[steps[inside]]
            present = ~np.isnan(got)
            wrong = int((present & (got != want)).sum()) + int((~inside).sum())
            results.append(
                {
                    "bit": bit,
                    "rows": int(inside.sum()),
                    "values": int((present & (got == want)).sum()),
                    "wrong": wrong,
                    "damaged": len(getattr(reader.report, "damaged", [])),
                }
            )
    print(json.dumps(results))


def worker_speed(source: str) -> None:
    import tensorboard.compat.proto.event_pb2  # noqa: F401 - imported on first use by the reader; not timed
    import wandb.proto.wandb_internal_pb2  # noqa: F401

    from forensics.sources import open_reader

    t_cpu, t_wall = time.process_time(), time.perf_counter()
    reader = open_reader(source)
    reader.finished = True
    df = reader.read_all()
    print(
        json.dumps(
            {
                "cpu": time.process_time() - t_cpu,
                "wall": time.perf_counter() - t_wall,
                "rows": len(df),
                "checksum": float(np.nansum(df.drop(columns=["_timestamp"], errors="ignore").to_numpy())),
            }
        )
    )


# --- the two parts --------------------------------------------------------------------------------------------------
def rows_kept(args: argparse.Namespace, before: Path) -> None:
    tb_file, wandb_file, values = prepare_flip_inputs(args.steps)
    np.save(OUT / "damage-values.npy", values)
    rng = np.random.default_rng(args.seed)
    print(
        f"{args.trials} random single-bit flips of files of {args.steps} logged steps x {len(METRICS)} metrics "
        f"(seed {args.seed}); before = {args.baseline}, after = this tree"
    )
    print(
        f"{'file':<12}{'size':>8}  {'side':<7}{'rows kept':>10}{'min':>7}{'values kept':>13}{'wrong values':>14}"
        f"{'trials w/ wrong':>17}"
    )
    for kind, path in (("tensorboard", tb_file), ("wandb", wandb_file)):
        size = path.stat().st_size
        flips = rng.choice(size * 8, size=args.trials, replace=False).tolist()
        flips_path = OUT / f"damage-flips-{kind}.json"
        flips_path.write_text(json.dumps(flips))
        for side, tree in (("before", before), ("after", ROOT)):
            res = run_side(tree, "flips", kind, str(path), str(OUT / "damage-values.npy"), str(flips_path))
            rows = np.array([r["rows"] for r in res]) / len(values)
            vals = np.array([r["values"] for r in res]) / values.size
            wrong = np.array([r["wrong"] for r in res])
            print(
                f"{kind:<12}{size:>8}  {side:<7}{100 * rows.mean():>9.1f}%{100 * rows.min():>6.0f}%"
                f"{100 * vals.mean():>12.1f}%{int(wrong.sum()):>14}{int((wrong > 0).sum()):>17}"
            )


def speed(args: argparse.Namespace, before: Path) -> None:
    sys.path.insert(0, str(HERE))
    import bench_wandb_reader

    tb_folder = OUT / f"tb-speed-{args.tb_events}"
    if not (tb_folder / "complete").exists():
        from torch.utils.tensorboard import SummaryWriter

        print(f"writing the TensorBoard input once ({args.tb_events:,} scalars)...", file=sys.stderr)
        v = np.random.default_rng(0).standard_normal((args.tb_events // 4, 4))
        with SummaryWriter(tb_folder) as w:
            for s, row in enumerate(v.tolist()):
                for j, x in enumerate(row):
                    w.add_scalar(f"train/m{j}", x, s)
        (tb_folder / "complete").write_text("ok\n")
    wandb_folder = bench_wandb_reader.prepare(args.wandb_rows, 8) / "wandb"
    print(f"\nreader speed over {args.repeat} runs each, before and after alternately: CPU seconds, best and median")
    print(f"{'source':<40}{'before':>16}{'after':>16}{'after/before':>16}")
    for label, source in (
        (f"tensorboard, {args.tb_events:,} scalars", tb_folder),
        (f"wandb, {args.wandb_rows:,} rows x 8 metrics", wandb_folder),
    ):
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(args.repeat):
            for side, tree in (("before", before), ("after", ROOT)):
                runs[side].append(run_side(tree, "speed", str(source)))
        b, a = runs["before"][0], runs["after"][0]
        if (b["rows"], round(b["checksum"], 3)) != (a["rows"], round(a["checksum"], 3)):
            raise SystemExit(f"before and after disagree on {source}: {b} vs {a}")
        cpu = {side: np.array([r["cpu"] for r in rs]) for side, rs in runs.items()}
        best = {side: float(v.min()) for side, v in cpu.items()}
        median = {side: float(np.median(v)) for side, v in cpu.items()}
        print(
            f"{label:<40}{best['before']:>7.2f} ({median['before']:>5.2f}){best['after']:>8.2f} "
            f"({median['after']:>5.2f}){best['after'] / best['before']:>8.2f}x "
            f"({median['after'] / median['before']:.2f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="3dba1fc", help="git ref of the readers before (default 3dba1fc)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--trials", type=int, default=25)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--tb-events", type=int, default=200_000)
    parser.add_argument("--wandb-rows", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="speed on 40K scalars and 20K rows, 3 repeats")
    parser.add_argument("--part", choices=("all", "rows", "speed"), default="all")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        worker_flips(*rest) if kind == "flips" else worker_speed(*rest)
        return
    if args.quick:
        args.tb_events, args.wandb_rows, args.repeat = 40_000, 20_000, 3
    OUT.mkdir(parents=True, exist_ok=True)
    before = baseline_tree(args.baseline)
    if args.part in ("all", "rows"):
        rows_kept(args, before)
    if args.part in ("all", "speed"):
        speed(args, before)


if __name__ == "__main__":
    main()
