"""The spike rule of the audit: :class:`~forensics.detect.spikes.SpikeDetector` on every analysed metric.

Each metric is judged on the rows where it was written (an eval metric between evals is missing, not a NaN), against
per-bucket baselines when steps carry tags. Its parameters are the spike detector's (``[detect.spikes]``).
"""

from __future__ import annotations

import inspect
from typing import Any

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.spikes import SpikeDetector, add_confidence, detect_spikes, joint_order
from forensics.errors import ForensicsError

#: Below this many written values a metric's first ``min_periods`` (history, not judged) weigh heavily: say so.
SHORT_RUN = 100


class SpikeRule(Rule):
    """Spikes, level shifts, non-finite steps and bucket summaries of the analysed metrics.

    Parameters are :class:`~forensics.detect.spikes.SpikeDetector`'s (``window``, ``z``, ``ratio``, ...: defaults and
    reasons documented there), given as ``[detect.spikes]`` keys.
    """

    name = "spikes"

    def __init__(self, **params: Any) -> None:
        self.params = params

    def get_params(self) -> dict[str, Any]:
        return dict(self.params)

    def _check(self) -> None:
        try:
            SpikeDetector(**self.params).reset()
        except TypeError as exc:
            raise ForensicsError(f"detect.spikes: {exc}") from exc

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:  # type: ignore[override]
        self.reset()
        self.warnings_: list[str] = []
        out: list[Finding] = []
        history = SpikeDetector(**self.params).min_periods
        grad = run.grad_norm_key if run.grad_norm_key in run.analysed and len(run.analysed) > 1 else None
        support = None  # the grad norm's flagged steps: joint evidence for the other metrics
        for col in joint_order(list(run.analysed), grad):
            rows = run.written_rows(col)
            det_support = None if col == grad or grad is None else support
            flagged: dict = {}
            out += detect_spikes(rows, col, tags=run.tags, boundaries=run.boundaries, support_metric=None,
                                 support=det_support, flagged=flagged, **self.params)
            if col == grad:
                support = flagged[col]
            if len(rows) < SHORT_RUN:
                self.warnings_.append(f"'{col}' has only {len(rows)} values: the first {min(history, len(rows))} "
                                      "(the causal detector's history) were judged two-sided, against the span "
                                      "itself (details.judged_by of each finding says which rule judged it)")
        add_confidence(out, run.grad_norm_key)  # joint evidence: the loss and the grad norm together
        if run.logging_steps > 1:
            for f in out:
                if f.kind == "spike":
                    cover_window(f, run.logging_steps)
        return out


def cover_window(f: Finding, every: int) -> None:
    """A value logged every ``every`` steps is the mean over them (HF's ``loss`` over ``logging_steps``): the spike
    is located to the window its logged steps cover, so its batch evidence is the union of their batches."""
    logged = (int(f.step), int(f.end_step if f.end_step is not None else f.step))
    f.step = max(0, logged[0] - every + 1)
    f.details["logged_steps"] = list(logged)
    f.details["window"] = [f.step, logged[1]]
    f.evidence.append(f"Each logged {f.metric} value is the mean over {every} steps (logging_steps = {every}): the "
                      f"value at step {logged[0]} covers steps {f.step}-{logged[0]}, and its batch evidence is the "
                      f"union of those steps' batches.")


def _spike_parameters() -> dict[str, Any]:
    sig = inspect.signature(SpikeDetector.__init__)
    return {n: p.default for n, p in sig.parameters.items() if n not in ("self", "metric")}


#: The rule's parameters are the detector's (read by :func:`forensics.detect.rules.parameters`).
SpikeRule.__init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    + [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d) for n, d in _spike_parameters().items()])
