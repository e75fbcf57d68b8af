"""The heavy-tailed family of the corpus: metrics-only runs whose noise is an untruncated Student-t.

The rest of the corpus truncates its heavy tails (:data:`~forensics.datasets.corpus.T_CAP`,
:data:`~forensics.datasets.corpus.LONG_NOISE_CAP`) so that its noise never reaches the size of a spike. Real noise is
not truncated, and a threshold fitted to a run's own tail can then call a clear jump ordinary. This family keeps the
tail whole: runs of 20,000 steps with multiplicative Student-t noise (3 degrees of freedom, 4% scale), a steep
warm-up descent, 14 labelled events and one level shift, judged from the metrics alone (no plan).

**How a run is made** (:func:`make_heavy_tail_run`; everything seeded by ``HeavyTailSpec.seed``):

- *Baseline*: ``level * (1 - 0.15 s / n) + (initial_loss - level) * exp(-s / warmup_tau)``, times one persistent level
  shift (x1.15-1.5 or x0.7-0.87, placed in the run's last three quarters; not a spike, and inside the clean steps).
- *Events* (14 labels): ``n_warmup_spikes`` one-step spikes of 1.6-2.0x inside the warm-up descent (steps 40 to
  ``3 * warmup_tau``), ``n_spikes`` one-step spikes of 1.6-2.0x after it, one slow rise to 2.5x over 12 steps (then
  halving back over 3), and one grad-norm-led event (the corpus's ``grad_led`` shape: the grad norm climbs x2 -> x300
  over 3-6 steps while the loss barely moves, then the loss jumps 1.6-4x and decays). Labels, spans and clean steps
  follow :class:`~forensics.datasets.corpus.RunLabels`.
- *Noise*: ``eps`` ~ Student-t with ``dof`` degrees of freedom, never clipped. What "4% scale" means is a parameter,
  ``scale_means``: ``"sd"`` (default) makes 4% the noise's standard deviation (the t draw's scale is
  ``scale * sqrt((dof - 2) / dof)``: 0.04 / sqrt(3) = 0.0231 at 3 degrees of freedom); ``"scale"`` makes 4% the
  t draw's own scale (its standard deviation is then sqrt(3) x 4% = 6.9%). Its form is another, ``noise_form``:
  ``"linear"`` (default) ``loss = baseline * g * (1 + s * eps)``, the literal multiplicative noise (its factor reaches
  0 or below for draws under ``-1 / s``: about once in 70,000 steps at the default, kept as logged); ``"log"``
  ``loss = baseline * g * exp(s * eps)``, the rest of the corpus's form (its upper tail is heavier still).
- *Grad norm*: a log-normal (sd 0.15) around a decaying level; it moves only with the grad-norm-led event (the
  one-step spikes and the slow rise are the loss's alone, as modded-nanogpt's are). ``lr``: a linear warm-up over
  ``warmup_tau`` steps, then a cosine to 10%.

What the noise itself reaches (the statistics of an untruncated t3): under the default reading one step in about
10,000 moves the loss by 1.5x or more, so a run of 20,000 steps holds such noise steps as often as not; under the
``"scale"`` reading about one step in 1,000 does. A rule that flags every 1.5x step finds every event of this family
and those noise steps with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from forensics.datasets.corpus import (
    POST_STEPS,
    MetricsRun,
    RunLabels,
    _peak,
    _Placer,
    _Profile,
    _profile,
)
from forensics.datasets.loss_model import GRAD_NORM, LOSS, LR
from forensics.evaluation.scoring import SpikeLabel
from forensics.schema import STEP

NOISE_FORMS = ("linear", "log")
SCALE_MEANINGS = ("sd", "scale")
#: The one-step spikes' peak factors (log-uniform).
SPIKE_FACTORS = (1.6, 2.0)
#: A noise step that moves the loss by this factor or more is not clean: it is as large as the jump any spike rule
#: asks (the detector's ``ratio``, 1.5x), and from 1.5x to the labelled spikes' 1.6x no rule can tell it from one of
#: them. Such steps are neither labelled nor clean (a grey zone: flagging one is neither a hit nor a false event).
NOISE_SPIKE_FACTOR = 1.5
#: The slow rise: this many steps up to this factor.
SLOW_RISE_STEPS, SLOW_RISE_FACTOR = 12, 2.5


@dataclass(frozen=True)
class HeavyTailSpec:
    """One run of the heavy-tailed family (see the module docstring for what each field does)."""

    name: str
    seed: int
    n_steps: int = 20_000
    dof: float = 3.0
    scale: float = 0.04
    scale_means: str = "sd"
    noise_form: str = "linear"
    level: float = 2.0
    initial_loss: float = 9.0
    warmup_tau: float = 120.0
    n_warmup_spikes: int = 2
    n_spikes: int = 10
    level_shifts: int = 1

    def __post_init__(self) -> None:
        if self.noise_form not in NOISE_FORMS or self.scale_means not in SCALE_MEANINGS or self.dof <= 2:
            raise ValueError(
                f"bad HeavyTailSpec {self.name}: noise_form {self.noise_form!r} (one of {NOISE_FORMS}), "
                f"scale_means {self.scale_means!r} (one of {SCALE_MEANINGS}), dof {self.dof} (> 2)"
            )

    @property
    def family(self) -> str:
        return "heavy-tail"

    @property
    def t_scale(self) -> float:
        """The scale the t draw is multiplied by."""
        return self.scale * np.sqrt((self.dof - 2.0) / self.dof) if self.scale_means == "sd" else self.scale


def _slow_rise() -> _Profile:
    up = 1.0 + (SLOW_RISE_FACTOR - 1.0) * np.arange(1, SLOW_RISE_STEPS + 1) / SLOW_RISE_STEPS
    down = 1.0 + (SLOW_RISE_FACTOR - 1.0) * 0.5 ** np.arange(1, 4)
    g = np.concatenate([up, down])
    return _Profile(np.arange(len(g)) - (SLOW_RISE_STEPS - 1), g, np.ones(len(g)), "slow_rise")


def _one_step(rng: np.random.Generator, shape: str) -> _Profile:
    p = _peak(rng, *SPIKE_FACTORS)
    return _Profile(np.array([0]), np.array([p]), np.ones(1), shape)


def make_heavy_tail_run(spec: HeavyTailSpec) -> MetricsRun:
    """One run of the family; the same spec always gives the same table."""
    rng = np.random.default_rng([spec.seed, 41])
    n = spec.n_steps
    s = np.arange(n, dtype=np.float64)
    base = spec.level * (1.0 - 0.15 * s / n) + (spec.initial_loss - spec.level) * np.exp(-s / spec.warmup_tau)
    place = _Placer(np.random.default_rng([spec.seed, 42]), n)
    labels = RunLabels()
    shift = np.ones(n)
    for _ in range(spec.level_shifts):
        at = place.place(n // 4, n - 2000)
        if at is None:
            continue
        f = rng.uniform(1.15, 1.5) if rng.random() < 0.5 else rng.uniform(0.7, 0.87)
        shift[at:] *= f
        labels.level_shifts.append((at, round(float(f), 4)))
    baseline = base * shift
    g = np.ones(n)
    grad_f = np.ones(n)
    warm_end = max(int(3 * spec.warmup_tau), 120)
    profiles = (
        [_one_step(rng, "warmup") for _ in range(spec.n_warmup_spikes)]
        + [_one_step(rng, "one_step") for _ in range(spec.n_spikes)]
        + [_slow_rise(), _profile("grad_led", rng)]
    )
    for prof in profiles:
        before, after = int(-prof.offsets.min()), int(prof.offsets.max()) + POST_STEPS
        if prof.shape == "warmup":
            s0 = place.place(40, warm_end, before, after, gap=40)
        else:
            s0 = place.place(warm_end + 100, n - 100, before, after)
        if s0 is None:
            continue
        at = s0 + prof.offsets
        g[at] = prof.g
        grad_f[at] = prof.grad  # 1 but for the grad-norm-led event
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
        labels.extents.append((int(at.min()), int(at.max())))
    eps = rng.standard_t(spec.dof, n)
    noise = spec.t_scale * eps
    factor = 1.0 + noise if spec.noise_form == "linear" else np.exp(noise)
    loss = baseline * g * factor
    # noise as large as a spike rule's jump is a spike by the tool's contract, though no event put it there
    labels.noise_spikes = np.flatnonzero((factor >= NOISE_SPIKE_FACTOR) & (g == 1.0)).tolist()
    grad = (0.3 + 2.0 * np.exp(-s / spec.warmup_tau)) * np.exp(0.15 * rng.standard_normal(n)) * grad_f
    lr = np.where(
        s < spec.warmup_tau,
        (s + 1) / spec.warmup_tau,
        0.1 + 0.45 * (1 + np.cos(np.pi * np.clip((s - spec.warmup_tau) / n, 0, 1))),
    )
    labels.spikes.sort(key=lambda lab: lab.start)
    labels.extents.sort()
    metrics = pd.DataFrame({STEP: np.arange(n, dtype=np.int64), LOSS: loss, GRAD_NORM: grad, LR: 3e-4 * lr})
    return MetricsRun(spec=spec, metrics=metrics, labels=labels, baseline=baseline)


def heavy_tail_specs(n_runs: int = 6, seed: int = 0, **fields) -> list[HeavyTailSpec]:
    """``n_runs`` runs of the family, varied by ``seed`` (level 1.5-3, initial loss 7-11, warm-up time constant
    80-200 steps); ``fields`` set the other knobs for every run (``scale_means="scale"``, ``noise_form="log"``)."""
    rng = np.random.default_rng([seed, 4141])
    return [
        HeavyTailSpec(
            name=f"heavy-tail-{i}",
            seed=int(rng.integers(1, 2**31 - 1)),
            level=float(rng.uniform(1.5, 3.0)),
            initial_loss=float(rng.uniform(7.0, 11.0)),
            warmup_tau=float(rng.uniform(80.0, 200.0)),
            **fields,
        )
        for i in range(n_runs)
    ]
