"""Generated runs for the run-health rules: a healthy learning curve with one planted fault each, and its answer.

The run-health rules (divergence, overfitting, plateau, lr schedule) judge the shape of a whole run, so they are
judged on whole runs whose fault and step are known. The healthy run is the usual recipe: linear warm-up to
``lr_peak`` over ``warmup`` steps, cosine decay to ``lr_min_ratio`` of it, and a loss that falls with the learning
done so far::

    progress(s) = sum_{t <= s} lr(t) / lr_peak                      (steps' worth of learning at the peak rate)
    trend(s)    = floor + (ln(vocab) - floor) * (1 + progress(s) / tau) ** -alpha  +  anneal * lr(s) / lr_peak
    loss(s)     = trend(s) * (1 + Normal(0, noise))
    eval(s)     = (trend(s) + eval_gap) * (1 + Normal(0, eval_noise))        every ``eval_every`` steps
    grad_norm   = (1 + 4 exp(-s / 100)) * LogNormal(0, 0.1)

so the loss starts at ln(vocab) (a fresh model predicts uniformly), stops learning when the rate is zero, and drops a
little more as the rate anneals (the ``anneal`` term: the noise floor of a high rate). Each fault of :data:`FAULTS`
changes one thing, and :class:`HealthRun` ``truth`` says where:

- ``clean``: nothing (the control);
- ``divergence``: from ``onset`` the loss climbs to ``diverged_level`` over ``climb`` steps and stays there, the grad
  norm with it;
- ``spike``: a few steps at 2.5x from ``onset``, back within ~20 steps (a spike that recovers: not a divergence);
- ``warm_restart``: the rate restarts at its peak every ``restart_every`` steps (SGDR), each restart raising the
  loss for a while (planned: not a divergence);
- ``not_learning``: the loss never leaves ln(vocab) (``lr`` as usual, or ``lr_mode="zero"``);
- ``plateau``: from ``onset`` the model stops learning (``lr_mode``: ``zero`` = a scheduler past its end, ``tiny``
  = 1e-5 of the peak, ``fine`` = the rate goes on but nothing changes, a frozen model);
- ``overfitting``: from ``onset`` the eval loss turns up while the train loss keeps falling;
- ``no_warmup``: the rate at its peak from step 0, and the first steps unstable (the loss above its start);
- ``lr_reset``: a resumed run at ``onset`` with a fresh scheduler (warm-up from 0 again, the cosine from its start);
- ``lr_jump``: the rate 3x higher from ``onset`` (resumed with another peak).

Checkpoints are listed every ``checkpoint_every`` steps (checkpoint N = the state after N updates, as HF's
``checkpoint-N``); :func:`write_case` writes the run as a case folder (``metrics.jsonl`` as a logger writes it, with
the eval rows on their own lines, ``run.toml``, and the checkpoints as HF ``checkpoint-N/`` folders or a folder of
state dicts named in ``run.toml``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError, require
from forensics.schema.tables import as_metrics, metric_array

LOSS, EVAL_LOSS, GRAD_NORM, LR = "train/loss", "eval/loss", "grad_norm", "lr"
FAULTS = (
    "clean",
    "divergence",
    "spike",
    "warm_restart",
    "not_learning",
    "plateau",
    "overfitting",
    "no_warmup",
    "lr_reset",
    "lr_jump",
)


@dataclass(frozen=True)
class HealthParams:
    """The healthy run's parameters and each fault's (module docstring)."""

    n_steps: int = 3000
    vocab: int = 50257
    floor: float = 1.6
    tau: float = 30.0
    alpha: float = 0.75
    anneal: float = 0.2
    noise: float = 0.015
    lr_peak: float = 3e-4
    warmup: int = 100
    lr_min_ratio: float = 0.1
    eval_every: int = 100
    eval_gap: float = 0.05
    eval_noise: float = 0.003
    checkpoint_every: int = 250
    #: the fault's first step (divergence, spike, plateau, overfitting, lr_reset, lr_jump)
    onset: int = 2010
    diverged_level: float = 10.0
    climb: int = 60
    restart_every: int = 1000
    lr_mode: str = "fine"
    #: how fast the eval loss turns up after the overfitting onset (nats per 1,000 steps, squared in time)
    overfit_rise: float = 0.6
    seed: int = 0


@dataclass
class HealthRun:
    """A generated run: ``metrics`` (one row per step, ``eval/loss`` written at eval steps only), the checkpoints'
    steps and ``truth`` (the fault and where it is)."""

    metrics: pd.DataFrame
    checkpoints: list[int]
    truth: dict[str, Any]
    params: HealthParams = field(default_factory=HealthParams)


def _schedule(p: HealthParams, s: np.ndarray, fault: str) -> np.ndarray:
    """The learning rate of every step (relative to ``lr_peak``)."""
    n = p.n_steps
    warm = np.minimum((s + 1) / p.warmup, 1.0)

    def cosine(t: np.ndarray, length: int, w: int) -> np.ndarray:
        prog = np.clip((t - w) / max(length - w, 1), 0.0, 1.0)
        return p.lr_min_ratio + (1 - p.lr_min_ratio) * 0.5 * (1 + np.cos(np.pi * prog))

    if fault == "no_warmup":
        return cosine(s, n, 0)
    if fault == "warm_restart":
        return warm * cosine(s % p.restart_every, p.restart_every, 0)
    lr = warm * cosine(s, n, p.warmup)
    if fault == "lr_reset":
        t = s - p.onset
        fresh = np.minimum(t / p.warmup, 1.0) * cosine(t, n, p.warmup)
        lr = np.where(s >= p.onset, fresh, lr)
    elif fault == "lr_jump":
        lr = np.where(s >= p.onset, 3.0 * lr, lr)
    elif fault == "not_learning" and p.lr_mode == "zero":
        lr = np.zeros_like(lr)
    elif fault == "plateau" and p.lr_mode in ("zero", "tiny"):
        lr = np.where(s >= p.onset, 0.0 if p.lr_mode == "zero" else 1e-5, lr)
    return lr


def health_run(fault: str = "clean", params: HealthParams | None = None, **overrides: Any) -> HealthRun:
    """A seeded run with one planted ``fault`` (one of :data:`FAULTS`); ``overrides`` replace parameters."""
    if fault not in FAULTS:
        raise ForensicsError(f"health_run: unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    p = replace(params or HealthParams(), **overrides)
    rng = np.random.default_rng(p.seed)
    s = np.arange(p.n_steps, dtype=np.int64)
    lr = _schedule(p, s, fault)
    learning = lr.copy()
    if fault == "plateau" and p.lr_mode == "fine":
        learning = np.where(s >= p.onset, 0.0, lr)  # the rate goes on, the model does not change
    progress = np.cumsum(learning)
    l0 = float(np.log(p.vocab))
    anneal = p.anneal * (learning if fault == "plateau" else lr)
    if fault == "plateau":  # a model that stops changing keeps the loss it had
        anneal = np.where(s >= p.onset, anneal[max(p.onset - 1, 0)], anneal)
    trend = p.floor + (l0 - p.floor) * (1 + progress / p.tau) ** -p.alpha + anneal
    truth: dict[str, Any] = {"fault": fault, "n_steps": p.n_steps}
    grad = (1 + 4 * np.exp(-s / 100.0)) * np.exp(rng.normal(0, 0.1, p.n_steps))
    eval_trend = trend + p.eval_gap
    if fault == "not_learning":
        trend = np.full(p.n_steps, l0)
        eval_trend = trend + p.eval_gap
        grad = grad * 1e-3
        truth.update(start_step=0, end_step=p.n_steps - 1, level=l0)
    elif fault == "divergence":
        t = np.clip((s - p.onset) / p.climb, 0.0, 1.0) ** 1.5
        base = trend[p.onset]
        trend = np.where(s >= p.onset, base + (p.diverged_level - base) * t, trend)
        eval_trend = np.where(s >= p.onset, trend + p.eval_gap, eval_trend)
        grad = np.where(s >= p.onset, grad * (1 + 40 * t), grad)
        truth.update(onset_step=p.onset, level_before=float(base))
    elif fault == "spike":
        k = s - p.onset
        bump = np.where((k >= 0) & (k < 5), 1.5, np.where(k >= 5, 1.5 * np.exp(-(k - 4) / 4.0), 0.0))
        trend = trend * (1 + bump)
        grad = np.where((k >= 0) & (k < 5), grad * 10, grad)
        truth.update(spike_step=p.onset)
    elif fault == "warm_restart":
        k = s % p.restart_every
        shock = np.where(s >= p.restart_every, 0.5 * np.exp(-k / 60.0), 0.0)
        trend = trend + shock
        truth.update(restarts=list(range(p.restart_every, p.n_steps, p.restart_every)))
    elif fault == "plateau":
        truth.update(start_step=p.onset, end_step=p.n_steps - 1, level=float(trend[-1]), lr_mode=p.lr_mode)
    elif fault == "overfitting":
        k = np.clip((s - p.onset) / 1000.0, 0.0, None)
        eval_trend = eval_trend + p.overfit_rise * k**2
        evals = s[(s + 1) % p.eval_every == 0]
        truth.update(onset_step=p.onset, eval_min_step=int(evals[np.argmin(eval_trend[evals])]))
    elif fault == "no_warmup":
        k = s - 20
        trend = trend + np.where((k >= 0) & (k < 30), 0.35 * l0 * np.sin(np.pi * np.clip(k, 0, 30) / 30), 0.0)
        grad = np.where((k >= 0) & (k < 30), grad * 15, grad)
        truth.update(step=0, unstable_steps=[20, 49])
    elif fault in ("lr_reset", "lr_jump"):
        truth.update(step=p.onset, problem="reset" if fault == "lr_reset" else "jump")
    loss = trend * (1 + rng.normal(0, p.noise, p.n_steps))
    evals = (s + 1) % p.eval_every == 0
    ev = np.where(evals, eval_trend * (1 + rng.normal(0, p.eval_noise, p.n_steps)), np.nan)
    metrics = as_metrics(pd.DataFrame({"step": s, LOSS: loss, GRAD_NORM: grad, LR: lr * p.lr_peak}))
    metrics[EVAL_LOSS] = metric_array(ev, evals)  # written at eval steps only (null elsewhere)
    checkpoints = list(range(p.checkpoint_every, p.n_steps + 1, p.checkpoint_every))
    return HealthRun(metrics=metrics, checkpoints=checkpoints, truth=truth, params=p)


def write_case(run: HealthRun, folder: str | Path, checkpoints: str | None = "hf") -> Path:
    """``run`` as a case folder: ``metrics.jsonl`` (one line per step, eval rows on lines of their own, as a logger
    writes them), ``run.toml`` and the checkpoints: ``hf`` = ``checkpoint-N/model.safetensors`` folders, ``files`` =
    ``ckpt/step_NNNNNN.safetensors`` named by run.toml ``checkpoints``, None = none. Checkpoints need safetensors
    (the ``[replay]`` extra); they hold one small tensor (the rules read only their names and steps)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    m = run.metrics
    with (folder / "metrics.jsonl").open("w", encoding="utf-8") as out:
        for row in m.itertuples(index=False):
            out.write(
                json.dumps({"step": int(row[0]), LOSS: float(row[1]), GRAD_NORM: float(row[2]), LR: float(row[3])})
                + "\n"
            )
            if not pd.isna(row[4]):
                out.write(json.dumps({"step": int(row[0]), EVAL_LOSS: float(row[4])}) + "\n")
    toml = ['metrics = ["metrics.jsonl"]', 'loss_key = "train/loss"']
    if checkpoints is not None:
        st = require("safetensors.numpy", "replay", "writing the generated run's checkpoints")
        for n in run.checkpoints:
            if checkpoints == "hf":
                path = folder / f"checkpoint-{n}" / "model.safetensors"
            elif checkpoints == "files":
                path = folder / "ckpt" / f"step_{n:06d}.safetensors"
            else:
                raise ForensicsError(f"write_case: checkpoints must be 'hf', 'files' or None; got {checkpoints!r}")
            path.parent.mkdir(parents=True, exist_ok=True)
            st.save_file({"w": np.zeros(1, dtype=np.float32)}, str(path))
        if checkpoints == "files":
            toml.append('checkpoints = "ckpt"')
    (folder / "run.toml").write_text("\n".join(toml) + "\n", encoding="utf-8")
    return folder
