"""Bench of replay (issue 20): ``replay_case`` against a bare forward loop over the same batches, on CPU.

The run is the tiny LM of ``fixtures/tiny_lm.py`` (``corrupt`` setting, trained here in a few seconds). Replay is
asked for every ``--every``-th step (default 3: 22 steps) with ``--controls`` K (default 8), so it runs a few hundred
forwards. Replay runs without the gradient and update probes (``probes=False``: they have
no forward-only counterpart). The baseline does only what any replay must: load each checkpoint the replay loaded, and run each
(checkpoint, batch) pair it ran through the model once under ``torch.no_grad()`` to a mean loss; it reads nothing,
decides nothing and writes nothing. Overhead = replay / bare - 1 (target: under 30%). Timings are the best of
``--repeat`` runs after a warm-up.

    OMP_NUM_THREADS=1 python3 bench/bench_replay.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fixtures.tiny_lm import PAD_ID, build_tiny_run, tiny_gpt
from forensics.replay import ReplayOptions, replay_case


def pairs_of(result: dict) -> list[tuple[int, int]]:
    """The (checkpoint step, batch step) forwards a replay ran, read back from its replay.json steps (the suspect
    twice: the determinism check runs it again)."""
    out: set[tuple[int, int]] = set()
    for d in result["steps"]:
        ck, s, c = d["checkpoint_step"], d["step"], d["controls"]
        out |= {(ck, t) for t in [s, *c["same_bucket_steps"], *c["other_bucket_steps"]]}
        out |= {(c["checkpoint_step"], c["step"]) for c in d.get("calibration", [])}
        for e in d.get("earlier", []):
            out |= {(e["checkpoint_step"], t) for t in [s, *c["same_bucket_steps"]]}
        for off in (-1, 1):
            t = s + off
            if d["neighbours"].get(f"{off:+d}") is not None:
                out.add((max(k for k in d["_checkpoints"] if k <= t), t))
    return sorted(out) + [(d["checkpoint_step"], d["step"]) for d in result["steps"]]


def bare_loop(case: Path, pairs: list[tuple[int, int]]) -> float:
    """Load each checkpoint once and run its batches; returns seconds."""
    samples = pd.read_parquet(case / "samples.parquet")
    plan = pd.read_parquet(case / "plan.parquet")
    toks = dict(zip(samples["sample_id"], samples["input_ids"]))
    batches = {s: [toks[i] for i in g["sample_id"]] for s, g in plan.groupby("step")}
    model = tiny_gpt().eval()
    t0 = time.perf_counter()
    for ck in sorted({c for c, _ in pairs}):
        model.load_state_dict(torch.load(case / "checkpoints" / f"step_{ck:06d}.pt", weights_only=True)["model"])
        for _, s in sorted(p for p in pairs if p[0] == ck):
            seqs = batches[s]
            width = max(len(x) for x in seqs)
            ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, x in enumerate(seqs):
                ids[i, : len(x)] = torch.tensor(np.asarray(x))
                mask[i, : len(x)] = 1
            with torch.no_grad():
                logits = model(ids, mask)
            ok = mask[:, 1:].bool()
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
            float((ce * ok).sum() / ok.sum())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--controls", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp) / "tiny"
        labels = build_tiny_run(case, "corrupt", wandb=False)
        steps = list(range(1, labels["n_steps"] - 1, args.every))
        # loss replay only: the gradient and update probes have no forward-only baseline
        opts = ReplayOptions(steps=steps, controls=args.controls, probes=False)
        replay_times = []
        for _ in range(args.repeat + 1):
            t0 = time.perf_counter()
            res = replay_case(case, opts)
            replay_times.append(time.perf_counter() - t0)
        doc = res.to_json()
        for d in doc["steps"]:
            d["_checkpoints"] = labels["checkpoints"]
        pairs = pairs_of(doc)
        bare = min(bare_loop(case, pairs) for _ in range(args.repeat + 1))
        rep = min(replay_times[1:])
        verdicts = pd.Series([d["verdict"] for d in doc["steps"]]).value_counts().to_dict()
        print(f"steps replayed: {len(steps)}, (checkpoint, batch) forwards: {len(pairs)} "
              f"(replay ran {res.forwards} model calls), verdicts: {verdicts}")
        print(f"replay_case:       {rep:.3f} s")
        print(f"bare forward loop: {bare:.3f} s")
        print(f"overhead: {rep / bare - 1:+.0%} (target < +30%)")


if __name__ == "__main__":
    main()
