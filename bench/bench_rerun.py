"""Bench of the segment re-run (``forensics replay CASE --rerun``) against the bare training steps it repeats, on CPU.

The run is fixtures/hf_faults.py's ``data`` run (a tiny GPT-2 trained by the real HF Trainer, checkpoints every 4
steps), built here in a few seconds; the suspect is its corrupted batch's step, whose segment is 6 steps long.

- ``pass``: one pass over the segment with every signal recorded (per-group grad norms, update ratios, epsilon
  shares, g^2/v, attention logits, log-sum-exp), the counterfactuals off;
- ``rerun``: the whole re-run of a step (two passes for determinism, the replaced batch, per-sample gradient norms);
- ``bare``: what any re-run must do: load the checkpoint's weights and optimizer state, then per step one forward and
  backward of the batch, the clipping and the optimizer's step; it records and decides nothing.

Ratios are of the best of ``--repeat`` timings after a warm-up (target for ``pass``: <= 1.5x ``bare``).

    OMP_NUM_THREADS=1 python3 bench/bench_rerun.py [--write-docs]

``--write-docs`` writes the three timings into docs/accuracy.md between its markers.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's fixtures/, run from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/_docs.py
from _docs import markdown_table, provenance, write_section

from fixtures.hf_faults import build_fault_run
from forensics.replay.batches import pad_batch
from forensics.replay.core import ReplayOptions, _resolved
from forensics.replay.rerun import build_optimizer, rerun_step, run_segment, segment_start
from forensics.replay.session import ReplaySession
from forensics.schema import open_case


def bare(ses: ReplaySession, steps: list[int], lrs: dict[int, float], max_norm: float | None) -> float:
    """The bare steps (module docstring); returns seconds."""
    from forensics.replay.checkpoints import apply_state, load_optimizer_state, load_state_dict

    ck = segment_start(ses.checkpoints, steps[-1])
    t0 = time.perf_counter()
    module = ses.model.module
    apply_state(module, load_state_dict(ck), ck.path)
    opt, _ = build_optimizer(module, load_optimizer_state(ck), ck.path)
    module.train(True)
    for t in steps:
        seqs = [ses.tokens[i] for i in ses.index.samples_of[t]]
        opt.zero_grad(set_to_none=True)
        ids, mask = pad_batch(seqs, ses.fwd.pad_id, ses.fwd.pad_side)
        logits = module(input_ids=ids, attention_mask=mask).logits
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
        ((ce * mask[:, 1:]).sum() / int(mask.sum())).backward()
        if max_norm:
            torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)
        for g in opt.param_groups:
            g["lr"] = lrs.get(t, g["lr"])
        opt.step()
    module.train(False)
    return time.perf_counter() - t0


def best(fn, repeat: int) -> float:
    fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--write-docs", action="store_true", help="write the timings into docs/accuracy.md")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run = build_fault_run("data", Path(tmp))
        case = open_case(run.out)
        opt = _resolved(ReplayOptions(device="cpu", controls=2), case)
        ses = ReplaySession(case, opt)
        s = run.spike_step
        ck = segment_start(ses.checkpoints, s)
        steps = list(range(ck.step, s + 1))
        from forensics.replay.rerun import _column
        from forensics.schema.keys import lr_column

        lrs = _column(ses.metrics, lr_column(ses.metrics.columns))
        mn = case.config.max_grad_norm
        t_bare = best(lambda: bare(ses, steps, lrs, mn), args.repeat)
        t_pass = best(lambda: run_segment(ses, ck, steps, s, lrs, mn), args.repeat)
        t_rerun = best(lambda: rerun_step(ses, s, set(), None), args.repeat)
    print(f"segment {steps[0]}-{steps[-1]} ({len(steps)} steps) on CPU, one thread")
    print(f"bare steps      {t_bare * 1e3:8.1f} ms")
    print(f"one signal pass {t_pass * 1e3:8.1f} ms  {t_pass / t_bare:5.2f}x bare")
    print(
        f"whole re-run    {t_rerun * 1e3:8.1f} ms  {t_rerun / t_bare:5.2f}x bare (two passes, replaced batch, "
        "per-sample gradients)"
    )
    if args.write_docs:
        rows = [
            ["bare steps (load the checkpoint, forward, backward, clip, step)", f"{t_bare * 1e3:.1f} ms", "1.00x", ""],
            [
                "one pass with every signal recorded",
                f"{t_pass * 1e3:.1f} ms",
                f"{t_pass / t_bare:.2f}x",
                "<= 1.5x: " + ("met" if t_pass / t_bare <= 1.5 else "not met"),
            ],
            [
                "whole re-run (two passes, the replaced batch, per-sample gradients)",
                f"{t_rerun * 1e3:.1f} ms",
                f"{t_rerun / t_bare:.2f}x",
                "",
            ],
        ]
        text = (
            f"The segment re-run of `forensics replay --rerun` on the `data` fault run of fixtures/hf_faults.py "
            f"(segment {steps[0]}-{steps[-1]}, {len(steps)} steps, CPU, one thread; best of {args.repeat}):\n\n"
            + markdown_table(["what", "time", "against bare", "goal"], rows)
            + "\n\n"
            + provenance()
        )
        write_section("bench_rerun", text)


if __name__ == "__main__":
    main()
