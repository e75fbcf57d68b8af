"""Bench of replay: ``replay_case`` against a bare forward loop over the same batches, with the same forwards, on CPU.

The run is the tiny LM of ``fixtures/tiny_lm.py`` (``corrupt`` setting) trained here in a few seconds with dropout
0.1, so its logged losses are train-mode ones: a replay then reproduces them in train mode over the dropout seeds,
and those seeded forwards count on both sides. Replay is asked for every ``--every``-th step (default 3: 22 steps) with
``--controls`` K (default 8), plus its clean control step, so it runs several hundred forwards. It runs without the
gradient and update probes (``probes=False``: they have no forward-only counterpart).

The baseline does only what any replay must: it loads the checkpoints in the order the replay loaded them and runs
every forward of the replay's ``forward_log`` (checkpoint, batch, dropout seed: eval mode, or train mode with torch
seeded by the seed; the determinism re-runs included) through the model once under ``torch.no_grad()`` to a mean loss;
it reads nothing, decides nothing and writes nothing. Overhead = replay / bare - 1 (target: under 30%). Timings are
the best of ``--repeat`` runs after a warm-up.

    OMP_NUM_THREADS=1 python3 bench/bench_replay.py
    OMP_NUM_THREADS=1 python3 bench/bench_replay.py --write-docs   # the figures, also into docs/accuracy.md
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _docs import markdown_table, provenance, write_section

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's fixtures/, run from anywhere
from fixtures.tiny_lm import PAD_ID, build_tiny_run, tiny_gpt
from forensics.replay import ReplayOptions, replay_case


def bare_loop(case: Path, log: list[tuple[int, int, int | None]]) -> float:
    """Run ``log``'s forwards bare (module docstring); returns seconds."""
    samples = pd.read_parquet(case / "samples.parquet")
    plan = pd.read_parquet(case / "plan.parquet")
    toks = dict(zip(samples["sample_id"], samples["input_ids"], strict=True))
    batches = {s: [toks[i] for i in g["sample_id"]] for s, g in plan.groupby("step")}
    model = tiny_gpt(dropout=0.1).eval()
    loaded = None
    t0 = time.perf_counter()
    for ck, s, seed in log:
        if ck != loaded:
            model.load_state_dict(torch.load(case / "checkpoints" / f"step_{ck:06d}.pt", weights_only=True)["model"])
            loaded = ck
        seqs = batches[s]
        width = max(len(x) for x in seqs)
        ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, x in enumerate(seqs):
            ids[i, : len(x)] = torch.tensor(np.asarray(x))
            mask[i, : len(x)] = 1
        if seed is not None:
            torch.manual_seed(seed)
            model.train()
        with torch.no_grad():
            logits = model(ids, mask)
        model.eval()
        ok = mask[:, 1:].bool()
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        float((ce * ok).sum() / ok.sum())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--controls", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write-docs", action="store_true", help="write the figures into docs/accuracy.md")
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "tiny"
        labels = build_tiny_run(case, "corrupt", wandb=False, dropout=0.1)
        toml = case / "run.toml"
        toml.write_text(re.sub(r":tiny_gpt\"", ':tiny_gpt_dropout"', toml.read_text()))
        steps = list(range(1, labels["n_steps"] - 1, args.every))
        # loss replay only: the gradient and update probes have no forward-only baseline
        opts = ReplayOptions(steps=steps, controls=args.controls, probes=False)
        replay_times = []
        for _ in range(args.repeat + 1):
            t0 = time.perf_counter()
            res = replay_case(case, opts)
            replay_times.append(time.perf_counter() - t0)
        log = res.forward_log
        bare = min(bare_loop(case, log) for _ in range(args.repeat + 1))
        rep = min(replay_times[1:])
        seeded = sum(1 for _, _, k in log if k is not None)
        verdicts = pd.Series([d["verdict"] for d in res.steps]).value_counts().to_dict()
        modes = pd.Series([d["mode"] for d in res.steps]).value_counts().to_dict()
        controls = sum(1 for d in res.steps if d.get("role") == "control")
        print(
            f"steps replayed: {len(res.steps)} ({controls} clean control step), forwards: {len(log)} "
            f"({seeded} in train mode over dropout seeds), verdicts: {verdicts}, reproduced in: {modes}"
        )
        print(f"replay_case:       {rep:.3f} s")
        print(f"bare forward loop: {bare:.3f} s (the same {len(log)} forwards)")
        print(f"overhead: {rep / bare - 1:+.0%} (target < +30%)")
    if args.write_docs:
        header = ["workload", "`replay_case`, best s", "bare forward loop, best s", "overhead", "target"]
        row = [
            f"{len(res.steps)} steps ({controls} clean control), {len(log)} forwards ({seeded} over dropout seeds)",
            f"{rep:.3f}",
            f"{bare:.3f}",
            f"{rep / bare - 1:+.0%}",
            f"< +30%: {'met' if rep / bare - 1 < 0.3 else 'not met'}",
        ]
        threads = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
        write_section("bench_replay", f"{provenance(threads)}\n\n{markdown_table(header, [row])}")


if __name__ == "__main__":
    main()
