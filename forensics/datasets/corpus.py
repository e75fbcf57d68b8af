"""The labelled corpus of the detection benchmark: simulated runs whose spikes, and whose clean stretches, are known.

A detector's thresholds are only as good as the runs they were judged on, so the project generates its own judge:
runs that vary everything a real run varies (seeds, lengths, Gaussian and heavy-tailed noise, spike shapes, bucket
effects of several sizes, NaN steps, resumed logs, gradient accumulation, level shifts), each with labels saying where
the spikes start and what caused them. :mod:`forensics.evaluation.scoring` turns detections plus these labels into the
benchmark's numbers; ``bench/bench_detection_quality.py`` prints them for our detector and the frameworks' rules.

**How a run is made** (:func:`make_run`; everything seeded by ``RunSpec.seed``, numpy-vectorised):

1. *Samples*: the demo's synthetic samples (:func:`forensics.datasets.samples.make_samples`: lengths correlated with
   content, text snippets); a sample's ``cluster`` is its source (``cluster_name`` the source's name).
2. *Plan*: a reference builder (``bucketed_shuffle``, ``static_sorted`` or ``random_shuffle``) epoch after epoch,
   mapped to steps with ``grad_accum`` G batches per step (:func:`~forensics.plan.step_mapping.assign_steps`) and cut
   at ``n_steps``. With G > 1 a step mixes batches of several buckets, so bucket effects shrink.
3. *Tags*: the tagging stage itself (:func:`forensics.tagging.tag_steps`): ``bucket``, ``cluster``, ``epoch``, ...
4. *The noise-free loss*: the demo's loss model (:func:`forensics.datasets.loss_model.simulate`) with its noise off: a
   warm-up drop from ``initial_loss`` (time constant ``warmup_tau``) to a plateau near ``level``, a slow decline,
   epoch drops (2% of ``level``), forgetting, and each batch's bucket and content levels scaled by ``bucket_scale``
   (0: none; 2: twice the demo's).
5. *What the labels describe*, on top: persistent **level shifts** (a new data mix: x1.2-1.7 or x0.6-0.85, not
   spikes), **spikes** (a factor profile ``g`` over a few steps, below), **noise** in log space (Gaussian, or Student-t
   with 3 degrees of freedom truncated at 25 scale units: heavy tails that reach ~1.4x but not the 3x of a real
   spike) scaled by ``clip(sqrt(16384 / real_tokens), 0.5, 1.5)`` (short batches are noisier), and **NaN steps**:
   ``loss = baseline * g * exp(noise)``, ``baseline`` = noise-free loss * shifts.
   Grad norm is the loss model's, times ``1 + 2 (g - 1)`` on a spike's own steps, except for grad-norm-led spikes,
   where it climbs for several steps before the loss moves. ``lr`` is the loss model's schedule.
6. *Resumed runs*: the raw log is written as JSONL with a rewound stretch (a first attempt that diverged to NaN, then
   the run resumed from an earlier checkpoint) and read back with :func:`forensics.sources.read_metrics`; the metrics
   table is what the reader returns (last write wins), and the labels describe those values.

**Spike shapes** (:data:`SHAPES`; peak factor ``p`` over the baseline, log-uniform):

- ``one_step`` (p 1.6-6): one step; the data-led spike of the story.
- ``few_steps`` (p 1.6-4): 2-6 steps decaying from the peak, ``1 + (p - 1) d^k``.
- ``slow_rise`` (p 1.6-4): a ramp of 4-10 steps up to the peak, then 1-4 steps down; no data cause.
- ``warmup``: a one- or few-step data-led spike inside the warm-up's steep descent.
- ``grad_led`` (p 1.6-4): grad norm climbs x2 -> x300 over 3-6 steps, the loss barely moves, then it jumps and
  decays over 8-20 steps (BLOOM-176B's spike at 31219); no data cause.
- ``story``: the demo itself at small scale with other seeds (corrupted near-duplicates packed into one batch by
  ``static_sorted``, recurring in the next epochs); labelled by :func:`forensics.datasets.loss_model.label_spikes`,
  keeping the events of 1.6x or more (:data:`MIN_FACTOR`, the corpus's definition of a spike).

A label's ``start``/``end`` are the first/last steps at or above half the peak's excess (``g >= 1 + (p - 1) / 2``),
so a slow rise starts where it becomes visible. Data-led spikes (``one_step``, ``few_steps``, ``warmup``, ``story``)
are labelled with the ``bucket`` and ``cluster`` of their step and the ``sample_ids`` that caused them: 2-6 samples
of that step's batch (of its bucket and cluster where there are enough) whose text is replaced by corrupted
near-duplicates (:func:`forensics.datasets.samples.corrupt_text`). **Spans** (:meth:`RunLabels.spans`) are what is not
clean: every injected event's whole extent (lead-in to decay, plus 2 steps before and 5 after), the story runs' smaller
recurrences, and NaN steps. Everything else is clean: it holds only the loss model, noise and level shifts.

**Sizes** (:func:`corpus_specs`): ``full`` (47 runs, ~455K steps, ~180 labelled spikes, >450K clean steps),
``quick`` (one run per kind, shorter) and ``test`` (a handful of short runs, for unit tests).

**The long corpus** (:func:`long_corpus_specs`, :func:`make_long_run`): metrics only, no plan, one family
per noise tail (:data:`LONG_FAMILIES`), 10 runs of 220,000 steps each (>= 2M clean steps per family): one-step,
few-step, slow-rise and grad-led spikes, bursts of 3-6 spikes, level shifts, eval rows every 500 steps in half the
runs. Its generator was fixed (v2, commit "Long corpus v2") before any threshold was tuned on it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from forensics.datasets.build import build_plan, build_samples, write_metrics_jsonl
from forensics.datasets.loss_model import GRAD_NORM, LOSS, LR, LossModelParams, label_spikes, simulate
from forensics.datasets.samples import SOURCE_NAMES, corrupt_text, make_samples
from forensics.evaluation.scoring import MARGIN, SpikeLabel, in_spans
from forensics.plan.buckets import bucket_index
from forensics.plan.builders import REFERENCE_BUILDERS
from forensics.plan.step_mapping import assign_steps, batches_to_plan
from forensics.schema import CLUSTER, DEFAULT_BOUNDARIES, MAX_LEN, N_TOKENS, SAMPLE_ID, SOURCE, STEP, TEXT
from forensics.tagging import CLUSTER_NAME, tag_steps

SHAPES = ("one_step", "few_steps", "slow_rise", "warmup", "grad_led", "story")
#: Shapes whose cause is a batch: labelled with bucket, cluster and samples.
DATA_LED = frozenset({"one_step", "few_steps", "warmup", "story"})
METRIC_COLUMNS = (STEP, LOSS, GRAD_NORM, LR)
#: Steps after an injected event that still belong to its span (the loss settles).
POST_STEPS = 5
#: The smallest peak factor of a labelled spike (smaller injected bumps stay in the spans, unlabelled).
MIN_FACTOR = 1.6
#: Minimum steps between two injected events (spikes, level shifts, NaN steps), so each is judged on its own.
MIN_GAP = 250
#: Mean samples per batch of the demo's length mix under the default token budget (static ~13, bucketed ~10).
_SAMPLES_PER_BATCH = 9.5
_REF_TOKENS = 16_384.0
#: Student-t noise is truncated at this many scale units (see :func:`_noise`).
T_CAP = 25.0


@dataclass(frozen=True)
class RunSpec:
    """Everything that makes one corpus run (see the module docstring for what each knob does)."""

    name: str
    seed: int
    n_steps: int
    builder: str = "bucketed_shuffle"
    epochs: int = 4
    grad_accum: int = 1
    noise: str = "gaussian"  # or "student_t"
    noise_sd: float = 0.02  # log-space sd (Gaussian) or scale (Student-t) before the per-step token factor
    bucket_scale: float = 1.0
    level: float = 0.9
    initial_loss: float = 7.5
    warmup_tau: float = 35.0
    spikes: tuple[str, ...] = ()
    level_shifts: int = 0
    nan_steps: int = 0
    resumed: bool = False
    story: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.spikes) - set(SHAPES) - {"story"}
        if unknown or self.noise not in ("gaussian", "student_t") or self.builder not in REFERENCE_BUILDERS:
            raise ValueError(
                f"bad RunSpec {self.name}: shapes {sorted(unknown)}, noise {self.noise!r}, builder {self.builder!r}"
            )


@dataclass
class RunLabels:
    """The ground truth of one run."""

    spikes: list[SpikeLabel] = field(default_factory=list)
    #: inclusive (first, last) steps of each injected event's whole extent (before widening)
    extents: list[tuple[int, int]] = field(default_factory=list)
    #: (step, factor) of each persistent level shift: not spikes, and inside clean spans
    level_shifts: list[tuple[int, float]] = field(default_factory=list)
    nonfinite_steps: list[int] = field(default_factory=list)
    #: steps where untruncated noise alone moved the loss by a spike rule's jump or more (the heavy-tailed family,
    #: :data:`~forensics.datasets.heavy_tails.NOISE_SPIKE_FACTOR`): as large as a spike, so not clean, and not labelled
    noise_spikes: list[int] = field(default_factory=list)
    #: resumed runs: (resume step, crash step) of the stretch the raw log holds twice
    rewound: tuple[int, int] | None = None

    def spans(self, margin: int = MARGIN) -> list[tuple[int, int]]:
        """The steps that are not clean: event extents and noise spikes widened by ``margin`` before and
        :data:`POST_STEPS` after, and the non-finite steps."""
        out = [(a - margin, b + POST_STEPS) for a, b in self.extents]
        out += [(s - margin, s + POST_STEPS) for s in self.noise_spikes]
        out += [(s, s) for s in self.nonfinite_steps]
        return out


@dataclass
class Run:
    """One corpus run: the tables a user would have, the labels, and the noise-free truth behind them."""

    spec: RunSpec
    metrics: pd.DataFrame  # step, train/loss, grad_norm, lr
    tags: pd.DataFrame  # the tagging stage's table (step, epoch, bucket, cluster, ...)
    plan: pd.DataFrame  # step, sample_id, epoch, batch_id, micro, rank
    samples: pd.DataFrame  # sample_id, n_tokens, source, text, cluster, cluster_name
    labels: RunLabels
    baseline: np.ndarray  # noise-free, spike-free loss per step (level shifts included)
    factor: np.ndarray  # the spike factor g per step (1 outside injected events)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def n_steps(self) -> int:
        return len(self.metrics)

    def clean_mask(self) -> np.ndarray:
        """Per metrics row: True where the step lies outside every span of :meth:`RunLabels.spans`."""
        return ~in_spans(self.metrics[STEP].to_numpy(np.int64), self.labels.spans())


# --- spike profiles ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Profile:
    """A spike's factors relative to its anchor step: loss ``g`` and grad norm ``grad`` at ``offsets``."""

    offsets: np.ndarray
    g: np.ndarray
    grad: np.ndarray
    shape: str

    @property
    def peak_factor(self) -> float:
        return float(self.g.max())

    def visible(self) -> np.ndarray:
        """Offsets at or above half the peak's excess (the labelled start..end)."""
        half = 1.0 + 0.5 * (self.peak_factor - 1.0)
        return self.offsets[self.g >= half - 1e-12]


