"""Spikes on any metric: a robust causal baseline, two conditions together, events, level shifts, buckets.

**The baseline** of step ``t`` is built only from earlier *accepted* values (a flagged value never enters its own
baseline, nor any later one): the trend ``T`` is the median of the most recent ``window // 2`` accepted values,
extrapolated to step ``t`` along the line through that median and the median of the older half (so it follows a
steep warm-up descent instead of lagging above it), and clamped to the recent half's range (so it never overshoots
where a descent flattens). With ``trend=False`` it is the plain median of the last ``window`` accepted values.

**Two conditions together** flag a step:

- a robust score ``(value - baseline) / (MAD_TO_SD * MAD) >= z`` (``forensics.stats.MAD_TO_SD``), the MAD being the
  median absolute residual of the last ``window`` accepted steps about their baselines (the local noise);
- a relative jump ``value - baseline >= (ratio - 1) * |baseline|`` (and ``>= min_jump``, an absolute margin for
  metrics near 0).

The score alone fires on heavy-tailed noise (a Student-t with 3 degrees of freedom exceeds 6 robust SDs every few
hundred steps); the jump alone fires on noisy low-level metrics. Together, a 0.9 -> 4 jump always fires and noise at
a few percent of the level does not. Only upward moves are spikes.

**Events.** Consecutive flagged rows form one event: ``step`` (start), ``peak_step`` (highest score), ``end_step``,
``recovery_step`` (the first accepted row after it). NaN/inf rows are reported as ``nonfinite`` findings
(:mod:`forensics.detect.rules.nonfinite`), enter no window and neither extend nor end an event.

**Level shifts are not spikes.** A spike returns: an event is confirmed as a spike once the median of the ``confirm``
accepted values after it lies closer to its baseline than to its peak. An event that does not return, or that lasts
``max_duration`` flagged rows, or whose ``confirm`` values do not arrive within ``max_duration`` judged rows, is the
start of a new level (a new data mix, an lr restart): the baseline re-anchors to the values since it started and one
``level_shift`` finding is reported (never in ``spikes``), covering every event still awaiting confirmation.

**Online.** ``update(rows)`` reports an event once it is final: a spike ``confirm`` accepted rows after it ends
(a few steps), a level shift when it is declared, a non-finite step at once. What is open at the end of a chunk is
pending (``finish()`` shows it as it would be reported if the run ended there). Any chunking gives the same findings.

**Buckets** (with ``tags``: a table keyed by ``step`` with a ``group`` column, ``bucket`` by default). Each step is
judged against the baseline of its own bucket, ``T + offset``: the offset is the median of ``value - T`` over the
bucket's last ``bucket_window`` accepted steps, centred on the mean offset of the buckets seen so far, and the trend
``T`` is built from bucket-adjusted values (``value - offset``), so it does not jump with the batch mix. Everything is
causal, learned from the accepted history only; this is the spike rule run on the bucket-adjusted series. A step
high only because of its bucket is therefore not flagged; when a detector without tags would have flagged it (against
the plain median of the last ``window`` raw values and the MAD about it) it is counted as ``expected_for_bucket``
(one summary finding per bucket from ``finish``, never in ``spikes``). A bucket's first ``min_bucket_periods`` steps
after the warm-up are learned from but not judged (its level is not known yet); steps without a bucket are judged
against the trend alone.

**Short and fresh series.** The causal rule needs ``min_periods`` accepted values before it judges anything; the
steps of that warm-up (all of them in a series shorter than its history, such as a 13-row excerpt pasted around a
spike) are judged instead by a two-sided rule against the warm-up span itself, resolved in ``finish()`` (so online
and offline still agree): a warm-up step is flagged when, against ``base = max(leave-one-out median of the span,
median of the up to 3 unflagged steps just before it)``, both conditions hold with the span's leave-one-out MAD as the
noise scale. The median of the steps before it keeps a warm-up descent from looking like a spike (a spike rises from
what came before; the first step has nothing before it and is never flagged); the leave-one-out median and MAD
keep the spike itself out of what it is judged against. It needs at least ``SHORT_MIN_ROWS`` finite values. Its
findings carry ``details["judged_by"] = "two_sided"`` and ``details["two_sided_span"]`` (the warm-up's first and
last step); every other finding was judged by the causal rule (``"causal"``).

**Calibrated thresholds** (``false_rate``, default 0.05 expected false events per 10,000 judged steps; ``None``: the
fixed score ``z`` alone; the streaming extreme-value thresholds of SPOT/DSPOT, Siffer et al., KDD 2017). The scores
``u = (x - base) / scale`` of judged steps above ``tail_start`` (3 noise units) are the tail's peaks; over the last
``tail_window`` peaks, ``p0`` = peaks / judged steps since the oldest of them, and a generalized Pareto (shape ``xi``
in [-0.5, 0.95], scale ``sigma``) is fitted to the excesses ``u - tail_start`` by *trimmed* probability-weighted
moments: only the lowest 99% of the sorted peaks are read, so the far tail weighs by its count, not its size. The
score threshold is the one the fit says is exceeded with probability ``alpha = false_rate / 10,000``::

    z_tail = tail_start + sigma / xi * ((alpha / p0) ** -xi - 1)

refitted at every new peak (causal: judged history only, so online = offline). *Robust to the spikes*: a peak at or
above the censoring limit (``z_tail`` itself for rates up to 1 per 10K, the fit's 1-per-10K score for higher ones;
``z`` before the first fit) is a censored peak, counted with its size unknown, and a run of such rows is one peak
(noise this rare comes alone); what the fixed rule calls a spike (``z`` and 1.5x) never enters the tail. Measured on
clean runs of five noise families (Gaussian, t5, t3, t2.5, lr-drifting t4), the rate asked is the rate found within
1.6x at 0.1, 1 and 10 per 10K (``bench_detection_quality.py --calibration``; the observed-maximum rule below
counted apart where the noise itself moved the loss 1.5x). With fewer than ``min_peaks`` peaks the
fallback is the fixed rule (``z`` and at least a 1.5x jump).

*A fit that extrapolates yields to what the run has shown.* Where noise is heavy-tailed (untruncated Student-t), the
fitted tail can ask a score far beyond anything the run's clean history ever reached (a t3 run of 20K steps: ~150-200
noise units asked, ~15-20 seen), and every 1.6-2x spike would then pass as ordinary. So the run's largest clean score
so far (``clean_max``: every accepted judged row's score, but a row the fixed rule calls a spike counts only when it
came alone, so a slow rise cannot teach the maximum its size one step at a time) bounds the extrapolation: when the
tail's threshold exceeds ``clean_max`` (``OBSERVED_EXTRAPOLATION`` x), a row that passes the fixed rule (``z`` and a
1.5x jump) with a score of at least ``OBSERVED_MAX_FACTOR`` (1.05) x ``clean_max`` is flagged: a jump no step of the
run's clean history came near. Such a finding says so in its evidence and in ``details.tail`` (``{fitted,
threshold, observed_max, extrapolating, decided_by}``, ``decided_by`` one of ``fixed_rule``, ``tail``,
``observed_max``). On Gaussian-like noise the fitted threshold sits within the observed scores and this never fires.

**A constant is no baseline.** A metric whose recent history (the trend's recent half, at least two values) is one
constant (a grad norm logged as 0.000 while it is not computed) has no noise scale, and its first real value would
score ~1e16. At the first value that moves off such a history the history starts over (status ``restarted``): every
window of accepted values empties, the next ``min_periods`` values are a warm-up again (judged by the two-sided rule
from there), and nothing is flagged at the move itself. Events, the tail and ``clean_max`` are kept (noise units,
which the constant never set).

**Joint evidence** (a supporting metric, the grad norm, judged first: its flagged steps are passed as ``support``).
The jump condition (``ratio``, ``min_jump``) always applies; the score must then be:

- no supporting metric in the run: at least ``min(z, z_tail)`` (the effect size decides, as the fixed rule does,
  and a light tail may lower the score it needs);
- the grad norm flagged at this step or up to ``JOINT_LEAD`` steps before: at least ``min(z, z_joint)``, ``z_joint``
  the tail's score for ``alpha * joint_factor`` (200x), never commoner than 1e-3 (the cap that binds at the default
  rate): two metrics agreeing make a smaller loss move real. Before the tail is fitted (``min_peaks`` peaks: ~37K
  steps of Gaussian noise, so every shorter run) ``z_joint`` is the Gaussian's score for that rate (3.09 at 1e-3);
  the fallback's 1.5x jump still applies. Only a grad-norm flag opens this door, and those are rare at the
  grad norm's own rate, so the loss's false events grow by at most about one per false grad-norm flag;
- the grad norm logged but quiet: at least ``z_tail`` (a loss move the grad norm ignored is a spike only when the
  run's own tail calls it rare: the heavy-tailed noise's own 1.5-1.9x extremes are not).

**Per row**, in one place (finite value ``x``, bucket ``b`` or -1)::

    m_b   = median of (x - T) over the last bucket_window accepted steps of bucket b
    off   = m_b - mean of m_k over the buckets known so far                      (0 without a bucket)
    T     = trend of the last W accepted values of y = x - off (see "The baseline")
    base  = T + off
    scale = MAD_TO_SD * median |x - base| over the last W accepted steps            (MAD about the baseline)
    flag  = (x - base) / scale >= z  and  x - base >= max((ratio - 1) * |base|, min_jump)
            (or the same with z_large and ratio_large, with buckets)

The offsets are centred on their mean so that trend and offsets cannot drift together (``T + c`` and ``off - c``
would explain the data equally well). Flagged rows stay out of every window. A young bucket's offset (fewer than
``bucket_window`` steps) is not trusted alone: a step flagged only because that offset sits below the trend is not
flagged (its bucket learns from it); nor is one flagged while the trend itself sits below the run's level (the
median of the last ``window`` raw values is above the thresholds against ``T``: offsets a rare bucket learned in the
warm-up's steep descent pulled the mean offset, and the trend with it, down) when the view without tags would not
flag it. Without the second rule every later step of the rare buckets fires against that trend and, never accepted,
none of their offsets is ever corrected.

This docstring is the rule's one description. ``tests/spike_reference.py`` is the same rule in plain Python (read it
top to bottom); the inner loop is compiled with numba (:mod:`forensics.detect.spikes.kernel`) and a property test holds
it to the reference. The kernel's state is carried between ``update`` calls, which is what makes online and
offline answers identical.

The package, one job a module: :mod:`~forensics.detect.spikes.kernel` (the compiled loop and its state),
:mod:`~forensics.detect.spikes.detector` (:class:`SpikeDetector`: one metric, its parameters, online = offline),
:mod:`~forensics.detect.spikes.events` (kernel events -> findings; the two-sided rule of short spans),
:mod:`~forensics.detect.spikes.driver` (the joint, grad-norm-first loop over a run's analysed metrics, with its
confidence and logging windows: the one place that builds detectors, called by the audit, ``live/`` and ``watch``),
:mod:`~forensics.detect.spikes.rule` (the audit's rule).
"""

from __future__ import annotations

from forensics.detect.spikes.detector import SpikeDetector
from forensics.detect.spikes.driver import SpikeDriver, add_confidence, detect_spikes, joint_order
from forensics.detect.spikes.kernel_state import JOINT_LEAD

__all__ = ["JOINT_LEAD", "SpikeDetector", "SpikeDriver", "add_confidence", "detect_spikes", "joint_order"]
