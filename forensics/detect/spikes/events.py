"""Kernel events as findings, and the two-sided rule that judges a short or fresh span against itself.

The kernel (:mod:`forensics.detect.spikes.kernel`) emits events as records; this module words them: a ``spike`` or
a ``level_shift`` with its numbers and evidence sentences, one ``expected_for_bucket`` summary per bucket, and the
warm-up span's own events ("Short and fresh series" in :mod:`forensics.detect.spikes`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from forensics.detect.findings import INFO, Finding
from forensics.detect.spikes import kernel_state as K
from forensics.detect.spikes.kernel_state import OBSERVED_MAX_FACTOR
from forensics.stats import robust_sd

if TYPE_CHECKING:
    from forensics.detect.spikes.detector import SpikeDetector

#: Finite warm-up values the two-sided rule needs before it judges a short span (fewer: nothing can be said).
SHORT_MIN_ROWS = 5
#: Steps before a warm-up step whose median it must rise above (the two-sided rule).
SHORT_LEFT = 3
#: ``details.tail.decided_by`` of a kernel event, by :data:`~forensics.detect.spikes.kernel_state.BY_FIXED` etc.
DECIDED_BY = ("fixed_rule", "tail", "observed_max")


def two_sided_events(
    values: np.ndarray, z: float, ratio: float, min_jump: float
) -> list[tuple[int, int, int, float, float, float]]:
    """Events of a short span judged against the span itself (the rule in the package docstring, "Short and fresh
    series"): ``(first, last, peak, baseline, scale, score)`` per run of consecutive flagged indices."""
    n = len(values)
    if n < SHORT_MIN_ROWS:
        return []
    flagged: list[tuple[int, float, float, float]] = []
    before: list[float] = [float(values[0])]  # the unflagged values so far: a spike's own tail is not its level
    for i in range(1, n):
        others = np.delete(values, i)
        med = float(np.median(others))
        base = max(med, float(np.median(before[-SHORT_LEFT:])))
        scale = robust_sd(others, floor=1e-9 * abs(base) + 1e-12)
        r = float(values[i]) - base
        if r > 0 and r / scale >= z and r >= max((ratio - 1.0) * abs(base), min_jump):
            flagged.append((i, base, scale, r / scale))
        else:
            before.append(float(values[i]))
    events: list[tuple[int, int, int, float, float, float]] = []
    for i, base, scale, score in flagged:
        if events and events[-1][1] == i - 1:
            first, _, peak, b0, s0, z0 = events[-1]
            events[-1] = (first, i, *((i, base, scale, score) if score > z0 else (peak, b0, s0, z0)))
        else:
            events.append((i, i, i, base, scale, score))
    return events


def two_sided_findings(det: SpikeDetector) -> list[Finding]:
    """The detector's warm-up span judged against itself."""
    steps, values = det.warmup_steps_, np.asarray(det.warmup_values_, dtype=np.float64)
    out = []
    for first, last, peak, base, scale, z in two_sided_events(values, det.z, det.ratio, det.min_jump):
        ev = {
            "kind": K.EV_SPIKE,
            "start": steps[first],
            "end": steps[last],
            "peak": steps[peak],
            "recovery": steps[last + 1] if last + 1 < len(steps) else -1,
            "n_rows": last - first + 1,
            "bucket": det.warmup_groups_[peak],
            "is_open": int(last + 1 >= len(steps)),
            "n_post": 0,
            "x": float(values[peak]),
            "base": base,
            "z": z,
            "scale": scale,
            "offset": 0.0,
            "post": float("nan"),
            "new_level": float("nan"),
            "decided_by": K.BY_FIXED,
            "z_thr": det.z,
            "clean_max": float("nan"),
        }
        f = event_finding(det, ev)
        f.details["judged_by"] = "two_sided"
        f.details["two_sided_span"] = [steps[0], steps[-1]]
        f.details.pop("trend", None)
        f.details.pop("bucket_offset", None)
        f.details.pop("tail", None)
        f.evidence[1:] = [
            f"Step {steps[peak]} lies in the first {len(steps)} steps, before the causal baseline had "
            f"{det.min_periods} values to judge by: it was judged against the span itself (steps "
            f"{steps[0]}-{steps[-1]}, its median without this step, the steps just before it, and the span's "
            f"noise scale), a two-sided rule."
        ]
        out.append(f)
    return out


def expected_findings(det: SpikeDetector) -> list[Finding]:
    """One ``expected_for_bucket`` summary per bucket whose steps were high only for their bucket."""
    out = []
    for g, rec in sorted(det.expected_.items()):
        offset = K.bucket_offset(det.state_, g, det.min_bucket_periods)
        out.append(
            Finding(
                kind="expected_for_bucket",
                step=rec["first_step"],
                end_step=rec["last_step"],
                metric=det.metric_,
                value=rec["max_value"],
                severity=INFO,
                tags={det.group: g},
                evidence=[
                    f"{rec['n_steps']} steps of {det.group} {g} (steps {rec['first_step']}-"
                    f"{rec['last_step']}) were above the run's trend by more than the spike thresholds (up "
                    f"to {rec['max_value']:.4g}) but within their {det.group}'s own baseline, which sits "
                    f"{offset:+.4g} from the trend: expected for their {det.group}, not spikes."
                ],
                next_step=None,
                details={
                    "n_steps": rec["n_steps"],
                    "example_steps": rec["examples"],
                    "group": det.group,
                    "offset": offset,
                },
            )
        )
    return out


def event_finding(det: SpikeDetector, ev) -> Finding:
    """A kernel event (a record of :data:`~forensics.detect.spikes.kernel.EVENT`, or a dict of its fields)."""
    metric = det.metric_
    kind = "spike" if ev["kind"] == K.EV_SPIKE else "level_shift"
    start, end, peak = int(ev["start"]), int(ev["end"]), int(ev["peak"])
    recovery = int(ev["recovery"])
    n_rows, bucket, is_open = int(ev["n_rows"]), int(ev["bucket"]), bool(ev["is_open"])
    x, base, z = float(ev["x"]), float(ev["base"]), float(ev["z"])
    scale, off = float(ev["scale"]), float(ev["offset"])
    ratio = x / base if base > 0 else float("nan")
    details = {
        "n_steps": n_rows,
        "recovery_step": recovery if recovery >= 0 else None,
        "ratio": ratio,
        "noise_scale": scale,
        "judged_by": "causal",
        "thresholds": {"z": det.z, "ratio": det.ratio, "min_jump": det.min_jump, "false_rate": det.false_rate},
    }
    tail_note = None
    if det.false_rate is not None:
        details["tail"], tail_note = _tail_details(ev, z)
    tags = {}
    if bucket >= 0:
        tags[det.group] = bucket
        details["trend"] = base - off
        details["bucket_offset"] = off
    jump = f"{ratio:.2f}x the baseline" if base > 0 else f"{x - base:+.4g} above the baseline"
    rise = (
        f"{metric} rose to {x:.4g} at step {peak} against a baseline of {base:.4g}: {jump} and "
        f"{z:.1f} times the local noise scale of {scale:.3g} (thresholds: {det.ratio}x"
        f"{f', +{det.min_jump:g}' if det.min_jump else ''} and {det.z})."
    )
    if kind == "level_shift":
        new_level = float(ev["new_level"])
        details["new_level"] = new_level
        details["support"] = {"moved": True}
        return Finding(
            kind=kind,
            step=start,
            end_step=end,
            peak_step=peak,
            metric=metric,
            value=x,
            baseline=base,
            score=z,
            severity=INFO,
            tags=tags,
            details=details,
            evidence=[
                rise,
                f"It did not come back: from step {start} {metric} stayed near {new_level:.4g}, so "
                f"this is a new level (a new data mix, an lr change), not a spike; the baseline "
                f"re-anchored to it at step {end}.",
            ],
            next_step=f"Check what changed at step {start} (data mix, learning-rate schedule, a restart).",
        )
    post = float(ev["post"])
    details["post_level"] = post
    details["open"] = is_open
    span = f"step {start}" if start == end else f"steps {start}-{end} ({n_rows} flagged steps)"
    if is_open:
        after = f"The event spans {span} and was still open at the end of the data."
    else:
        after = (
            f"The event spans {span}; {metric} was back within the thresholds at step {recovery}, and "
            f"the next {int(ev['n_post'])} accepted values had a median of {post:.4g}."
        )
    evidence = [rise, after]
    if tail_note:
        evidence.append(tail_note)
    if bucket >= 0:
        evidence.append(
            f"Judged against the baseline of its own {det.group} {bucket}: the run's trend "
            f"{base - off:.4g} plus the {det.group}'s offset {off:+.4g}."
        )
    details["support"] = {"moved": True}  # its severity comes from the evidence (detect/causes/severity.py)
    return Finding(
        kind=kind,
        step=start,
        end_step=end,
        peak_step=peak,
        metric=metric,
        value=x,
        baseline=base,
        score=z,
        severity=INFO,
        tags=tags,
        evidence=evidence,
        details=details,
        next_step=(
            f"Look at the samples of step {peak}'s batch (suspect_samples) and replay the step from the "
            f"checkpoint before it to confirm the cause; without a plan, record or rebuild it "
            f"(--plan) to name the batch."
        ),
    )


def _tail_details(ev, z: float) -> tuple[dict, str | None]:
    """How the calibrated rule decided an event's peak row (``details.tail``), and the evidence sentence when the
    fitted tail extrapolated and the run's largest clean score decided instead ("Calibrated thresholds" in
    :mod:`forensics.detect.spikes`)."""
    decided = int(ev["decided_by"])
    fitted = decided != K.BY_FIXED
    z_thr, observed = float(ev["z_thr"]), float(ev["clean_max"])
    seen = bool(np.isfinite(observed))
    tail = {
        "fitted": fitted,
        "threshold": z_thr if np.isfinite(z_thr) else None,
        "observed_max": observed if seen else None,
        "extrapolating": bool(fitted and seen and z_thr > observed),
        "decided_by": DECIDED_BY[decided],
    }
    if decided != K.BY_OBSERVED_MAX:
        return tail, None
    return tail, (
        f"The run's fitted noise tail asked a score of {z_thr:.1f}, beyond the largest score of its clean "
        f"history so far ({observed:.1f}): the fit was extrapolating past anything the run had shown, so "
        f"the fixed rule decided, with a score of {z:.1f}, at least {OBSERVED_MAX_FACTOR:g}x that "
        f"maximum."
    )
