"""The spike kernel's calibrated threshold, compiled: the generalized Pareto tail of the run's own scores, fitted
by trimmed probability-weighted moments ("Calibrated thresholds" and "Joint evidence" in
:mod:`forensics.detect.spikes`), and the test of a row against the thresholds.
"""

from __future__ import annotations

import numpy as np

from forensics.compiled.jit import compiled
from forensics.detect.spikes.kernel_state import (  # noqa: F401 - the thresholds are read through here too
    BY_FIXED,
    BY_OBSERVED_MAX,
    BY_TAIL,
    DEFAULT_RATIO,
    JOINT_MAX_P,
    OBSERVED_MAX_FACTOR,
)

#: Every function of the loop is compiled without numba's reference counting: the state is a tuple of arrays, and
#: counting each array on every access was ~2/3 of the loop's time (measured with perf: NRT_incref/NRT_decref).
#: Nothing inside allocates; scratch space lives in the state (``scratch``).
_jit = compiled()


#: Scores at or above the censoring limit enter the tail as censored peaks: counted, their size unknown (this value
#: sorts them last). For rates of ``CENSOR_P`` per step and below the limit is the threshold itself, so no flagged
#: score (a spike) ever lends its size to the tail it is judged against; for higher rates it is the fit's score at
#: ``CENSOR_P``, so that censoring stays a small share of the peaks. Before the first fit the limit is ``z``.
CENSORED = 1e300
CENSOR_P = 1e-4
#: The fit reads the sorted peaks up to this share of them (or up to the first censored one, if lower): what lies
#: above, the far tail, censored noise and any spike alike, weighs only by its count.
TRIM = 0.99
#: Bounds of the fitted shape: from a clearly bounded tail to a very heavy one (infinite variance from 0.5 up).
XI_LO = -0.5
XI_HI = 0.95
#: With a false_rate but fewer than min_peaks peaks, the jump condition is at least this (the fixed rule's default):
#: the fixed score z alone flags heavy-tailed noise every few hundred steps.
FALLBACK_RATIO = DEFAULT_RATIO
OBSERVED_EXTRAPOLATION = 1.0


@_jit
def _gpd_quantile(t0, xi, sigma, q):
    """The score a generalized Pareto above ``t0`` exceeds with probability ``q`` (relative to ``t0``'s)."""
    if q >= 1.0:
        return t0
    if abs(xi) < 1e-6:
        return t0 - sigma * np.log(q)
    return t0 + sigma / xi * (q ** (-xi) - 1.0)


@_jit
def _partial_moments(xi, c):
    """``int_0^c Q(p) dp`` and ``int_0^c p Q(p) dp`` of the generalized Pareto of shape ``xi`` and scale 1 (``Q``
    its quantile function): the two trimmed probability-weighted moments the fit matches."""
    if abs(xi) < 1e-6:
        xi = 1e-6
    u = 1.0 - c
    m0 = ((1.0 - u ** (1.0 - xi)) / (1.0 - xi) - c) / xi
    i1 = 1.0 / (1.0 - xi) - 1.0 / (2.0 - xi) - u ** (1.0 - xi) / (1.0 - xi) + u ** (2.0 - xi) / (2.0 - xi)
    return m0, (i1 - 0.5 * c * c) / xi


@_jit
def _fitted_shape(share, target):
    """The shape whose trimmed moments (the lowest ``share`` of the peaks) have the ratio ``target``, within
    [XI_LO, XI_HI]: the ratio rises with the shape, so bisect."""
    lo, hi = XI_LO, XI_HI
    m0, m1 = _partial_moments(lo, share)
    if m1 / m0 >= target:
        return lo
    m0, m1 = _partial_moments(hi, share)
    if m1 / m0 <= target:
        return hi
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        m0, m1 = _partial_moments(mid, share)
        if m1 / m0 < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@_jit
def _fit_tail(p, state):
    """Refit the tail after a new peak: a generalized Pareto by trimmed probability-weighted moments on the lower
    ``TRIM`` of the sorted excesses (censored peaks count, their sizes do not), and the score it says is exceeded
    with probability ``alpha`` (:mod:`forensics.detect.spikes`)."""
    c = state.counts[0]
    k = state.tail.meta[1]
    if k < p.min_peaks:
        return
    y = state.tail.sorted
    m = int(TRIM * k)
    while m > 0 and y[m - 1] >= CENSORED:
        m -= 1
    if m < p.min_peaks // 2:  # mostly censored: too little known to fit, keep the last fit
        return
    a0 = 0.0
    a1 = 0.0
    for j in range(m):
        a0 += y[j]
        a1 += y[j] * (j + 0.5) / k
    if a0 <= 0.0:
        return
    share = m / k
    xi = _fitted_shape(share, a1 / a0)
    m0, _ = _partial_moments(xi, share)
    sigma = a0 / k / m0
    cap = state.tail.ring.shape[0]
    oldest = state.tail_at.ring[state.tail_at.meta[0] % cap] if k == cap else 1.0
    span = c.n_judged - oldest + 1.0
    q = p.alpha * span / k  # the exceedance probability asked, relative to that of tail_start
    c.z_tail = _gpd_quantile(p.tail_start, xi, sigma, q)
    c.z_censor = c.z_tail if p.alpha <= CENSOR_P else _gpd_quantile(p.tail_start, xi, sigma, CENSOR_P * span / k)
    if p.joint_factor > 0.0:
        c.z_joint = _gpd_quantile(p.tail_start, xi, sigma, min(p.alpha * p.joint_factor, JOINT_MAX_P) * span / k)
    c.tail_xi = xi
    c.tail_sigma = sigma


