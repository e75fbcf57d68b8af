"""The compiled spike kernel is held to the plain-Python reference of the same rule (tests/spike_reference.py).

Random series (Gaussian or heavy-tailed noise on a decaying loss, spikes of every size, bursts, level shifts, NaN),
with and without buckets, random parameters and random chunkings: every row's status, baseline and score, and every
finding, must be the same.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.detect import SpikeDetector
from forensics.detect.spikes.events import event_finding
from forensics.detect.spikes.kernel import STATUS_NAMES
from tests.spike_reference import reference_events

LOSS = "loss"


def random_run(seed: int, n: int, with_buckets: bool, heavy: bool) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    rng = np.random.default_rng(seed)
    s = np.arange(n)
    level = 1.0 + 4.0 * np.exp(-s / rng.uniform(10, 100))
    noise = rng.standard_t(3, n) if heavy else rng.standard_normal(n)
    x = level * (1 + rng.uniform(0.005, 0.05) * noise)
    for _ in range(rng.integers(0, 8)):  # spikes and short bursts of every size, some below the thresholds
        at = rng.integers(0, n)
        x[at : at + rng.integers(1, 4)] *= rng.uniform(1.1, 4.0)
    if rng.random() < 0.4:  # a level shift
        x[rng.integers(n // 3, n) :] += rng.uniform(0.3, 2.0)
    x[rng.choice(n, rng.integers(0, 3))] = rng.choice([np.nan, np.inf])
    tags = None
    if with_buckets:
        k = int(rng.integers(2, 6))
        b = rng.integers(0, k, n)
        x = x + rng.uniform(0, 0.5, k)[b]
        tags = pd.DataFrame({"step": s, "bucket": b})
    steps = np.cumsum(rng.integers(1, 3, n))  # gaps in the steps
    if tags is not None:
        tags["step"] = steps
    return pd.DataFrame({"step": steps, LOSS: x}), tags


def _reference_findings(det: SpikeDetector, metrics: pd.DataFrame, tags: pd.DataFrame | None, support=None):
    det.reset()
    det.metric_ = LOSS
    p = {name: det.params_[0][name].item() for name in det.params_.dtype.names}
    grouped = tags is not None
    p["use_raw"] = int(grouped)
    p["z_large"] = det.z_large if grouped else np.inf
    p["has_support"] = int(support is not None)
    buckets = det._groups(metrics, metrics["step"].to_numpy(), tags)
    det._add_support(support)
    supported = det._supported(metrics["step"].to_numpy())
    events, status, base, score = reference_events(
        metrics["step"].to_numpy(), metrics[LOSS].to_numpy(), buckets, p, det.tail_window, supported
    )
    return [event_finding(det, e) for e in events], status, base, score


def _events(found) -> list[dict]:
    # the two-sided judgement of the warm-up is plain Python in spikes/events.py, outside the kernel: not compared here
    return sorted(
        (
            f.to_dict()
            for f in found
            if f.kind in ("spike", "level_shift") and f.details.get("judged_by") != "two_sided"
        ),
        key=lambda d: (d["step"], d["kind"]),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(20, 700),
    with_buckets=st.booleans(),
    heavy=st.booleans(),
    window=st.sampled_from([8, 16, 32, 64]),
    confirm=st.integers(1, 6),
    max_duration=st.integers(2, 30),
    trend=st.booleans(),
    min_periods=st.integers(2, 40),
    false_rate=st.sampled_from([None, 0.1, 10.0, 300.0]),
    tail_window=st.sampled_from([5, 40]),
    cuts=st.lists(st.integers(min_value=1, max_value=699), max_size=8, unique=True),
    n_support=st.sampled_from([None, 0, 5, 60]),
)
def test_kernel_gives_the_reference_findings_under_any_chunking(
    seed,
    n,
    with_buckets,
    heavy,
    window,
    confirm,
    max_duration,
    trend,
    min_periods,
    false_rate,
    tail_window,
    cuts,
    n_support,
):
    """``n_support``: steps where a supporting metric (the grad norm) was flagged; None: the run has none."""
    metrics, tags = random_run(seed, n, with_buckets, heavy)
    support = (
        None
        if n_support is None
        else np.sort(np.random.default_rng(seed).choice(metrics["step"].to_numpy(), min(n_support, n), replace=False))
    )
    params = dict(
        window=window,
        confirm=confirm,
        max_duration=max_duration,
        trend=trend,
        min_periods=min_periods,
        bucket_window=16,
        min_bucket_periods=3,
        false_rate=false_rate,
        tail_window=tail_window,
        min_peaks=min(5, tail_window),
        tail_start=1.0,
    )
    det = SpikeDetector(LOSS, **params)
    det.reset()
    online = []
    bounds = [0, *sorted(c for c in cuts if c < n), n]
    for a, b in zip(bounds, bounds[1:]):
        part = metrics.iloc[a:b]
        steps = part["step"].to_numpy()
        chunk_support = None if support is None else support[(support >= steps[0]) & (support <= steps[-1])]
        online += det.update(part, tags, chunk_support)  # as the grad norm's detector gives them, chunk by chunk
    online += det.finish()

    ref_found, status, base, score = _reference_findings(SpikeDetector(LOSS, **params), metrics, tags, support)
    assert _events(online) == _events(ref_found)

    trace = SpikeDetector(LOSS, **params).trace(metrics, tags, support)
    assert list(trace["status"]) == [STATUS_NAMES[s] for s in status]
    np.testing.assert_array_equal(trace["baseline"].to_numpy(), base)
    np.testing.assert_array_equal(trace["score"].to_numpy(), score)


def test_reference_finds_the_obvious_spike_and_the_level_shift():
    """The reference is a rule of its own, not a mirror: on a plain case it gives the answer a reader expects."""
    rng = np.random.default_rng(3)
    n = 600
    x = 2.0 * (1 + 0.01 * rng.standard_normal(n))
    x[300] = 6.0
    x[450:] += 3.0
    p = dict(
        z=6.0,
        ratio=1.5,
        min_jump=0.0,
        z_large=np.inf,
        ratio_large=1.75,
        window=64,
        half=32,
        min_old=16,
        min_periods=32,
        max_duration=50,
        confirm=5,
        bucket_window=64,
        min_bucket_periods=5,
        queue=52,
        use_raw=0,
        alpha=0.0,
        tail_start=2.0,
        min_peaks=50,
    )
    events, status, _, _ = reference_events(np.arange(n), x, np.full(n, -1), p)
    assert [(e["kind"], e["start"]) for e in events] == [(1, 300), (2, 450)]
    assert events[0]["peak"] == 300 and 450 <= events[1]["peak"] < 500
    assert events[0]["x"] == 6.0 and abs(events[0]["base"] - 2.0) < 0.02
    assert abs(events[1]["new_level"] - 5.0) < 0.05
    assert (status[:32] == 3).all()  # the warm-up is learned from, not judged
