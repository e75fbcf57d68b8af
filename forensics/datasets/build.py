"""Write the demo's two case folders, ``static/`` and ``bucketed/``: the same samples under the story's two plans.

Steps (all seeded by ``seed``, so the same seed gives the same tables):

1. Draw a pool of sample lengths and sources (:mod:`forensics.datasets.samples`).
2. Choose the sample count so that the static plan's epoch-0 batches at steps 254 and 258 are long batches, and make
   their samples corrupted near-duplicates (:mod:`forensics.datasets.corruption`).
3. Build 6 epochs of each plan with the unmodified reference builders (``static_sorted``, ``bucketed_shuffle``),
   world size 1 and grad accumulation 1, so one batch is one optimizer step; map batches to steps with
   :func:`~forensics.plan.step_mapping.assign_steps`.
4. Simulate the metrics from each plan's batches (:mod:`forensics.datasets.loss_model`) and label its spikes.
5. Write ``samples.parquet`` (with ``input_ids``: the token ids of each text), ``plan.parquet``, ``metrics.parquet``,
   ``metrics.jsonl`` (the same values, one JSON object per step), ``run.toml``, ``labels.json`` and, when ``wandb`` is
   installed, a W&B offline run in ``wandb/``; the static case also gets the stand-in model a replay needs
   (:mod:`forensics.datasets.demo_model`: a tiny real LM trained on its first batches, cached by content, with
   checkpoints in ``replay-model/``).

Scales: ``full`` is the story's run (about 52,000 static steps over 6 epochs, ~8,700 batches per epoch); ``small``
(~600 batches per epoch) keeps the same mechanism, spikes included, for tests. The bucketed plan packs each bucket
separately and so has more, less full batches (more steps) than the static one.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.datasets.corruption import place_corrupt_group
from forensics.datasets.demo_model import add_stand_in, with_tokens
from forensics.datasets.loss_model import LOSS, LossModelParams, Simulation, label_spikes, simulate
from forensics.datasets.samples import corrupt_text, sample_lengths_and_sources, samples_from_pool
from forensics.datasets.wandb_writer import WandbJob, wandb_available, write_wandb_runs
from forensics.errors import ForensicsError
from forensics.plan.builders import REFERENCE_BUILDERS
from forensics.plan.step_mapping import assign_steps, batches_to_plan
from forensics.schema import (
    BATCH_ID,
    DEFAULT_BOUNDARIES,
    EPOCH,
    MAX_LEN,
    SAMPLE_ID,
    SOURCE,
    STEP,
    TEXT,
    TOKEN_BUDGET,
    write_metrics,
    write_run_toml,
)

#: The story's spike steps (epoch 0 of the static run).
SPIKE_STEPS = (254, 258)
EPOCHS = 6
CASES = {"static": "static_sorted", "bucketed": "bucketed_shuffle"}
#: W&B runs are written in parallel processes above this many rows in all (the full scale; not the small one).
WANDB_PARALLEL_ROWS = 20_000
WANDB_PROCESSES = 2


@dataclass(frozen=True)
class DemoScale:
    """How big a demo is: the sample count aimed at (nudged up by the placement of the corrupted group)."""

    n_samples: int
    stride: int  # the placement tries n_samples, n_samples + stride, ...: enough to change the batch count
    max_tries: int = 400

    def candidates(self) -> range:
        return range(self.n_samples, self.n_samples + self.stride * self.max_tries, self.stride)


SCALES: dict[str, DemoScale] = {
    "full": DemoScale(n_samples=111_500, stride=83),  # ~8,700 static batches per epoch, ~52K steps
    "small": DemoScale(n_samples=7_400, stride=7),  # ~600 static batches per epoch
}

Progress = Callable[[str, int, int], None]


def _noop(stage: str, done: int, total: int) -> None:
    return None


def build_samples(scale: str, seed: int) -> tuple[pd.DataFrame, list[int], tuple[tuple[int, ...], ...]]:
    """The demo's samples table with its corrupted near-duplicates, their ids, and their groups (one per spike)."""
    cfg = SCALES[scale]
    rng = np.random.default_rng([int(seed), 101])
    candidates = cfg.candidates()
    lengths, source = sample_lengths_and_sources(candidates[-1], rng, MAX_LEN)
    placement = place_corrupt_group(lengths, candidates, SPIKE_STEPS, seed)
    samples = samples_from_pool(lengths, source, placement.n_samples, rng)
    bad = np.asarray(placement.corrupt_ids, dtype=np.int64)
    texts = samples[TEXT].to_numpy(dtype=object).copy()
    texts[bad] = corrupt_text(len(bad), rng)
    sources = samples[SOURCE].to_numpy(dtype=object).copy()
    sources[bad] = "code"
    samples = samples.assign(**{TEXT: texts, SOURCE: sources})
    return samples, placement.corrupt_ids, placement.groups


