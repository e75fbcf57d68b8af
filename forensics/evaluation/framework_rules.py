"""The loss-spike rules that training frameworks ship, re-implemented from their published parameters.

Why: the detection benchmark (``bench/bench_detection_quality.py``) scores our detector against what a user already
has, on the same corpus, so each rule here emits the same :class:`~forensics.detect.findings.Finding` as ours and
follows the same protocol (``detect`` on a whole run, ``update`` on chunks; any chunking gives the same findings).
The rules were read from their sources and re-written, not copied; each replays the callback row by row, as it would
have run during training, on one metric (the loss by default).

**Common conventions.** A rule flags rows; consecutive flagged rows make one ``spike`` event (``step`` = its first
row, ``peak_step`` = its highest value, ``baseline``/``score`` = the rule's reference value and ratio or z at the
peak). Where the real callback stops training at the first alarm (Lightning raises, llm-foundry can raise), the replay
goes on as if the user had resumed with the callback's state intact, so that every spike of a run is counted.
``severity`` is ``warning``; ``details`` carry the rule's name, source and parameters.

- :class:`MegatronSpikyLoss` - NVIDIA Megatron-LM, ``megatron/core/rerun_state_machine.py``,
  ``RerunStateMachine.is_unexpectedly_large`` as called for the loss (``threshold=10``, ``num_samples=100``): the
  largest absolute value of the first 100 finite values is remembered; afterwards a value ``>= 10 x`` that maximum is
  spiky (Megatron then re-runs the step to check it is reproducible). NaN/inf are ignored (checked separately).
- :class:`KillLossSpike` - MosaicML llm-foundry, ``llmfoundry/callbacks/kill_loss_spike_callback.py``
  (``window_size=100`` (newer versions: at least 100), ``outlier_multiplier=2``, ``patience=4``): once the window of
  the last 100 losses is full, a loss ``>= 2 x`` their mean is an outlier; every loss enters the window, outliers
  included; more than ``patience`` consecutive outliers (the 5th) raise the alarm. The event reported starts at the
  streak's first outlier. The callback's other check, a persistently high loss (``loss_cap``), is not a spike rule
  and is left out.
- :class:`OlmoStabilityMonitor` - AllenAI OLMo-core, ``olmo_core/train/callbacks/stability_monitor.py``,
  ``StabilityMonitorCallback`` (``window_size=128``, ``threshold_std=6.0``): once 128 values are in the history, a
  value ``> mean + 6 x std`` (population std) of the previous 128 values (every value enters, spikes and NaN
  included; no check while ``std < 1e-10``) is a spike. The callback watches loss and grad norm alike; apply one
  instance per metric.
- :class:`LightningSpikeDetection` - Lightning Fabric, ``lightning/fabric/utilities/spike.py``, ``SpikeDetection``
  (``mode="min"``, ``window=10``, ``warmup=1``, ``atol=None``, ``rtol=2.0``, ``finite_only=True``): from the second
  batch on, a non-finite loss is a spike; otherwise a loss that did not improve on the last accepted one and whose
  distance to the running mean of the last 10 accepted losses is ``>= rtol x`` that mean (``>= atol`` too when set).
  Spikes never enter the running mean or the last value.
- :class:`MetaseqEwmRatio` - Meta metaseq, ``metaseq/trainer.py``, ``Trainer.skip_spike`` (``span=9``): the
  exponentially weighted mean starts at the first loss, ``alpha = 2 / (span + 1)``; a loss whose ratio to it is
  ``> ewm_ratio_to_skip_batch`` is a spike (the batch's update is skipped) and does not update the mean. The threshold
  comes from ``--ewm-ratio-to-skip-batch``, whose default we could not find in the published code; we use 1.5, the
  relative jump of our own detector (:attr:`SpikeDetector.ratio`), so that the comparison isolates the baseline.
  Non-finite losses never reach the rule in metaseq (a NaN/inf gradient raises first), so they are skipped here.

Each rule's inner loop is compiled with numba (the rules are sequential by nature: each verdict changes what the next
row is compared with); its state lives in small numpy arrays, so a live run can stop after any row.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numba as nb
import numpy as np
import pandas as pd

from forensics.detect.findings import WARNING, Finding
from forensics.detect.metric_detector import MetricDetector
from forensics.errors import ForensicsError
from forensics.schema import STEP, find_loss_key

_NAN = np.nan


# --- the compiled rules ----------------------------------------------------------------------------------------------
# Every kernel reads ``values`` and writes, per row: ``cand`` (part of an event), ``fired`` (the rule's alarm),
# ``ref`` (the reference value the row was compared with) and ``score`` (ratio or z against it). ``pf``/``pi`` are
# the rule's parameters, ``sf``/``si``/``ring`` its state, updated in place.


@nb.njit(cache=True)
def _megatron(values, pf, pi, sf, si, ring, cand, fired, ref, score):  # pragma: no cover - compiled
    threshold, num_samples = pf[0], pi[0]
    for k in range(values.shape[0]):
        v = values[k]
        if not np.isfinite(v):
            continue
        a = abs(v)
        if si[0] < num_samples:
            si[0] += 1
            if a > sf[0]:
                sf[0] = a
            continue
        ref[k] = sf[0]
        score[k] = a / sf[0] if sf[0] > 0 else np.inf
        if a >= sf[0] * threshold:
            cand[k] = True
            fired[k] = True


@nb.njit(cache=True)
def _kill_loss_spike(values, pf, pi, sf, si, ring, cand, fired, ref, score):  # pragma: no cover - compiled
    mult, window, patience = pf[0], pi[0], pi[1]
    for k in range(values.shape[0]):
        v = values[k]
        if si[1] == window:
            total = 0.0
            for j in range(window):
                total += ring[j]
            mean = total / window
            ref[k] = mean
            score[k] = v / mean
            if v >= mean * mult:
                si[2] += 1
                cand[k] = True
                fired[k] = si[2] > patience
            elif si[2] > 0:
                si[2] = 0
        ring[si[0]] = v
        si[0] = (si[0] + 1) % window
        if si[1] < window:
            si[1] += 1


@nb.njit(cache=True)
def _olmo(values, pf, pi, sf, si, ring, cand, fired, ref, score):  # pragma: no cover - compiled
    threshold_std, window = pf[0], pi[0]
    for k in range(values.shape[0]):
        v = values[k]
        if si[1] >= window:
            total = 0.0
            for j in range(window):
                total += ring[j]
            mean = total / window
            var = 0.0
            for j in range(window):
                var += (ring[j] - mean) ** 2
            std = np.sqrt(var / window)
            if not std < 1e-10:
                ref[k] = mean
                score[k] = (v - mean) / std
                if v > mean + threshold_std * std:
                    cand[k] = True
                    fired[k] = True
        ring[si[0]] = v
        si[0] = (si[0] + 1) % window
        if si[1] < window:
            si[1] += 1


@nb.njit(cache=True)
def _lightning(values, pf, pi, sf, si, ring, cand, fired, ref, score):  # pragma: no cover - compiled
    rtol, atol, window, warmup = pf[0], pf[1], pi[0], pi[1]
    for k in range(values.shape[0]):
        v = values[k]
        idx = si[2]
        si[2] += 1
        spike = False
        if idx >= warmup:
            running = np.nan
            if si[1] > 0:
                total = 0.0
                for j in range(si[1]):
                    total += ring[j]
                running = total / si[1]
            ref[k] = running
            score[k] = v / running
            if not np.isfinite(v):
                spike = True
            elif v - sf[0] <= 0.0:
                spike = False
            else:
                ok_atol = np.isnan(atol) or abs(v - running) >= abs(atol)
                ok_rtol = np.isnan(rtol) or abs(v - running) >= abs(rtol * running)
                spike = ok_atol and ok_rtol
        if spike:
            cand[k] = True
            fired[k] = True
        else:
            ring[si[0]] = v
            si[0] = (si[0] + 1) % window
            if si[1] < window:
                si[1] += 1
            sf[0] = v


@nb.njit(cache=True)
def _metaseq(values, pf, pi, sf, si, ring, cand, fired, ref, score):  # pragma: no cover - compiled
    ratio_threshold, alpha = pf[0], pf[1]
    for k in range(values.shape[0]):
        v = values[k]
        if not np.isfinite(v):
            continue
        if np.isnan(sf[0]):
            sf[0] = v
        ratio = v / sf[0]
        ref[k] = sf[0]
        score[k] = ratio
        if ratio > ratio_threshold:
            cand[k] = True
            fired[k] = True
        else:
            sf[0] = (1.0 - alpha) * sf[0] + alpha * v


# --- the shared protocol ---------------------------------------------------------------------------------------------
class FrameworkRule(MetricDetector):
    """A framework's rule replayed on one metric; subclasses name their kernel, state and words."""

    #: short name for tables
    label: ClassVar[str] = ""
    #: where the rule comes from (repository and file)
    source: ClassVar[str] = ""
    #: what ``score`` means in evidence ("x the reference" or "std above the mean")
    score_kind: ClassVar[str] = "ratio"

    def __init__(self, metric: str | None = None):
        self.metric = metric

    # subclasses: the kernel, its parameter arrays and the size of the ring buffer
    def _kernel(self):
        raise NotImplementedError

    def _params(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _ring_size(self) -> int:
        return 1

    def _initial_sf(self) -> np.ndarray:
        return np.zeros(1)

    def _rule_words(self, ref: float) -> str:
        raise NotImplementedError

    def reset(self) -> None:
        self.pf_, self.pi_ = self._params()
        self.sf_ = self._initial_sf()
        self.si_ = np.zeros(4, dtype=np.int64)
        self.ring_ = np.full(max(self._ring_size(), 1), np.nan)
        self.metric_: str | None = self.metric
        self.last_step_: int | None = None
        self.open_: dict[str, Any] | None = None

    def update(self, rows: pd.DataFrame, tags: pd.DataFrame | None = None) -> list[Finding]:
        """Feed the next rows (``step`` plus the metric; rows at or before the last step seen are skipped)."""
        if not hasattr(self, "sf_"):
            self.reset()
        if self.metric_ is None:
            self.metric_ = find_loss_key(rows.columns)
        for col in (STEP, self.metric_):
            if col not in rows.columns:
                raise ForensicsError(
                    f"metrics: missing column '{col}' ({self.label} watches '{self.metric_}'); "
                    f"it has {', '.join(map(str, rows.columns[:12]))}"
                )
        steps = rows[STEP].to_numpy(dtype=np.int64)
        values = rows[self.metric_].to_numpy(dtype=np.float64, na_value=np.nan)
        keep = np.ones(len(steps), dtype=bool)
        if len(steps) > 1:
            keep[1:] = steps[1:] > np.maximum.accumulate(steps)[:-1]
        if self.last_step_ is not None:
            keep &= steps > self.last_step_
        steps, values = steps[keep], np.ascontiguousarray(values[keep])
        if len(steps) == 0:
            return []
        cand, fired, ref, score = self._judge(values)
        self.last_step_ = int(steps[-1])
        return self._events(steps, values, cand, fired, ref, score)

    def trace(self, table: pd.DataFrame) -> pd.DataFrame:
        """Per row of a whole run: ``step``, ``value``, ``reference`` (what the row was compared with), ``score``,
        ``outlier`` (the row's own test) and ``alarm`` (the rule fired). Runs on a clone; this rule is untouched."""
        other = self.clone()
        other.reset()
        metric = other.metric_ or find_loss_key(table.columns)
        values = np.ascontiguousarray(table[metric].to_numpy(dtype=np.float64, na_value=np.nan))
        cand, fired, ref, score = other._judge(values)
        return pd.DataFrame(
            {
                STEP: table[STEP].to_numpy(np.int64),
                "value": values,
                "reference": ref,
                "score": score,
                "outlier": cand,
                "alarm": fired,
            }
        )

    def _judge(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(values)
        cand = np.zeros(n, dtype=np.bool_)
        fired = np.zeros(n, dtype=np.bool_)
        ref = np.full(n, np.nan)
        score = np.full(n, np.nan)
        self._kernel()(values, self.pf_, self.pi_, self.sf_, self.si_, self.ring_, cand, fired, ref, score)
        return cand, fired, ref, score

    def finish(self) -> list[Finding]:
        """The event still open at the last row, if the rule had fired in it."""
        if getattr(self, "open_", None) is None or not self.open_["fired"]:
            return []
        return [self._finding(self.open_, is_open=True)]

    # --- events -----------------------------------------------------------------------------------------------------
    def _events(self, steps, values, cand, fired, ref, score) -> list[Finding]:
        out: list[Finding] = []
        n = len(steps)
        idx = np.flatnonzero(cand)
        if self.open_ is not None and (not len(idx) or idx[0] != 0):
            out += self._close()
        if not len(idx):
            return out
        breaks = np.flatnonzero(np.diff(idx) > 1)
        starts = np.r_[idx[0], idx[breaks + 1]]
        ends = np.r_[idx[breaks], idx[-1]]
        for a, b in zip(starts.tolist(), ends.tolist()):
            seg = slice(a, b + 1)
            j = a + int(np.nanargmax(values[seg])) if np.isfinite(values[seg]).any() else a
            if self.open_ is not None and a == 0:
                ev = self.open_
                ev["end"] = int(steps[b])
                ev["n"] += b - a + 1
                ev["fired"] = ev["fired"] or bool(fired[seg].any())
                if ev["first_alarm"] is None and fired[seg].any():
                    ev["first_alarm"] = int(steps[a + int(np.argmax(fired[seg]))])
                if np.isfinite(values[j]) and not values[j] <= ev["value"]:
                    ev.update(peak=int(steps[j]), value=float(values[j]), ref=float(ref[j]), score=float(score[j]))
            else:
                any_fired = bool(fired[seg].any())
                self.open_ = {
                    "start": int(steps[a]),
                    "end": int(steps[b]),
                    "n": b - a + 1,
                    "fired": any_fired,
                    "first_alarm": int(steps[a + int(np.argmax(fired[seg]))]) if any_fired else None,
                    "peak": int(steps[j]),
                    "value": float(values[j]),
                    "ref": float(ref[j]),
                    "score": float(score[j]),
                }
            if b < n - 1:
                out += self._close()
        return out

    def _close(self) -> list[Finding]:
        ev, self.open_ = self.open_, None
        return [self._finding(ev)] if ev is not None and ev["fired"] else []

    def _finding(self, ev: dict[str, Any], is_open: bool = False) -> Finding:
        metric, ref, score = self.metric_, ev["ref"], ev["score"]
        span = f"step {ev['start']}" if ev["start"] == ev["end"] else f"steps {ev['start']}-{ev['end']}"
        how = f"{score:.2f} x the reference" if self.score_kind == "ratio" else f"{score:.1f} std above the mean"
        evidence = [
            f"{self.label} flagged {span}: {metric} reached {ev['value']:.4g} at step {ev['peak']} "
            f"({how}); rule: {self._rule_words(ref)}.",
            f"Source: {self.source}.",
        ]
        params = {k: v for k, v in self.get_params().items() if k != "metric"}
        return Finding(
            kind="spike",
            step=ev["start"],
            end_step=ev["end"],
            peak_step=ev["peak"],
            metric=metric,
            value=ev["value"],
            baseline=ref,
            score=score,
            severity=WARNING,
            evidence=evidence,
            next_step=None,
            details={
                "rule": self.label,
                "source": self.source,
                "params": params,
                "n_steps": ev["n"],
                "first_alarm_step": ev["first_alarm"],
                "open": is_open,
            },
        )


class MegatronSpikyLoss(FrameworkRule):
    """Megatron-LM's spiky-loss check: ``|value| >= threshold x`` the largest of the first ``num_samples`` values.

    Parameters: ``threshold`` (default 10, as Megatron's training loop passes it for the loss), ``num_samples``
    (default 100, ``is_unexpectedly_large``'s default).
    """

    label = "Megatron-LM spiky loss"
    source = "NVIDIA/Megatron-LM megatron/core/rerun_state_machine.py (RerunStateMachine.is_unexpectedly_large)"

    def __init__(self, metric: str | None = None, threshold: float = 10.0, num_samples: int = 100):
        super().__init__(metric)
        self.threshold = threshold
        self.num_samples = num_samples

    def _kernel(self):
        return _megatron

    def _params(self):
        if not (self.threshold > 0 and int(self.num_samples) >= 1):
            raise ForensicsError(f"{self.label}: need threshold > 0 and num_samples >= 1")
        return np.array([float(self.threshold)]), np.array([int(self.num_samples)], dtype=np.int64)

    def _rule_words(self, ref: float) -> str:
        return f"|value| >= {self.threshold:g} x {ref:.4g}, the largest of the first {self.num_samples} finite values"


class KillLossSpike(FrameworkRule):
    """llm-foundry's KillLossSpike: more than ``patience`` consecutive losses ``>= outlier_multiplier x`` the mean of
    the last ``window`` losses (every loss enters the window).

    Parameters: ``window`` (default 100, the callback's minimum), ``outlier_multiplier`` (default 2), ``patience``
    (default 4: the 5th consecutive outlier raises the alarm).
    """

    label = "llm-foundry KillLossSpike"
    source = "mosaicml/llm-foundry llmfoundry/callbacks/kill_loss_spike_callback.py (KillLossSpike)"

    def __init__(
        self, metric: str | None = None, window: int = 100, outlier_multiplier: float = 2.0, patience: int = 4
    ):
        super().__init__(metric)
        self.window = window
        self.outlier_multiplier = outlier_multiplier
        self.patience = patience

    def _kernel(self):
        return _kill_loss_spike

    def _params(self):
        if not (int(self.window) >= 1 and int(self.patience) >= 0):
            raise ForensicsError(f"{self.label}: need window >= 1 and patience >= 0")
        return (
            np.array([float(self.outlier_multiplier)]),
            np.array([int(self.window), int(self.patience)], dtype=np.int64),
        )

    def _ring_size(self) -> int:
        return int(self.window)

    def _rule_words(self, ref: float) -> str:
        return (
            f"more than {self.patience} consecutive losses >= {self.outlier_multiplier:g} x the mean of the last "
            f"{self.window} ({ref:.4g} at the peak)"
        )


class OlmoStabilityMonitor(FrameworkRule):
    """OLMo-core's stability monitor: a value ``> mean + threshold_std x std`` of the previous ``window`` values.

    Parameters: ``window`` (default 128), ``threshold_std`` (default 6.0).
    """

    label = "OLMo-core StabilityMonitor"
    source = "allenai/OLMo-core src/olmo_core/train/callbacks/stability_monitor.py (StabilityMonitorCallback)"
    score_kind = "z"

    def __init__(self, metric: str | None = None, window: int = 128, threshold_std: float = 6.0):
        super().__init__(metric)
        self.window = window
        self.threshold_std = threshold_std

    def _kernel(self):
        return _olmo

    def _params(self):
        if not int(self.window) >= 1:
            raise ForensicsError(f"{self.label}: need window >= 1")
        return np.array([float(self.threshold_std)]), np.array([int(self.window)], dtype=np.int64)

    def _ring_size(self) -> int:
        return int(self.window)

    def _rule_words(self, ref: float) -> str:
        return f"value > mean + {self.threshold_std:g} x std of the previous {self.window} values (mean {ref:.4g})"


class LightningSpikeDetection(FrameworkRule):
    """Lightning Fabric's SpikeDetection (``mode="min"``): a loss that did not improve on the last accepted one and
    lies ``>= rtol x`` the running mean of the last ``window`` accepted losses away from it; non-finite losses too.

    Parameters: ``window`` (default 10), ``warmup`` (default 1), ``rtol`` (default 2.0), ``atol`` (default None).
    """

    label = "Lightning SpikeDetection"
    source = "Lightning-AI/pytorch-lightning src/lightning/fabric/utilities/spike.py (SpikeDetection)"

    def __init__(
        self,
        metric: str | None = None,
        window: int = 10,
        warmup: int = 1,
        rtol: float | None = 2.0,
        atol: float | None = None,
    ):
        super().__init__(metric)
        self.window = window
        self.warmup = warmup
        self.rtol = rtol
        self.atol = atol

    def _kernel(self):
        return _lightning

    def _params(self):
        if not (int(self.window) >= 1 and int(self.warmup) >= 0):
            raise ForensicsError(f"{self.label}: need window >= 1 and warmup >= 0")
        rtol = _NAN if self.rtol is None else float(self.rtol)
        atol = _NAN if self.atol is None else float(self.atol)
        return np.array([rtol, atol]), np.array([int(self.window), int(self.warmup)], dtype=np.int64)

    def _ring_size(self) -> int:
        return int(self.window)

    def _rule_words(self, ref: float) -> str:
        tol = " and ".join(
            t
            for t in (
                f"rtol {self.rtol:g}" if self.rtol is not None else "",
                f"atol {self.atol:g}" if self.atol is not None else "",
            )
            if t
        )
        return (
            f"no improvement on the last accepted loss and |value - running mean| beyond {tol or 'no tolerance'} "
            f"(running mean of the last {self.window} accepted losses: {ref:.4g})"
        )


class MetaseqEwmRatio(FrameworkRule):
    """metaseq's EWM ratio: ``value / ewm > ratio`` skips the batch; the EWM (span ``span``) of accepted values.

    Parameters: ``span`` (default 9, metaseq's), ``ratio`` (``--ewm-ratio-to-skip-batch``; default 1.5: see the
    module docstring).
    """

    label = "metaseq EWM ratio"
    source = "facebookresearch/metaseq metaseq/trainer.py (Trainer.skip_spike)"

    def __init__(self, metric: str | None = None, span: float = 9, ratio: float = 1.5):
        super().__init__(metric)
        self.span = span
        self.ratio = ratio

    def _kernel(self):
        return _metaseq

    def _initial_sf(self) -> np.ndarray:
        return np.full(1, np.nan)

    def _params(self):
        if not (self.span >= 1 and self.ratio > 0):
            raise ForensicsError(f"{self.label}: need span >= 1 and ratio > 0")
        return np.array([float(self.ratio), 2.0 / (float(self.span) + 1.0)]), np.zeros(1, dtype=np.int64)

    def _rule_words(self, ref: float) -> str:
        return f"value / EWM > {self.ratio:g} (EWM with span {self.span:g} of accepted values: {ref:.4g})"


#: The rules with their published parameters, in the order the benchmark prints them.
FRAMEWORK_RULES: tuple[type[FrameworkRule], ...] = (
    MegatronSpikyLoss,
    KillLossSpike,
    OlmoStabilityMonitor,
    LightningSpikeDetection,
    MetaseqEwmRatio,
)


def framework_rules(metric: str | None = None) -> list[FrameworkRule]:
    """One instance of every rule, with its published parameters, watching ``metric`` (default: the loss key)."""
    return [cls(metric) for cls in FRAMEWORK_RULES]
