"""The demo's loss model: per-step metrics that follow from what was in each step's batch.

Every metric of step ``s`` is computed from the batch the plan gives that step, so the spikes and the jumpiness of
the demo come from the plan. With ``b`` the batch of step ``s``, ``w_i`` the (capped) token count of sample ``i``
and ``share_c(s)`` the share of the batch's tokens from source ``c``::

    loss(s) = trend(s)                                        warm-up drop, slow decline, step down each epoch
            + sum_i w_i (difficulty[source_i] + level[bucket_i]) / sum_i w_i     what the batch holds
            + forgetting(s)                                   sources not trained on for a while
            + corrupt(s) + aftershock(s)                      the corrupted near-duplicates
            + noise(s)

- ``trend(s) = plateau(s) + (initial_loss - plateau_start) * exp(-s / warmup_tau)  - epoch_drop * epoch(s)``,
  ``plateau(s) = plateau_start - (plateau_start - plateau_end) * s / n_steps``.
- ``level[bucket]``: longer length buckets have lower per-token loss (more context). A plan whose batches each
  come from one bucket therefore gives a visibly jumpy curve: the harmless jumpiness the audit must not report.
- ``forgetting(s) = forget_scale * sum_c share_c(s) * log1p(gap_c(s) / forget_tau)``, ``gap_c(s)`` = steps since
  the last step whose batch held any sample of ``c`` (``s + 1`` before the first one).
- ``corrupt(s) = corrupt_share(s) * decay^e * (corrupt_amplitude * hill(n) + corrupt_sample_offset)``, ``n`` the
  number of corrupted near-duplicates in the batch, ``corrupt_share`` their share of its tokens, ``e`` how often
  (on average) they were trained on before, ``decay = memorise_decay``, and
  ``hill(n) = n^p / (n^p + n_half^p)``: one duplicate alone is diluted (its gradient averages out against the
  rest), several in one batch push the same direction at once, so the collective effect is steeply superlinear in
  their count. The static plan keeps them together (one spike per epoch per batch, shrinking as the model
  memorises them); the bucketed shuffle scatters them (one per batch: no spike).
- ``aftershock(s) = sum_{k >= 1} aftershock_frac * corrupt(s - k) * exp(-k / aftershock_tau)``: a bad update costs
  a little for a few steps.
- ``noise(s) ~ Normal(0, noise_sd * clip(sqrt(noise_ref_tokens / real_tokens(s)), 0.5, 3))``: fewer tokens, noisier.

The other metrics::

    train/acc     = clip(exp(-acc_k * loss) + Normal(0, acc_noise_sd), 0, 1)
    grad_norm     = (grad_floor + grad_warm * exp(-s / grad_tau)) * (1 + grad_gain * collective(+ aftershock))
                    * LogNormal(0, grad_noise_sd)               rises at the same step as a data-led spike
                    (collective = the hill term of corrupt(s): a lone duplicate's gradient is diluted by its batch)
    lr            = linear warm-up over lr_warmup_steps to lr_peak, cosine decay to lr_peak * lr_min_ratio
    tokens_per_s  = real_tokens / (padded_tokens / padded_tokens_per_s + step_overhead_s) * LogNormal(0, tps_noise_sd)
    _timestamp    = start_time + cumulative step time

so throughput follows padding efficiency: ~30K tok/s for length-sorted batches, ~12K for a random order.

A spike is labelled (:func:`label_spikes`) where ``corrupt + aftershock >= label_threshold``; consecutive steps
form one event. The first exposure of a group is cause ``corrupt_duplicates``, later ones ``recurrence``.

All parameters live in :class:`LossModelParams` so that other generated runs (other seeds, noise, spike shapes) can
reuse the model; the demo uses the defaults.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from forensics.plan.buckets import bucket_index
from forensics.plan.padding import batch_shapes
from forensics.schema import DEFAULT_BOUNDARIES, EPOCH, MAX_LEN, N_TOKENS, SAMPLE_ID, SOURCE, STEP, TIMESTAMP

LOSS = "train/loss"
ACC = "train/acc"
GRAD_NORM = "grad_norm"
LR = "lr"
TOKENS_PER_S = "tokens_per_s"
METRIC_NAMES = (LOSS, ACC, GRAD_NORM, LR, TOKENS_PER_S)


@dataclass(frozen=True)
class LossModelParams:
    """Every parameter of the loss model, with the demo's values (see the module docstring for the formulas)."""

    # trend
    initial_loss: float = 7.5  # loss at step 0 (near log(vocab) for a fresh drafter head)
    warmup_tau: float = 35.0  # steps; the initial drop is over by ~step 200
    plateau_start: float = 0.9  # the story's ~0.9 after the first drop
    plateau_end: float = 0.62  # by the last step, before epoch drops
    epoch_drop: float = 0.035  # the loss steps down at each epoch boundary (data seen again)
    # what the batch holds (additive, per token)
    source_difficulty: dict[str, float] = field(
        default_factory=lambda: {"qa": -0.05, "chat": 0.02, "summarization": 0.06, "math": 0.09, "code": -0.03}
    )
    #: per length bucket of ``boundaries`` (default: the story's six buckets), shortest first
    bucket_level: tuple[float, ...] = (0.14, 0.07, 0.02, -0.04, -0.09, -0.14)
    # forgetting
    forget_scale: float = 0.04
    forget_tau: float = 8.0  # steps
    # the corrupted near-duplicates
    corrupt_amplitude: float = 3.9  # loss added by a batch made only of them, first exposure, hill -> 1
    corrupt_sample_offset: float = 0.4  # a corrupted sample's own extra loss (garbage text is hard to predict)
    hill_half: float = 2.6  # duplicates per batch at half the collective effect
    hill_power: float = 10.0  # steepness: 1 -> ~0, 2 -> 0.07, 3 -> 0.81, 4 -> 0.99
    memorise_decay: float = 0.2  # the effect shrinks by this factor with each earlier exposure
    aftershock_frac: float = 0.05
    aftershock_tau: float = 1.5  # steps
    label_threshold: float = 0.5  # corrupt + aftershock at or above this is a labelled spike
    # noise
    noise_sd: float = 0.025
    noise_ref_tokens: float = 16_384.0
    # other metrics
    acc_k: float = 0.5
    acc_noise_sd: float = 0.004
    grad_floor: float = 0.35
    grad_warm: float = 2.5
    grad_tau: float = 80.0
    grad_gain: float = 2.0
    grad_noise_sd: float = 0.08
    lr_peak: float = 3e-4
    lr_warmup_steps: int = 200
    lr_min_ratio: float = 0.1
    padded_tokens_per_s: float = 31_500.0  # what the accelerators sustain on padded tokens
    step_overhead_s: float = 0.01  # per-step cost that does not scale with tokens
    tps_noise_sd: float = 0.02
    start_time: float = 1_704_067_200.0  # 2024-01-01T00:00:00Z, so timestamps are deterministic

    def hill(self, n: np.ndarray) -> np.ndarray:
        """The collective effect of ``n`` near-duplicates in one batch, 0-1, steeply superlinear in ``n``."""
        n = np.asarray(n, dtype=np.float64) ** self.hill_power
        return n / (n + self.hill_half**self.hill_power)

    def forgetting_params(self) -> dict[str, Any]:
        """The forgetting parameters as written to ``labels.json``."""
        return {
            "form": "forget_scale * sum_c share_c * log1p(steps_since_c_last_seen / forget_tau)",
            "scale": self.forget_scale,
            "tau_steps": self.forget_tau,
            "seen": "a source is seen at a step whose batch holds any sample of it",
        }

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bucket_level"] = list(self.bucket_level)
        return d