def build_plan(samples: pd.DataFrame, builder: str, seed: int, epochs: int = EPOCHS) -> pd.DataFrame:
    """``epochs`` epochs of a reference builder as a canonical plan (``step``, ``epoch``, ``batch_id``,
    ``sample_id``)."""
    fn = REFERENCE_BUILDERS[builder]
    plan = assign_steps(batches_to_plan([fn(samples, e, seed) for e in range(epochs)]), grad_accum=1, world_size=1)
    return plan[[STEP, EPOCH, BATCH_ID, SAMPLE_ID]].reset_index(drop=True)


def write_metrics_jsonl(metrics: pd.DataFrame, path: Path) -> None:
    """One JSON object per step with exactly the values of the table (``repr`` of a float round-trips)."""
    cols = list(metrics.columns)
    arrays = [metrics[c].to_numpy().tolist() for c in cols]
    with path.open("w", encoding="utf-8") as fh:
        for row in zip(*arrays):
            fh.write(json.dumps(dict(zip(cols, row)), allow_nan=True) + "\n")


def _labels(
    name: str,
    builder: str,
    seed: int,
    scale: str,
    sim: Simulation,
    plan: pd.DataFrame,
    corrupt_ids: list[int],
    groups: tuple[tuple[int, ...], ...],
    params: LossModelParams,
) -> dict[str, Any]:
    t = sim.terms
    per_batch = t.loc[t["n_corrupt"] > 0, "n_corrupt"]
    return {
        "case": name,
        "builder": builder,
        "seed": seed,
        "scale": scale,
        "epochs": EPOCHS,
        "n_steps": len(sim.metrics),
        "loss_key": LOSS,
        "spikes": label_spikes(sim, plan, corrupt_ids, params, builder),
        "forgetting": params.forgetting_params(),
        "corrupt_sample_ids": corrupt_ids,
        "corrupt_groups": [list(g) for g in groups],
        "corrupt_max_per_batch": int(per_batch.max()) if len(per_batch) else 0,
        "jumpiness": {
            "what": "harmless: each batch's loss level follows its length bucket (longer = lower per-token loss)",
            "boundaries": list(DEFAULT_BOUNDARIES),
            "bucket_level": list(params.bucket_level),
        },
        "source_difficulty": dict(params.source_difficulty),
        "padding_efficiency": float(t["real_tokens"].sum() / t["padded_tokens"].sum()),
        "mean_tokens_per_s": float(sim.metrics["tokens_per_s"].mean()),
        "loss_model": params.as_dict(),
    }


def write_case(
    case_dir: Path,
    samples: pd.DataFrame,
    plan: pd.DataFrame,
    sim: Simulation,
    labels: dict[str, Any],
    run_keys: dict[str, Any] | None = None,
) -> None:
    """Write one case folder's tables, ``run.toml`` and ``labels.json`` (the W&B run is written separately).

    The W&B run of an earlier demo in the same folder (recognised by its ``labels.json``) is removed first, so that
    the folder never holds two runs or a run that does not match its tables.
    """
    if (case_dir / "labels.json").is_file() and (case_dir / "wandb").is_dir():
        shutil.rmtree(case_dir / "wandb")
    case_dir.mkdir(parents=True, exist_ok=True)
    samples.to_parquet(case_dir / "samples.parquet", index=False)
    plan.to_parquet(case_dir / "plan.parquet", index=False)
    write_metrics(sim.metrics, case_dir / "metrics.parquet")
    write_metrics_jsonl(sim.metrics, case_dir / "metrics.jsonl")
    write_run_toml(
        {
            "metrics": ["metrics.parquet"],
            "plan": "plan.parquet",
            "samples": "samples.parquet",
            "grad_accum": 1,
            "world_size": 1,
            "rank_split": "round_robin",
            "loss_key": LOSS,
            "boundaries": list(DEFAULT_BOUNDARIES),
            "token_budget": TOKEN_BUDGET,
            "max_len": MAX_LEN,
            # the forgetting signature read on the simulator's own time scale (labels.json 'forgetting')
            "detect": {"forgetting": {"tau": float(labels["forgetting"]["tau_steps"])}},
            **(run_keys or {}),
        },
        case_dir / "run.toml",
    )
    (case_dir / "labels.json").write_text(json.dumps(labels, indent=2, allow_nan=False) + "\n", encoding="utf-8")


