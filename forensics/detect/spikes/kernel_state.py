"""The spike kernel's data: per-row status codes, event kinds, the parameter, counter and event records, and the
state the loop carries between rows (:data:`KernelState`), with the plain-Python helpers that make and copy it.

No compiled code lives here (the loop is in :mod:`~forensics.detect.spikes.kernel`), so the records can be read
without loading numba.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

# --- per-row status codes ---------------------------------------------------------------------------------------------
ACCEPTED = 0  # judged, within the thresholds, entered the baseline
FLAGGED = 1  # judged, above both thresholds, kept out of the baseline
NONFINITE = 2  # NaN or inf: its own finding, never in a window
WARMUP = 3  # before min_periods accepted values: entered the baseline unjudged
EXPECTED = 4  # accepted, but above the thresholds against the trend alone: expected for its bucket
NEW_BUCKET = 5  # its bucket has too few steps to have a baseline yet: only learned from, not judged
RESTARTED = 6  # it moved off a history with no spread (a constant): the history starts over at it, unjudged
STATUS_NAMES = ("accepted", "flagged", "nonfinite", "warmup", "expected_for_bucket", "new_bucket", "restarted")

# --- how a flagged row was decided (an event's peak row) --------------------------------------------------------------
BY_FIXED = 0  # the fixed rule: no false_rate, or too few peaks for a fit
BY_TAIL = 1  # the fitted tail's threshold (or its joint one)
BY_OBSERVED_MAX = 2  # the fit extrapolated past the run's largest clean score: the fixed rule and that maximum

#: The jump a spike must make over its baseline by default (the detector's ``ratio``; the tail's fallback too).
DEFAULT_RATIO = 1.5

#: Steps by which a grad-norm spike may lead a loss spike and still be the same event (BLOOM-176B's led by 4).
JOINT_LEAD = 10

#: A supported row (another metric spiked at it or just before) is flagged when its score is rarer than
#: ``alpha * joint_factor`` per step, never commoner than this: two metrics agreeing make a weaker loss move real.
JOINT_MAX_P = 1e-3
#: Where the fitted tail's threshold lies beyond the largest score of the run's clean history (the fit extrapolates
#: past anything the run has shown), a row is flagged that passes the fixed rule (``z`` and at least a 1.5x jump) and
#: whose score is at least this many times that largest clean score: a jump no clean step came near.
OBSERVED_MAX_FACTOR = 1.05

# --- event kinds ----------------------------------------------------------------------------------------------------
EV_SPIKE = 1
EV_SHIFT = 2

#: The rule's parameters, resolved once by the detector (one record).
PARAMS = np.dtype(
    [
        ("z", np.float64),
        ("ratio", np.float64),
        ("min_jump", np.float64),
        ("z_large", np.float64),
        ("ratio_large", np.float64),
        ("window", np.int64),  # W: accepted values in the trend and the noise scale
        ("half", np.int64),  # h: the trend's recent half
        ("min_old", np.int64),  # older values the trend needs before it extrapolates
        ("min_periods", np.int64),
        ("max_duration", np.int64),
        ("confirm", np.int64),
        ("bucket_window", np.int64),
        ("min_bucket_periods", np.int64),
        ("queue", np.int64),  # capacity of the pending-event queue
        ("use_raw", np.int64),  # 1: also judge accepted steps as a detector without tags would (expected_for_bucket)
        ("alpha", np.float64),  # false alarms asked per judged row (false_rate / 10,000); 0: the fixed score z
        ("tail_start", np.float64),  # scores above it are the tail's peaks
        ("min_peaks", np.int64),  # peaks needed before the fitted tail replaces z
        ("joint_factor", np.float64),  # a supported row is flagged at the tail's score for alpha times this (0: off)
        ("has_support", np.int64),  # 1: another metric (the grad norm) supports or not: see "Joint evidence"
        ("z_joint0", np.float64),  # a supported row's score before the tail is fitted (inf: none)
    ]
)

#: Counters carried between rows (one record).
COUNTS = np.dtype(
    [
        ("n_accepted", np.int64),  # values that entered the baseline, warm-up included
        ("history_start", np.int64),  # n_accepted when the history last started over (a move off a constant)
        ("n_clean", np.int64),  # judged rows accepted (what a spike's confirmation counts)
        ("clean_max", np.float64),  # the largest score of the clean history so far (-inf before the first)
        ("clean_pending", np.float64),
        ("clean_run", np.int64),  # accepted rows the fixed rule calls spikes, in a row
        ("n_judged", np.int64),  # rows judged (flagged or accepted after the warm-up)
        ("n_pending", np.int64),
        ("pending_head", np.int64),  # the queue of closed events awaiting confirmation
        ("n_known_buckets", np.int64),  # buckets with at least min_bucket_periods residuals
        ("offset_sum", np.float64),  # sum of the known buckets' median residuals (their mean centres the offsets)
        ("z_tail", np.float64),  # the score threshold the fitted tail gives (NaN until min_peaks peaks)
        ("z_censor", np.float64),  # scores from it up enter the tail as censored peaks (value unknown, counted)
        ("tail_xi", np.float64),
        ("tail_sigma", np.float64),  # the fitted generalized Pareto shape and scale
        ("last_censored", np.int64),  # n_judged of the last censored peak (a run of them is one peak)
        ("z_joint", np.float64),  # the fitted tail's score for a row another metric supports (NaN until fitted)
    ]
)

#: One event: the open one, a pending one, or an emitted one (fields a stage does not use stay 0).
EVENT = np.dtype(
    [
        ("kind", np.int64),
        ("start", np.int64),
        ("end", np.int64),
        ("peak", np.int64),
        ("recovery", np.int64),
        ("n_rows", np.int64),
        ("bucket", np.int64),
        ("is_open", np.int64),
        ("n_post", np.int64),
        (
            "accepted_mark",
            np.int64,
        ),  # n_clean when it closed: judged values accepted after it are n_clean - accepted_mark
        ("judged_close", np.int64),
        ("judged_start", np.int64),  # n_judged when it closed / when it started
        ("x", np.float64),
        ("base", np.float64),
        ("z", np.float64),
        ("scale", np.float64),
        ("offset", np.float64),
        ("post", np.float64),
        ("new_level", np.float64),
        ("decided_by", np.int64),  # BY_FIXED, BY_TAIL or BY_OBSERVED_MAX: what flagged the peak row
        ("z_thr", np.float64),  # the score the peak row needed by the rule in force (the tail's, once fitted)
        ("clean_max", np.float64),  # the largest clean score before the peak row
    ]
)

#: A rolling window of the last ``len(ring)`` values: ring (arrival order), sorted copy, meta = [head, count].
Window = namedtuple("Window", "ring sorted meta")
#: The trend's window: the last W values split into the recent ``h`` and the older ``W - h``, each sorted.
TrendWindow = namedtuple("TrendWindow", "ring recent old meta")
#: Per-bucket windows of residuals: ring and sorted (K, Wb), meta (K, 2) = head, count; median (K,).
BucketWindows = namedtuple("BucketWindows", "ring sorted meta median")
#: Everything the loop carries from one row to the next.
KernelState = namedtuple(
    "KernelState",
    [
        "counts",  # COUNTS record array of length 1
        "open",  # EVENT record array of length 1: the event being extended (is_open = 1)
        "pending",  # EVENT array (queue,): closed events awaiting confirmation, a ring from counts.pending_head
        "trend",  # TrendWindow of bucket-adjusted accepted values y
        "scale",  # Window of |x - baseline| of accepted values: the noise scale (MAD)
        "mix",  # Window of raw accepted values (what a detector without tags would take as its median)
        "raw_scale",  # Window of |x - median(mix)|: that detector's noise scale
        "shadow",  # Window (ring only) of the judged values y, flagged or not: the new level after a shift
        "post",  # Window (ring only) of accepted judged values y: what decides whether a spike returned
        "buckets",  # BucketWindows
        "tail",  # Window of the excesses (score - tail_start) of accepted judged rows over tail_start: the peaks
        "tail_at",  # Window (ring only) of n_judged at each peak, aligned with tail's ring
        "scratch",  # work space for the medians of a confirmation or a re-anchoring (the loop allocates nothing)
    ],
)
#: A chunk of rows, and the per-row verdicts written for it.
Rows = namedtuple("Rows", "step value bucket support")
Verdicts = namedtuple("Verdicts", "status baseline score")


def _window(cap: int, sorted_too: bool = True) -> Window:
    return Window(np.zeros(cap), np.zeros(cap if sorted_too else 0), np.zeros(2, np.int64))


def new_state(params: np.ndarray, tail_window: int = 1) -> KernelState:
    """An empty state for the parameters of a ``PARAMS`` record array (``tail_window``: peaks kept)."""
    p = params[0]
    w, h, q = int(p["window"]), int(p["half"]), int(p["queue"])
    wb = int(p["bucket_window"])
    return KernelState(
        counts=empty_counts(),
        open=np.zeros(1, EVENT),
        pending=np.zeros(q, EVENT),
        trend=TrendWindow(np.zeros(w), np.zeros(h), np.zeros(w - h), np.zeros(2, np.int64)),
        scale=_window(w),
        mix=_window(w),
        raw_scale=_window(w),
        shadow=_window(int(p["max_duration"]), False),
        post=_window(int(p["confirm"]), False),
        buckets=BucketWindows(np.zeros((0, wb)), np.zeros((0, wb)), np.zeros((0, 2), np.int64), np.zeros(0)),
        tail=_window(tail_window),
        tail_at=_window(tail_window, False),
        scratch=np.zeros(max(w, int(p["max_duration"]), int(p["confirm"])) + 1),
    )


def copy_state(state: tuple) -> tuple:
    """A deep copy (``finish`` resolves what is pending on a copy, so the live state is untouched)."""
    return type(state)(*(copy_state(v) if isinstance(v, tuple) else v.copy() for v in state))


def with_buckets(state: KernelState, n: int) -> KernelState:
    """The state with per-bucket windows for bucket ids ``0..n-1`` (grown, existing windows kept)."""
    bw = state.buckets
    k, wb = bw.ring.shape
    if n <= k:
        return state
    grown = BucketWindows(
        np.concatenate([bw.ring, np.zeros((n - k, wb))]),
        np.concatenate([bw.sorted, np.zeros((n - k, wb))]),
        np.concatenate([bw.meta, np.zeros((n - k, 2), np.int64)]),
        np.concatenate([bw.median, np.zeros(n - k)]),
    )
    return state._replace(buckets=grown)


def empty_counts() -> np.ndarray:
    c = np.zeros(1, COUNTS)
    c["z_tail"] = np.nan
    c["z_censor"] = np.nan
    c["last_censored"] = -2
    c["z_joint"] = np.nan
    c["clean_max"] = -np.inf
    c["clean_pending"] = -np.inf
    return c


def bucket_offset(state: KernelState, b: int, min_bucket_periods: int) -> float:
    """Bucket ``b``'s current offset from the trend (NaN while it has fewer than ``min_bucket_periods`` steps)."""
    c = state.counts[0]
    bw = state.buckets
    if b >= len(bw.median) or bw.meta[b, 1] < min_bucket_periods or c["n_known_buckets"] == 0:
        return float("nan")
    return float(bw.median[b] - c["offset_sum"] / c["n_known_buckets"])