@dataclass
class Simulation:
    """The simulated metrics table and the per-step terms it was built from (for labels and checks)."""

    metrics: pd.DataFrame  # step, the metrics of METRIC_NAMES, _timestamp
    terms: pd.DataFrame  # step, epoch, trend, composition, forgetting, corrupt, aftershock, noise, n_corrupt, ...


def _per_step(plan: pd.DataFrame, samples: pd.DataFrame, max_len: int) -> tuple[np.ndarray, pd.DataFrame]:
    """Plan rows joined to their samples, ordered by step, and the step index of each row (0..n_steps-1)."""
    rows = plan[[STEP, EPOCH, SAMPLE_ID]].merge(samples[[SAMPLE_ID, N_TOKENS, SOURCE]], on=SAMPLE_ID, how="left")
    rows = rows.sort_values(STEP, kind="stable").reset_index(drop=True)
    rows["tokens"] = np.minimum(rows[N_TOKENS].to_numpy(np.int64), max_len)
    steps = rows[STEP].to_numpy(np.int64)
    if steps.min() != 0 or len(np.unique(steps)) != steps.max() + 1:
        raise ValueError("the plan's steps must be 0..n-1 without gaps")
    return steps, rows


def simulate(
    plan: pd.DataFrame,
    samples: pd.DataFrame,
    corrupt_ids: list[int],
    params: LossModelParams | None = None,
    *,
    boundaries: tuple[int, ...] | list[int] = DEFAULT_BOUNDARIES,
    max_len: int = MAX_LEN,
    seed: int | list[int] = 0,
) -> Simulation:
    """Metrics for a plan (with ``step`` and ``epoch``) over samples (``n_tokens``, ``source``)."""
    p = params or LossModelParams()
    rng = np.random.default_rng(seed)
    steps, rows = _per_step(plan, samples, max_len)
    n_steps = int(steps.max()) + 1
    tokens = rows["tokens"].to_numpy(np.float64)
    real = np.bincount(steps, weights=tokens, minlength=n_steps)
    padded = batch_shapes(steps, tokens, n_steps).padded  # the simulated run feeds one batch per step
    epoch = pd.Series(rows[EPOCH].to_numpy(np.int64)).groupby(steps).min().to_numpy()
    s = np.arange(n_steps, dtype=np.float64)

    plateau = p.plateau_start - (p.plateau_start - p.plateau_end) * s / max(n_steps - 1, 1)
    trend = plateau + (p.initial_loss - p.plateau_start) * np.exp(-s / p.warmup_tau) - p.epoch_drop * epoch

    names = sorted(p.source_difficulty)
    src = pd.Categorical(rows[SOURCE].astype(str), categories=names).codes.astype(np.int64)
    if (src < 0).any():
        unknown = sorted(set(rows[SOURCE].astype(str)) - set(names))
        raise ValueError(f"sources without a difficulty: {unknown}")
    levels = np.asarray(p.bucket_level, dtype=np.float64)
    if len(levels) != len(boundaries) - 1:
        raise ValueError(f"bucket_level has {len(levels)} values for {len(boundaries) - 1} buckets")
    per_row = np.array([p.source_difficulty[n] for n in names])[src] + levels[bucket_index(tokens, boundaries)]
    composition = np.bincount(steps, weights=tokens * per_row, minlength=n_steps) / real

    share = np.bincount(steps * len(names) + src, weights=tokens, minlength=n_steps * len(names))
    share = share.reshape(n_steps, len(names)) / real[:, None]
    forgetting = np.zeros(n_steps)
    for c in range(len(names)):
        seen = np.flatnonzero(share[:, c] > 0)
        if not len(seen):
            continue
        before = np.searchsorted(seen, np.arange(n_steps), side="left") - 1  # last seen step strictly before s
        gap = np.where(before >= 0, np.arange(n_steps) - seen[np.maximum(before, 0)], np.arange(n_steps) + 1)
        forgetting += share[:, c] * np.log1p(gap / p.forget_tau)
    forgetting *= p.forget_scale

    is_corrupt = rows[SAMPLE_ID].isin(corrupt_ids).to_numpy()
    exposures = rows.loc[is_corrupt].groupby(SAMPLE_ID).cumcount().to_numpy(np.float64)  # earlier exposures
    c_steps = steps[is_corrupt]
    n_corrupt = np.bincount(c_steps, minlength=n_steps)
    corrupt_tokens = np.bincount(c_steps, weights=tokens[is_corrupt], minlength=n_steps)
    mean_exposure = np.bincount(c_steps, weights=exposures, minlength=n_steps) / np.maximum(n_corrupt, 1)
    weight = (corrupt_tokens / real) * p.memorise_decay**mean_exposure
    collective = weight * p.corrupt_amplitude * p.hill(n_corrupt)
    corrupt = collective + weight * p.corrupt_sample_offset
    corrupt[n_corrupt == 0] = 0.0
    k = np.arange(1, 16, dtype=np.float64)
    kernel = np.concatenate([[0.0], p.aftershock_frac * np.exp(-k / p.aftershock_tau)])
    aftershock = np.convolve(corrupt, kernel)[:n_steps]
    excess = corrupt + aftershock
    # the gradient follows the collective push only: a lone corrupted sample has a high loss of its own, but its
    # gradient is diluted by the rest of the batch, so it does not move the batch's gradient norm
    grad_excess = collective + np.convolve(collective, kernel)[:n_steps]

    noise = rng.normal(0.0, 1.0, n_steps) * p.noise_sd * np.clip(np.sqrt(p.noise_ref_tokens / real), 0.5, 3.0)
    loss = trend + composition + forgetting + excess + noise

    acc = np.clip(np.exp(-p.acc_k * loss) + rng.normal(0.0, p.acc_noise_sd, n_steps), 0.0, 1.0)
    grad_norm = (
        (p.grad_floor + p.grad_warm * np.exp(-s / p.grad_tau))
        * (1.0 + p.grad_gain * grad_excess)
        * rng.lognormal(0.0, p.grad_noise_sd, n_steps)
    )
    warm = np.minimum((s + 1) / p.lr_warmup_steps, 1.0)
    progress = np.clip((s - p.lr_warmup_steps) / max(n_steps - p.lr_warmup_steps, 1), 0.0, 1.0)
    lr = p.lr_peak * warm * (p.lr_min_ratio + (1 - p.lr_min_ratio) * 0.5 * (1 + np.cos(np.pi * progress)))
    step_time = padded / p.padded_tokens_per_s + p.step_overhead_s
    tokens_per_s = real / step_time * rng.lognormal(0.0, p.tps_noise_sd, n_steps)
    timestamp = p.start_time + np.cumsum(real / tokens_per_s)

    metrics = pd.DataFrame(
        {
            STEP: np.arange(n_steps, dtype=np.int64),
            LOSS: loss,
            ACC: acc,
            GRAD_NORM: grad_norm,
            LR: lr,
            TOKENS_PER_S: tokens_per_s,
            TIMESTAMP: timestamp,
        }
    )
    terms = pd.DataFrame(
        {
            STEP: np.arange(n_steps, dtype=np.int64),
            EPOCH: epoch,
            "trend": trend,
            "composition": composition,
            "forgetting": forgetting,
            "corrupt": corrupt,
            "aftershock": aftershock,
            "noise": noise,
            "n_corrupt": n_corrupt,
            "real_tokens": real,
            "padded_tokens": padded,
        }
    )
    return Simulation(metrics=metrics, terms=terms)