@_jit
def _over(p, r, sc, base, z_thr, z_large, ratio_floor):
    """Above the thresholds: the score and the relative jump together; a larger jump needs a smaller score."""
    if r <= 0.0:
        return False
    if r / sc >= z_thr and r >= max((max(p.ratio, ratio_floor) - 1.0) * abs(base), p.min_jump):
        return True
    return r / sc >= z_large and r >= max((p.ratio_large - 1.0) * abs(base), p.min_jump)


@_jit
def _tail_threshold(p, c, supported):
    """The score the fitted tail asks of a row (see ``_calibrated``)."""
    if p.has_support == 0:
        return min(p.z, c.z_tail)
    if supported:
        return min(p.z, c.z_joint)
    return c.z_tail


@_jit
def _beyond_observed(p, c, r, sc, base, z_thr):
    """A fitted tail that extrapolates yields to what the run has shown: with its threshold ``z_thr`` beyond the
    largest clean score so far, a row passing the fixed rule (``z``, a jump of at least ``FALLBACK_RATIO``) whose
    score is at least ``OBSERVED_MAX_FACTOR`` times that maximum is flagged ("Calibrated thresholds" in
    :mod:`forensics.detect.spikes`)."""
    m = c.clean_max
    if not z_thr > OBSERVED_EXTRAPOLATION * m or r / sc < OBSERVED_MAX_FACTOR * m:
        return False
    return _over(p, r, sc, base, p.z, np.inf, FALLBACK_RATIO)


@_jit
def _calibrated(p, c, r, sc, base, supported):
    """The fitted tail's verdict ("Calibrated thresholds" in :mod:`forensics.detect.spikes`): the jump condition
    always; the score rarer than alpha by the tail, or than ``alpha * joint_factor`` where the grad norm supports
    the row, and never more than ``z`` where no other metric can support or contradict it."""
    if p.has_support == 0:
        return _over(p, r, sc, base, min(p.z, c.z_tail), p.z_large, 1.0)
    if supported:
        return _over(p, r, sc, base, min(p.z, c.z_joint), p.z_large, 1.0)
    return _over(p, r, sc, base, c.z_tail, np.inf, 1.0)  # the grad norm ignored it: the tail must call it rare


@_jit
def _decide(p, c, r, sc, base, supported, z_thr, ratio_floor):
    """A judged row's verdict: ``(flagged, decided_by, the score it needed)``. Once the tail is fitted, its verdict,
    or the observed maximum's where the fit extrapolates; before (or without a false_rate), the fixed rule, with the
    Gaussian's joint score where the grad norm supports the row."""
    if p.alpha > 0.0 and not np.isnan(c.z_tail):
        z_used = _tail_threshold(p, c, supported)
        if _calibrated(p, c, r, sc, base, supported):
            return True, BY_TAIL, z_used
        if _beyond_observed(p, c, r, sc, base, z_used):
            return True, BY_OBSERVED_MAX, z_used
        return False, BY_TAIL, z_used
    z_used = min(z_thr, p.z_joint0) if supported else z_thr
    return _over(p, r, sc, base, z_used, p.z_large, ratio_floor), BY_FIXED, z_used


@_jit
def _note_clean(p, c, zz, r, base, flagged):
    """Keep the largest score of the clean history (``clean_max``): every accepted judged row's, but a row the fixed
    rule calls a spike (``z`` and a 1.5x jump) that was accepted counts only once the next judged row is neither one
    nor flagged. Noise that rare comes alone; a slow rise's steps do not, and must not teach the maximum their size
    one step at a time."""
    if flagged:
        c.clean_pending = -np.inf
        c.clean_run = 0
        return
    if zz >= p.z and r >= (FALLBACK_RATIO - 1.0) * abs(base):
        c.clean_pending = max(c.clean_pending, zz)
        c.clean_run += 1
        return
    if c.clean_run == 1:
        c.clean_max = max(c.clean_max, c.clean_pending)
    c.clean_pending = -np.inf
    c.clean_run = 0
    c.clean_max = max(c.clean_max, zz)