def _check_static_spikes(plan: pd.DataFrame, groups: tuple[tuple[int, ...], ...]) -> None:
    for step, group in zip(SPIKE_STEPS, groups):
        got = sorted(plan.loc[plan[STEP] == step, SAMPLE_ID].tolist())
        if got != sorted(group):  # the placement and the builder disagree: a bug, not bad input
            raise RuntimeError(f"static plan step {step} holds {got}, expected the corrupted group {sorted(group)}")


def build_demo(
    out: str | Path,
    scale: str = "full",
    seed: int = 0,
    wandb: bool = True,
    progress: Progress | None = None,
    params: LossModelParams | None = None,
) -> dict[str, Any]:
    """Write ``out/static`` and ``out/bucketed``; return a summary (paths, steps, spikes, seconds per stage).

    ``wandb=False`` (or no ``wandb`` package) skips the W&B offline runs. ``progress(stage, done, total)`` is called
    as work advances. Same ``seed`` and ``scale`` give identical Parquet contents.
    """
    if scale not in SCALES:
        raise ForensicsError(f"--scale must be one of {', '.join(SCALES)}; got {scale!r}")
    params = params or LossModelParams()
    progress = progress or _noop
    out = Path(out)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    progress("samples", 0, 1)
    samples, corrupt_ids, groups = build_samples(scale, seed)
    samples = with_tokens(samples)
    timings["samples"] = time.perf_counter() - t0
    summary: dict[str, Any] = {
        "out": str(out),
        "scale": scale,
        "seed": seed,
        "n_samples": len(samples),
        "cases": {},
        "seconds": timings,
    }
    sims: dict[str, tuple[Path, Simulation, dict[str, Any]]] = {}
    for index, (name, builder) in enumerate(CASES.items()):
        t = time.perf_counter()
        progress(f"{name}: plan", 0, 1)
        plan = build_plan(samples, builder, seed)
        if name == "static":
            _check_static_spikes(plan, groups)
        progress(f"{name}: metrics", 0, 1)
        sim = simulate(plan, samples, corrupt_ids, params, seed=[int(seed), 202, index])
        labels = _labels(name, builder, seed, scale, sim, plan, corrupt_ids, groups, params)
        case_dir = out / name
        run_keys = None
        if name == "static":  # the story's case carries the stand-in model a replay needs
            progress("static: stand-in model for replay", 0, 1)
            t_model = time.perf_counter()
            run_keys = add_stand_in(case_dir, samples, plan)
            timings["stand_in"] = time.perf_counter() - t_model
            summary["stand_in"] = run_keys is not None
        write_case(case_dir, samples, plan, sim, labels, run_keys)
        sims[name] = (case_dir, sim, labels)
        timings[name] = time.perf_counter() - t
        summary["cases"][name] = {
            "path": str(case_dir),
            "builder": builder,
            "steps": len(sim.metrics),
            "spike_steps": [s["step"] for s in labels["spikes"]],
            "mean_tokens_per_s": labels["mean_tokens_per_s"],
        }
    wrote_wandb = wandb and wandb_available()
    if wrote_wandb:
        t = time.perf_counter()
        jobs = [
            WandbJob(
                case_dir,
                sim.metrics,
                name=f"demo-{name}",
                config={
                    "builder": labels["builder"],
                    "seed": seed,
                    "scale": scale,
                    "epochs": EPOCHS,
                    "token_budget": TOKEN_BUDGET,
                    "max_len": MAX_LEN,
                    "grad_accum": 1,
                    "world_size": 1,
                },
            )
            for name, (case_dir, sim, labels) in sims.items()
        ]
        rows = sum(len(j.metrics) for j in jobs)
        # parallel processes pay ~1 s of start-up each: worth it only for large runs
        processes = WANDB_PROCESSES if rows > WANDB_PARALLEL_ROWS else 1
        progress("W&B offline runs", 0, len(jobs))
        folders = write_wandb_runs(
            jobs, processes=processes, on_done=lambda done, total: progress("W&B offline runs", done, total)
        )
        for name, folder in zip(sims, folders):
            summary["cases"][name]["wandb"] = str(folder)
        timings["wandb"] = time.perf_counter() - t
    summary["wandb"] = bool(wrote_wandb)
    timings["total"] = time.perf_counter() - t0
    summary["seconds"] = {k: round(v, 3) for k, v in timings.items() if math.isfinite(v)}
    return summary
