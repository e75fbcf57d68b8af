"""Bench: what recording the plan costs per batch, in a plain loop and inside a torch DataLoader loop.

- Plain: ``PlanRecorder.record`` of a 64-id numpy batch, buffering only, and flushing a Parquet part every 4096
  batches (the default). Baseline: appending the same array to a Python list (the floor of keeping anything per
  batch).
- torch: a ``DataLoader`` over an in-memory dataset (batch size 64, no workers) iterated with and without a
  ``RecordingSampler`` around its ``BatchSampler``. The overhead per batch is the difference, also shown as a share of
  the bare loop (a real training step costs far more than this bare loop, so the real share is far smaller).
- Trainer: a real Hugging Face ``Trainer`` step (the tiny random GPT-2 of ``fixtures/hf_runs.py``, batch 8, CPU, no
  logging sinks or checkpoints) with and without ``record(trainer)``, runs alternated, the median time per optimizer
  step of each. The overhead per step is the difference, also as a share of the bare step.

    python3 bench/bench_recorder.py            # 200,000 plain batches, 20,000 DataLoader batches
    python3 bench/bench_recorder.py --quick    # 20,000 and 2,000, and 2 Trainer runs of 40 steps each way
    python3 bench/bench_recorder.py --write-docs  # the table, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from _docs import provenance, rich_markdown, write_section
from rich.console import Console
from rich.table import Table

from forensics.plan.recorder import PlanRecorder, recorded_parts

BATCH = 64


def bench_plain(n_batches: int, folder: Path, table: Table) -> None:
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 10**9, BATCH) for _ in range(min(n_batches, 4096))]

    def per_batch(fn) -> float:
        t = time.perf_counter()
        for i in range(n_batches):
            fn(batches[i % len(batches)])
        return (time.perf_counter() - t) / n_batches

    sink: list = []
    base = min(per_batch(sink.append) for _ in range(3))
    buffered = PlanRecorder(folder / "buffer-only", flush_every=n_batches + 1, flush_seconds=float("inf"))
    only = per_batch(buffered.record)
    t = time.perf_counter()
    buffered.close()
    one_part = time.perf_counter() - t
    rec = PlanRecorder(folder / "plain")
    per = per_batch(rec.record)
    rec.close()
    parts = recorded_parts(folder / "plain")
    size = sum(p.stat().st_size for p in parts)
    table.add_row("baseline: list.append", f"{n_batches:,}", f"{base * 1e6:.2f}", "", "")
    table.add_row(
        "PlanRecorder.record, buffering only", f"{n_batches:,}", f"{only * 1e6:.2f}", f"+{(only - base) * 1e6:.2f}", ""
    )
    table.add_row(
        f"PlanRecorder.record + {len(parts)} parts of 4096",
        f"{n_batches:,}",
        f"{per * 1e6:.2f}",
        f"+{(per - base) * 1e6:.2f}",
        f"{size / n_batches:.0f}",
    )
    table.add_row(f"(one part of {n_batches:,} batches written in {one_part * 1e3:.0f} ms)", "", "", "", "")


def bench_torch(n_batches: int, folder: Path, table: Table) -> None:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

    from forensics.plan.recorder import RecordingSampler

    data = TensorDataset(torch.arange(n_batches * BATCH))

    def loop(batch_sampler) -> float:
        loader = DataLoader(data, batch_sampler=batch_sampler)
        t = time.perf_counter()
        for _ in loader:
            pass
        return (time.perf_counter() - t) / n_batches

    plain = BatchSampler(SequentialSampler(data), BATCH, drop_last=False)
    base, per = float("inf"), float("inf")
    for run in range(3):  # alternate, keep the best of each: a busy machine adds noise, never removes it
        base = min(base, loop(plain))
        rec = PlanRecorder(folder / f"torch-{run}")
        per = min(per, loop(RecordingSampler(BatchSampler(SequentialSampler(data), BATCH, drop_last=False), rec)))
        rec.close()
    table.add_row("baseline: DataLoader loop", f"{n_batches:,}", f"{base * 1e6:.2f}", "", "")
    table.add_row(
        "DataLoader + RecordingSampler",
        f"{n_batches:,}",
        f"{per * 1e6:.2f}",
        f"+{(per - base) * 1e6:.2f} ({(per - base) / base:+.1%})",
        "",
    )


def bench_trainer(steps: int, runs: int, folder: Path, table: Table) -> None:
    import contextlib
    import io
    import statistics
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from transformers import Trainer, TrainerCallback

    from fixtures.hf_runs import BATCH as HF_BATCH
    from fixtures.hf_runs import ListDataset, _args, _model, collate, make_samples
    from forensics.integrations.hf import record

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self._t)

    rows = make_samples()

    def one(recorded: bool, run: int) -> float:
        out = folder / f"trainer-{'rec' if recorded else 'bare'}-{run}"
        args = _args(out, max_steps=steps, report_to=[], save_strategy="no", logging_steps=10)
        timer = StepTimes()
        trainer = Trainer(
            model=_model(), args=args, train_dataset=ListDataset(rows), data_collator=collate, callbacks=[timer]
        )
        if recorded:
            record(trainer)
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.train()
        return statistics.median(timer.times[2:])  # the first steps warm up the allocator

    bare, rec = [], []
    for run in range(runs):
        bare.append(one(False, run))
        rec.append(one(True, run))
    b, r = statistics.median(bare), statistics.median(rec)
    table.add_row(
        f"baseline: HF Trainer step, tiny GPT-2, batch {HF_BATCH}", f"{steps * runs:,} steps", f"{b * 1e6:.0f}", "", ""
    )
    table.add_row(
        "HF Trainer step + record(trainer)",
        f"{steps * runs:,} steps",
        f"{r * 1e6:.0f}",
        f"{(r - b) * 1e6:+.0f} ({(r - b) / b:+.1%})",
        "",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200_000, help="plain-loop batches (default 200,000)")
    ap.add_argument("--torch-batches", type=int, default=20_000, help="DataLoader batches (default 20,000)")
    ap.add_argument("--quick", action="store_true", help="20,000 and 2,000 batches, 2 Trainer runs of 40 steps")
    ap.add_argument("--trainer-steps", type=int, default=100, help="optimizer steps per Trainer run (default 100)")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    args = ap.parse_args()
    n_plain, n_torch = (20_000, 2_000) if args.quick else (args.batches, args.torch_batches)
    table = Table(title=f"plan recorder, batches of {BATCH} samples")
    for col in ("what", "batches", "us per batch", "overhead us", "bytes per batch"):
        table.add_column(col, justify="left" if col == "what" else "right")
    with tempfile.TemporaryDirectory() as tmp:
        bench_plain(n_plain, Path(tmp), table)
        try:
            bench_torch(n_torch, Path(tmp), table)
        except ImportError:
            table.add_row("torch not installed: DataLoader part skipped", "", "", "", "")
        try:
            bench_trainer(40 if args.quick else args.trainer_steps, 2 if args.quick else 4, Path(tmp), table)
        except ImportError:
            table.add_row("transformers not installed: Trainer part skipped", "", "", "", "")
    Console().print(table)
    if args.write_docs:
        write_section("bench_recorder", f"Batches of {BATCH} samples. {provenance()}\n\n{rich_markdown(table)}")


if __name__ == "__main__":
    main()