def _peak(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _profile(shape: str, rng: np.random.Generator) -> _Profile:
    if shape == "warmup":
        shape_of = "one_step" if rng.random() < 0.5 else "few_steps"
        p = _profile(shape_of, rng)
        return replace(p, shape="warmup")
    if shape == "one_step":
        p = _peak(rng, 1.6, 6.0)
        g = np.array([p])
    elif shape == "few_steps":
        n, d, p = int(rng.integers(2, 7)), rng.uniform(0.55, 0.85), _peak(rng, 1.6, 4.0)
        g = 1.0 + (p - 1.0) * d ** np.arange(n)
    elif shape == "slow_rise":
        r, fall, p = int(rng.integers(4, 11)), int(rng.integers(1, 5)), _peak(rng, 1.6, 4.0)
        up = 1.0 + (p - 1.0) * np.arange(1, r + 1) / r
        down = 1.0 + (p - 1.0) * 0.5 ** np.arange(1, fall + 1)
        g = np.concatenate([up, down])
        return _Profile(np.arange(len(g)) - (r - 1), g, 1.0 + 2.0 * (g - 1.0), shape)
    elif shape == "grad_led":
        lead, n_dec, d, p = (
            int(rng.integers(3, 7)),
            int(rng.integers(8, 21)),
            rng.uniform(0.6, 0.8),
            _peak(rng, 1.6, 4.0),
        )
        g_lead = 1.0 + rng.uniform(0.0, 0.12, lead)  # the loss barely moves while grad norm climbs
        g = np.concatenate([g_lead, 1.0 + (p - 1.0) * d ** np.arange(n_dec)])
        grad = np.concatenate([np.geomspace(2.0, 300.0, lead), np.geomspace(1000.0, 2.0, n_dec)])
        return _Profile(np.arange(len(g)) - lead, g, grad, shape)
    else:
        raise ValueError(f"unknown spike shape {shape!r}")
    return _Profile(np.arange(len(g)), g, 1.0 + 2.0 * (g - 1.0), shape)


# --- placement -----------------------------------------------------------------------------------------------------
class _Placer:
    """Random anchor steps at least :data:`MIN_GAP` apart from everything placed before (deterministic by rng)."""

    def __init__(self, rng: np.random.Generator, n_steps: int):
        self.rng, self.n_steps = rng, n_steps
        self.taken: list[tuple[int, int]] = []

    def place(self, lo: int, hi: int, before: int = 0, after: int = 0, gap: int = MIN_GAP) -> int | None:
        lo, hi = max(lo, before), min(hi, self.n_steps - after - 1)
        if hi <= lo:
            return None
        for _ in range(400):
            s = int(self.rng.integers(lo, hi + 1))
            a, b = s - before, s + after
            if all(b + gap < x or a - gap > y for x, y in self.taken):
                self.taken.append((a, b))
                return s
        return None


# --- the run -------------------------------------------------------------------------------------------------------
def _loss_params(spec: RunSpec) -> LossModelParams:
    """The demo's loss model, rescaled to the run's level and bucket effect, with its own noise off."""
    base = LossModelParams()
    lv = spec.level / base.plateau_start
    k = spec.bucket_scale * lv
    # a gentler decline than the demo's (x0.69 and an epoch drop of ~4%): the bucket and content levels are additive,
    # so over a long run a steep decline would leave the lowest buckets at a tiny fraction of the others
    return replace(
        base,
        initial_loss=spec.initial_loss,
        warmup_tau=spec.warmup_tau,
        plateau_start=spec.level,
        plateau_end=spec.level * 0.85,
        epoch_drop=0.02 * spec.level,
        source_difficulty={s: v * k for s, v in base.source_difficulty.items()},
        bucket_level=tuple(v * k for v in base.bucket_level),
        forget_scale=base.forget_scale * lv,
        noise_sd=0.0,
    )


def _with_clusters(samples: pd.DataFrame) -> pd.DataFrame:
    code = pd.Categorical(samples[SOURCE].astype(str), categories=list(SOURCE_NAMES)).codes.astype(np.int64)
    return samples.assign(**{CLUSTER: code, CLUSTER_NAME: samples[SOURCE].astype(str).to_numpy()})


def _plan(samples: pd.DataFrame, spec: RunSpec) -> pd.DataFrame:
    """Epochs of the builder until the run has ``n_steps`` steps, mapped to steps and cut there."""
    fn = REFERENCE_BUILDERS[spec.builder]
    need = spec.n_steps * spec.grad_accum
    batches, have, epoch = [], 0, 0
    while have < need:
        b = fn(samples, epoch, spec.seed)
        batches.append(b)
        have += len(b)
        epoch += 1
    plan = assign_steps(batches_to_plan(batches), grad_accum=spec.grad_accum, world_size=1)
    plan = plan[plan[STEP] < spec.n_steps]
    return plan.sort_values([STEP, "micro"], kind="stable").reset_index(drop=True)


def _noise(spec: RunSpec, rng: np.random.Generator, real_tokens: np.ndarray) -> np.ndarray:
    n = len(real_tokens)
    if spec.noise == "student_t":
        # heavy tails, but truncated: a t(3) draw of 100 scale units would be a 3x jump, which is a spike by any
        # definition, not noise (the corpus's noise stays within ~1.4x; its spikes start at 1.6x)
        eps = np.clip(rng.standard_t(3, n), -T_CAP, T_CAP)
    else:
        eps = rng.standard_normal(n)
    return eps * spec.noise_sd * np.clip(np.sqrt(_REF_TOKENS / np.maximum(real_tokens, 1.0)), 0.5, 1.5)


def _corrupt_batch(
    plan_steps: np.ndarray,
    plan_ids: np.ndarray,
    step: int,
    bucket: int,
    cluster: int,
    sample_bucket: np.ndarray,
    sample_cluster: np.ndarray,
    texts: np.ndarray,
    rng: np.random.Generator,
) -> tuple[int, ...]:
    """Make a few samples of ``step``'s batch corrupted near-duplicates (in place in ``texts``); their ids.

    They are drawn from the samples of the step's own bucket and cluster where there are enough (else its cluster,
    else any), so that the step's bucket and cluster are also the bad samples' ones: the attribution to check.
    """
    lo, hi = np.searchsorted(plan_steps, step, "left"), np.searchsorted(plan_steps, step, "right")
    ids = np.unique(plan_ids[lo:hi])
    if not len(ids):
        return ()
    # at least two: one bad sample alone has no near-duplicate in its batch, and nothing in the plan singles it out
    k = min(int(np.clip(round(len(ids) * rng.uniform(0.25, 0.5)), 2, 6)), len(ids))
    same_cluster = ids[sample_cluster[ids] == cluster]
    same_both = same_cluster[sample_bucket[same_cluster] == bucket]
    pool = same_both if len(same_both) >= k else (same_cluster if len(same_cluster) >= k else ids)
    bad = np.sort(rng.choice(pool, size=k, replace=False))
    texts[bad] = corrupt_text(k, rng)
    return tuple(int(i) for i in bad)


def make_run(spec: RunSpec) -> Run:
    """Build one labelled run (see the module docstring); the same spec always gives the same tables."""
    if spec.story:
        return _story_run(spec)
    rng = np.random.default_rng([spec.seed, 1])
    n_samples = int(np.ceil(spec.n_steps * spec.grad_accum * _SAMPLES_PER_BATCH / spec.epochs * 1.1))
    samples = _with_clusters(make_samples(n_samples, spec.seed))
    plan = _plan(samples, spec)
    n = spec.n_steps
    if plan[STEP].max() + 1 != n:
        raise RuntimeError(f"{spec.name}: the plan has {plan[STEP].max() + 1} steps, expected {n}")
    tags = tag_steps(plan, samples, DEFAULT_BOUNDARIES)
    sim = simulate(plan, samples, [], _loss_params(spec), seed=[spec.seed, 2])
    t = sim.terms
    base = (t["trend"] + t["composition"] + t["forgetting"]).to_numpy()
    steps = np.arange(n, dtype=np.int64)

    place = _Placer(np.random.default_rng([spec.seed, 3]), n)
    labels = RunLabels()
    shift = np.ones(n)
    for _ in range(spec.level_shifts):
        s = place.place(max(1000, n // 10), n - 500)
        if s is None:
            continue
        f = rng.uniform(1.2, 1.7) if rng.random() < 0.5 else rng.uniform(0.6, 0.85)
        shift[s:] *= f
        labels.level_shifts.append((s, round(float(f), 4)))
    baseline = base * shift

    g = np.ones(n)
    grad_f = np.ones(n)
    texts = samples[TEXT].to_numpy(dtype=object).copy()
    plan_steps = plan[STEP].to_numpy(np.int64)
    plan_ids = plan[SAMPLE_ID].to_numpy(np.int64)
    tag_bucket = tags["bucket"].to_numpy(np.int64)
    tag_cluster = tags[CLUSTER].to_numpy(np.int64)
    sample_bucket = bucket_index(np.minimum(samples[N_TOKENS].to_numpy(np.int64), MAX_LEN), DEFAULT_BOUNDARIES)
    sample_cluster = samples[CLUSTER].to_numpy(np.int64)  # sample ids are 0..n-1: ids index these arrays
    warm_end = int(3 * spec.warmup_tau)
    for shape in spec.spikes:
        prof = _profile(shape, rng)
        before, after = int(-prof.offsets.min()), int(prof.offsets.max()) + POST_STEPS
        if shape == "warmup":
            s0 = place.place(50, max(warm_end, 120), before, after, gap=60)
        else:
            s0 = place.place(max(400, warm_end + 100), n - 100, before, after)
        if s0 is None:
            continue
        at = s0 + prof.offsets
        g[at] = prof.g
        grad_f[at] = prof.grad
        vis = s0 + prof.visible()
        start, end = int(vis.min()), int(vis.max())
        peak = int(at[np.argmax(prof.g)])
        data_led = shape in DATA_LED
        bucket, cluster = int(tag_bucket[start]), int(tag_cluster[start])
        sample_ids = (
            _corrupt_batch(plan_steps, plan_ids, start, bucket, cluster, sample_bucket, sample_cluster, texts, rng)
            if data_led
            else ()
        )
        labels.spikes.append(
            SpikeLabel(
                start=start,
                end=end,
                peak=peak,
                shape=shape,
                factor=round(prof.peak_factor, 6),
                metric=LOSS,
                bucket=bucket if data_led else None,
                cluster=cluster if data_led else None,
                sample_ids=sample_ids,
            )
        )
        labels.extents.append((int(at.min()), int(at.max())))
    samples = samples.assign(**{TEXT: texts})

    noise = _noise(spec, rng, t["real_tokens"].to_numpy(np.float64))
    loss = baseline * g * np.exp(noise)
    grad = sim.metrics[GRAD_NORM].to_numpy() * grad_f
    for _ in range(spec.nan_steps):
        s = place.place(300, n - 10, gap=50)
        if s is not None:
            loss[s] = np.nan
            grad[s] = np.nan
            labels.nonfinite_steps.append(s)
    labels.nonfinite_steps.sort()
    labels.spikes.sort(key=lambda lab: lab.start)
    labels.extents.sort()
    metrics = pd.DataFrame({STEP: steps, LOSS: loss, GRAD_NORM: grad, LR: sim.metrics[LR].to_numpy()})
    if spec.resumed:
        metrics, labels.rewound = _resumed(metrics, baseline, spec, rng)
    return Run(
        spec=spec, metrics=metrics, tags=tags, plan=plan, samples=samples, labels=labels, baseline=baseline, factor=g
    )


def _resumed(
    metrics: pd.DataFrame, baseline: np.ndarray, spec: RunSpec, rng: np.random.Generator
) -> tuple[pd.DataFrame, tuple[int, int]]:
    """Write the run as a resumed log (first attempt diverged at ``crash``, resumed at ``resume``), read it back."""
    from forensics.sources import read_metrics

    n = len(metrics)
    crash = int(rng.integers(int(0.4 * n), int(0.7 * n)))
    resume = crash - int(rng.integers(80, 300))
    first = metrics.iloc[:crash].copy()
    stretch = np.arange(resume, crash)
    first.loc[stretch, LOSS] = baseline[stretch] * np.exp(rng.normal(0.0, spec.noise_sd, len(stretch)))
    first.loc[stretch[-3:], LOSS] = baseline[stretch[-3:]] * np.array([3.0, 10.0, np.nan])  # the divergence
    raw = pd.concat([first, metrics.iloc[resume:]], ignore_index=True)
    with tempfile.TemporaryDirectory(prefix="forensics-corpus-") as tmp:
        path = Path(tmp) / f"{spec.name}.jsonl"
        write_metrics_jsonl(raw, path)
        table, _ = read_metrics([path])
    return table[list(METRIC_COLUMNS)].reset_index(drop=True), (resume, crash)


def _story_run(spec: RunSpec) -> Run:
    """The demo's static run (small scale, another seed): its own corrupted near-duplicates and labels."""
    samples, corrupt_ids, _ = build_samples("small", spec.seed)
    samples = _with_clusters(samples)
    plan = build_plan(samples, "static_sorted", spec.seed)
    plan = assign_steps(plan.drop(columns=[STEP]), grad_accum=1, world_size=1)
    plan = plan.sort_values([STEP, "micro"], kind="stable").reset_index(drop=True)
    params = LossModelParams()
    sim = simulate(plan, samples, corrupt_ids, params, seed=[spec.seed, 202, 0])
    tags = tag_steps(plan, samples, DEFAULT_BOUNDARIES)
    t = sim.terms
    base = (t["trend"] + t["composition"] + t["forgetting"]).to_numpy()
    excess = (t["corrupt"] + t["aftershock"]).to_numpy()
    labels = RunLabels()
    for ev in label_spikes(sim, plan, corrupt_ids, params, "static_sorted"):
        s = int(ev["step"])
        factor = float((base[s] + excess[s]) / base[s])
        if factor < MIN_FACTOR:  # the demo labels late recurrences from 1.4x; the corpus's spikes start at 1.6x
            continue
        labels.spikes.append(
            SpikeLabel(
                start=s,
                end=int(ev["end_step"]),
                peak=int(ev["peak_step"]),
                shape="story",
                factor=round(factor, 6),
                metric=LOSS,
                bucket=int(tags["bucket"].iloc[s]),
                cluster=int(tags[CLUSTER].iloc[s]),
                sample_ids=tuple(int(i) for i in ev["sample_ids"]),
            )
        )
    # every step the corrupted samples touched (recurrences too small to be labelled spikes included) is not clean
    touched = np.flatnonzero(excess > 0.01)
    if len(touched):
        cuts = np.flatnonzero(np.diff(touched) > 1)
        for a, b in zip(np.r_[touched[0], touched[cuts + 1]], np.r_[touched[cuts], touched[-1]], strict=True):
            labels.extents.append((int(a), int(b)))
    metrics = sim.metrics[list(METRIC_COLUMNS)].copy()
    return Run(
        spec=spec,
        metrics=metrics,
        tags=tags,
        plan=plan,
        samples=samples,
        labels=labels,
        baseline=base,
        factor=(base + excess) / base,
    )


# --- the corpus ----------------------------------------------------------------------------------------------------
def _kinds() -> list[tuple[str, int, int, dict]]:
    """(kind, runs, steps per run, RunSpec fields) of the full corpus; see :func:`corpus_specs`."""
    return [
        ("clean-gauss", 4, 12_000, dict()),
        ("clean-heavy", 4, 12_000, dict(noise="student_t")),
        ("jumpy-clean", 4, 10_000, dict(builder="static_sorted", bucket_scale=2.0)),
        ("level-shift", 4, 10_000, dict(level_shifts=2, spikes=("one_step", "few_steps"))),
        ("one-step", 4, 10_000, dict(spikes=("one_step",) * 7)),
        ("few-steps", 4, 10_000, dict(spikes=("few_steps",) * 7)),
        ("slow-rise", 3, 8_000, dict(spikes=("slow_rise",) * 6)),
        ("warmup", 4, 5_000, dict(spikes=("warmup", "warmup", "one_step"), warmup_tau=120.0)),
        ("grad-led", 3, 8_000, dict(spikes=("grad_led",) * 6)),
        ("nan", 3, 8_000, dict(nan_steps=5, spikes=("one_step", "few_steps", "one_step", "few_steps"))),
        ("resumed", 3, 8_000, dict(resumed=True, spikes=("one_step", "few_steps", "grad_led"))),
        ("grad-accum", 3, 5_000, dict(grad_accum=4, bucket_scale=2.0, spikes=("one_step", "few_steps", "one_step"))),
        ("story", 2, 0, dict(story=True)),
        (
            "long",
            2,
            30_000,
            dict(noise="student_t", level_shifts=1, spikes=("one_step", "few_steps", "slow_rise", "grad_led") * 4),
        ),
    ]


def corpus_specs(size: str = "full", seed: int = 0) -> list[RunSpec]:
    """The runs of a corpus ``size`` (``full``, ``quick`` or ``test``), varied deterministically by ``seed``.

    Each kind's runs alternate the builder, the noise level, the bucket effect (0 to 2.5x the demo's), the level
    and the warm-up; ``quick`` keeps one run per kind at half length (at most 6,000 steps), ``test`` five short runs.
    """
    if size not in ("full", "quick", "test"):
        raise ValueError(f"corpus size must be full, quick or test; got {size!r}")
    rng = np.random.default_rng([seed, 99])
    specs: list[RunSpec] = []
    kinds = _kinds()
    if size == "test":
        kinds = [
            ("t-spikes", 1, 3_000, dict(spikes=("one_step", "few_steps", "slow_rise", "grad_led"))),
            ("t-heavy", 1, 3_000, dict(noise="student_t", spikes=("one_step",), nan_steps=2)),
            ("t-warmup", 1, 2_500, dict(spikes=("warmup", "one_step"), warmup_tau=120.0, level_shifts=1)),
            ("t-resumed", 1, 2_500, dict(resumed=True, spikes=("one_step", "grad_led"))),
            ("t-accum", 1, 2_000, dict(grad_accum=4, bucket_scale=2.0, spikes=("one_step",))),
        ]
    for kind, n_runs, n_steps, extra in kinds:
        if size == "quick":
            n_runs, n_steps = 1, min(n_steps // 2, 6_000)
        for i in range(n_runs):
            run_seed = int(rng.integers(1, 2**31 - 1))
            if extra.get("story"):
                specs.append(RunSpec(name=f"{kind}-{i}", seed=1 + i + seed, n_steps=0, story=True))
                continue
            fields = dict(
                builder=("bucketed_shuffle", "static_sorted", "random_shuffle", "bucketed_shuffle")[i % 4],
                noise_sd=float(rng.uniform(0.01, 0.04)),
                bucket_scale=float((0.0, 0.5, 1.0, 2.0)[i % 4]),
                level=float(rng.uniform(0.8, 3.0)),
                initial_loss=float(rng.uniform(6.0, 10.5)),
                warmup_tau=float(rng.uniform(25.0, 80.0)),
                epochs=int((3, 4, 6)[i % 3]),
            )
            fields.update(extra)
            if fields.get("noise") == "student_t":
                fields["noise_sd"] = float(rng.uniform(0.006, 0.009))
            specs.append(RunSpec(name=f"{kind}-{i}", seed=run_seed, n_steps=n_steps, **fields))
    return specs


def iter_corpus(specs: Sequence[RunSpec], progress: Callable[[RunSpec], None] | None = None) -> Iterator[Run]:
    """The runs of ``specs`` one at a time (a full corpus does not fit in memory at once with its plans)."""
    for spec in specs:
        if progress is not None:
            progress(spec)
        yield make_run(spec)


# --- the long, metrics-only corpus -------------------------------------------------------------------------
#: Noise families of the long corpus: (noise, degrees of freedom, scale drifts with the lr).
LONG_FAMILIES: dict[str, tuple[str, float, bool]] = {
    "gauss": ("gaussian", np.inf, False),
    "t5": ("student_t", 5.0, False),
    "t3": ("student_t", 3.0, False),
    "t2.5": ("student_t", 2.5, False),
    "lr-drift": ("student_t", 4.0, True),
}
#: The long corpus's noise never moves the loss by this factor or more: a heavier excursion is a spike by any
#: definition. Below it the heavy families' own extremes reach 1.5-1.9x now and then (up to ~0.5 per 10K steps at
#: the top of their scale ranges), as real heavy-tailed noise does: a fixed ratio of 1.5 flags them.
LONG_NOISE_CAP = 2.0
#: Noise scale ranges per family (log space; Student-t: of the t draw), drawn per run: from easy to the regime where
#: a fixed 1.5x ratio starts to flag the noise.
LONG_SCALES = {
    "gauss": (0.01, 0.04),
    "t5": (0.01, 0.02),
    "t3": (0.007, 0.014),
    "t2.5": (0.005, 0.010),
    "lr-drift": (0.009, 0.018),
}
#: Shapes of the long corpus: the corpus's metrics-only shapes plus bursts (several one-step spikes close together).
LONG_SHAPES = ("one_step", "few_steps", "slow_rise", "grad_led", "burst")
EVAL_KEY = "eval/loss"


@dataclass(frozen=True)
class LongRunSpec:
    """One run of the long corpus: metrics only (no plan), hundreds of thousands of steps (see
    :func:`make_long_run`)."""

    name: str
    seed: int
    n_steps: int
    family: str
    noise_sd: float  # log-space scale of the noise (Student-t: of the t draw)
    level: float = 2.0
    initial_loss: float = 10.0
    warmup_tau: float = 300.0
    spikes: tuple[str, ...] = ()
    level_shifts: int = 2
    eval_every: int = 0  # >0: an eval row every this many steps, where the train loss is missing


@dataclass
class MetricsRun:
    """A run with metrics and labels only (what a user without a plan has)."""

    spec: LongRunSpec
    metrics: pd.DataFrame  # step, train/loss, grad_norm, lr (and eval/loss when eval rows are interleaved)
    labels: RunLabels
    baseline: np.ndarray
    tags: None = None
    plan: None = None
    samples: None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def n_steps(self) -> int:
        return len(self.metrics)

    def clean_mask(self) -> np.ndarray:
        return ~in_spans(self.metrics[STEP].to_numpy(np.int64), self.labels.spans())


def _long_profiles(shape: str, rng: np.random.Generator) -> list[_Profile]:
    """One profile, or several for a burst: 3-6 one-step spikes 4-15 steps apart, each its own label."""
    if shape != "burst":
        return [_profile(shape, rng)]
    out, at = [], 0
    for _ in range(int(rng.integers(3, 7))):
        p = _peak(rng, 1.6, 4.0)
        out.append(_Profile(np.array([at]), np.array([p]), np.array([1.0 + 2.0 * (p - 1.0)]), "burst"))
        at += int(rng.integers(4, 16))
    return out


def make_long_run(spec: LongRunSpec) -> MetricsRun:
    """A long metrics-only run; the same spec always gives the same table.

    ``loss = baseline * g * exp(noise)``: the baseline drops from ``initial_loss`` to ``level`` (time constant
    ``warmup_tau``) and declines 15% over the run, times persistent level shifts (x1.15-1.5 or x0.7-0.87, in clean
    spans); ``g`` is the spike profile (shapes of :data:`LONG_SHAPES`); the noise is Gaussian or Student-t of the
    family's degrees of freedom, its scale drifting with the learning rate (``0.3 + 0.7 lr / lr_max``) in the drift
    family, and clipped so that it never reaches :data:`LONG_NOISE_CAP` x. The lr warms up linearly over 2,000 steps
    then follows a cosine to 10%. Grad norm: a log-normal around a decaying level, times ``1 + 2 (g - 1)`` on a
    spike's steps (grad-led spikes: climbing before the loss moves). With ``eval_every``, every such step is an eval
    row: ``eval/loss`` set, the train loss missing (and that step outside the clean steps).
    """
    kind, dof, drift = LONG_FAMILIES[spec.family]
    rng = np.random.default_rng([spec.seed, 23])
    n = spec.n_steps
    s = np.arange(n, dtype=np.float64)
    base = spec.level * (1.0 - 0.15 * s / n) + (spec.initial_loss - spec.level) * np.exp(-s / spec.warmup_tau)
    lr = np.where(
        s < 2000, (s + 1) / 2000, 0.1 + 0.45 * (1 + np.cos(np.pi * np.clip((s - 2000) / max(n - 2000, 1), 0, 1)))
    )
    place = _Placer(np.random.default_rng([spec.seed, 24]), n)
    labels = RunLabels()
    shift = np.ones(n)
    for _ in range(spec.level_shifts):
        at = place.place(max(5000, n // 20), n - 2000)
        if at is None:
            continue
        f = rng.uniform(1.15, 1.5) if rng.random() < 0.5 else rng.uniform(0.7, 0.87)
        shift[at:] *= f
        labels.level_shifts.append((at, round(float(f), 4)))
    baseline = base * shift
    g = np.ones(n)
    grad_f = np.ones(n)
    for shape in spec.spikes:
        profs = _long_profiles(shape, rng)
        lo_off = min(int(p.offsets.min()) for p in profs)
        hi_off = max(int(p.offsets.max()) for p in profs)
        s0 = place.place(3000, n - 100, -lo_off, hi_off + POST_STEPS)
        if s0 is None:
            continue
        for prof in profs:
            at = s0 + prof.offsets
            g[at] = prof.g
            grad_f[at] = prof.grad
            vis = s0 + prof.visible()
            labels.spikes.append(
                SpikeLabel(
                    start=int(vis.min()),
                    end=int(vis.max()),
                    peak=int(at[np.argmax(prof.g)]),
                    shape=prof.shape,
                    factor=round(prof.peak_factor, 6),
                    metric=LOSS,
                )
            )
        labels.extents.append((s0 + lo_off, s0 + hi_off))
    eps = rng.standard_normal(n) if kind == "gaussian" else rng.standard_t(dof, n)
    scale = spec.noise_sd * ((0.3 + 0.7 * lr / lr.max()) if drift else 1.0)
    cap = np.log(LONG_NOISE_CAP) * 0.999
    noise = np.clip(eps * scale, -cap, cap)
    loss = baseline * g * np.exp(noise)
    grad = (0.3 + 2.0 * np.exp(-s / spec.warmup_tau)) * np.exp(0.15 * rng.standard_normal(n)) * grad_f
    cols = {STEP: np.arange(n, dtype=np.int64), LOSS: loss, GRAD_NORM: grad, LR: 3e-4 * lr}
    if spec.eval_every:
        ev = np.arange(spec.eval_every, n, spec.eval_every)
        ev = ev[~in_spans(ev, labels.spans())]
        eval_loss = np.full(n, np.nan)
        eval_loss[ev] = baseline[ev] * 1.05
        loss[ev] = np.nan
        grad[ev] = np.nan
        cols[EVAL_KEY] = eval_loss
        labels.nonfinite_steps = ev.tolist()
    labels.spikes.sort(key=lambda lab: lab.start)
    labels.extents.sort()
    return MetricsRun(spec=spec, metrics=pd.DataFrame(cols), labels=labels, baseline=baseline)


def long_corpus_specs(size: str = "long", seed: int = 0) -> list[LongRunSpec]:
    """The long corpus: per noise family of :data:`LONG_FAMILIES`, 10 runs of 220,000 steps (>= 2M clean steps per
    family), half of them with eval rows; ``long-quick``: 2 runs per family; ``long-test``: 1 run of 30,000 steps.

    Each run holds 12 one-step, 8 few-step, 6 slow-rise, 6 grad-led spikes and 4 bursts, and 2 level shifts.
    """
    sizes = {"long": (10, 220_000), "long-quick": (2, 220_000), "long-test": (1, 30_000)}
    if size not in sizes:
        raise ValueError(f"long corpus size must be one of {', '.join(sizes)}; got {size!r}")
    n_runs, n_steps = sizes[size]
    shapes = ("one_step",) * 12 + ("few_steps",) * 8 + ("slow_rise",) * 6 + ("grad_led",) * 6 + ("burst",) * 4
    if size == "long-test":
        shapes = shapes[::4]
    rng = np.random.default_rng([seed, 2323])
    specs = []
    for family in LONG_FAMILIES:
        for i in range(n_runs):
            sd = float(rng.uniform(*LONG_SCALES[family]))
            specs.append(
                LongRunSpec(
                    name=f"{family}-{i}",
                    seed=int(rng.integers(1, 2**31 - 1)),
                    n_steps=n_steps,
                    family=family,
                    noise_sd=sd,
                    level=float(rng.uniform(0.8, 3.0)),
                    initial_loss=float(rng.uniform(6.0, 11.0)),
                    warmup_tau=float(rng.uniform(100.0, 600.0)),
                    spikes=shapes,
                    eval_every=500 if i % 2 else 0,
                )
            )
    return specs