def label_spikes(
    sim: Simulation, plan: pd.DataFrame, corrupt_ids: list[int], params: LossModelParams, builder: str
) -> list[dict[str, Any]]:
    """The ground-truth spike events of a simulation: runs of steps whose corrupt + aftershock term is large."""
    t = sim.terms
    excess = (t["corrupt"] + t["aftershock"]).to_numpy()
    hot = np.flatnonzero(excess >= params.label_threshold)
    if not len(hot):
        return []
    starts = hot[np.r_[True, np.diff(hot) > 1]]
    ends = hot[np.r_[np.diff(hot) > 1, True]]
    corrupt_rows = plan[plan[SAMPLE_ID].isin(corrupt_ids)]
    seen_before: set[frozenset[int]] = set()
    events = []
    loss = sim.metrics[LOSS].to_numpy()
    for a, b in zip(starts.tolist(), ends.tolist()):
        ids = sorted(corrupt_rows.loc[corrupt_rows[STEP].between(a, b), SAMPLE_ID].astype(int).tolist())
        group = frozenset(ids)
        kind = "recurrence" if group in seen_before else "corrupt_duplicates"
        seen_before.add(group)
        epoch = int(t[EPOCH].iloc[a])
        if kind == "corrupt_duplicates":
            cause = (
                f"{len(ids)} corrupted near-duplicate code samples (<|endoftext|> runs) of nearly equal length, "
                f"packed into one batch by {builder}"
            )
        else:
            cause = (
                f"the same batch of {len(ids)} corrupted near-duplicates again in epoch {epoch} "
                f"({builder} repeats its batches; smaller as the model memorises them)"
            )
        peak = a + int(np.argmax(loss[a : b + 1]))
        events.append(
            {
                "step": a,
                "end_step": b,
                "peak_step": peak,
                "kind": kind,
                "cause": cause,
                "sample_ids": ids,
                "epoch": epoch,
                "loss": float(loss[peak]),
                "excess": float(excess[peak]),
            }
        )
    return events
