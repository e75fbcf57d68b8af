"""Severity is evidence (docs/concepts.md): the one place that turns the evidence a finding carries into its
severity. Rules report evidence (``details["support"]``), never a severity of their own.

The lines of evidence a finding may carry (``support`` keys; a rule sets those it measured):

- ``moved``: the quantity moved beyond its noise (a spike, a level shift: the finding's own line);
- ``grad_norm``: the grad norm moved at or before it (a loss spike the grad norm led or accompanied; for a grad-norm
  spike, the loss answering it); ``loss_weak``: a grad-norm spike the loss followed, but weakly;
- ``recurs``: the same samples spiked the loss again elsewhere (a batch coming back, a re-paired micro-batch);
- ``content``: the batch's suspect samples carry content evidence (near-duplicates, repetition, noise);
- ``replay``: the replay verdict of its step (``data`` agrees; ``normal`` clears it);
- ``compare``: what another run says of the same data (``recurring``: it spiked there too, a second line;
  ``unique_held``: it consumed the same data and did not spike, one line less; :mod:`.compared`);
- ``explained``: what explains it without a fault (``batch_size``, ``bucket``, ``cluster``, ``composition``,
  ``not_followed``);
- ``composition_high``: the step's composition predicts a clearly higher value than the trend (its expectation
  factor, :mod:`forensics.detect.evidence.expected_loss`): the same samples spiking again may be their content type
  coming back, so ``recurs`` is no second line for it; recurrence counts only where the composition does not
  predict the rise;
- ``nonfinite``: ``training`` (NaN/inf in a training quantity: critical by itself) or ``context``.

The verdicts:

- ``critical``: moved beyond its noise *and* a second independent line agrees; NaN/inf in a training quantity;
- ``warning``: one line of evidence (a loss spike alone; a grad-norm spike the loss followed weakly);
- ``info``: recorded, explained or not a fault; a replay ``normal`` verdict lowers anything to ``info``.

Kinds that judge a whole run (a static plan, a periodic line, the run-health kinds) have a default severity here,
which their evidence raises or lowers; a kind this module does not know keeps the severity its rule gave it (a rule
from outside the package that reports no ``support``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from forensics.detect.findings import CRITICAL, INFO, SEVERITIES, WARNING, Finding

#: Lines that agree with a move beyond the noise (each one a second line of evidence).
SECOND_LINES = ("grad_norm", "recurs", "content")
#: Run-level kinds: their severity without further evidence (raised to ``critical`` by ``critical``, lowered to
#: ``info`` by ``explained`` in their support).
KIND_DEFAULTS = {
    "static_plan": WARNING,
    "oscillation": WARNING,
    "misaligned_steps": WARNING,
    "grad_norm_spikes": INFO,
    "expected_for_bucket": INFO,
    "divergence": CRITICAL,
    "crash": CRITICAL,
    "overfitting": WARNING,
    "plateau": WARNING,
    "throughput": WARNING,
    "memory": WARNING,
    "lr_schedule": INFO,
    "restart": INFO,
    "harmful_samples": WARNING,
    "epoch_boundary": WARNING,
    "resume_data": WARNING,
    "rank_drift": WARNING,
}
#: Kinds judged by their lines of evidence.
EVENT_KINDS = ("spike", "level_shift", "nonfinite")


def severity_of(kind: str, support: Mapping[str, Any] | None, given: str = INFO) -> str:
    """The severity the evidence ``support`` gives a finding of ``kind`` (rules in the module docstring);
    ``given``: the rule's own severity, kept for a kind this module does not know."""
    s = dict(support or {})
    if s.get("replay") == "normal":
        return INFO
    if kind == "nonfinite" or s.get("nonfinite"):
        return CRITICAL if s.get("nonfinite", "training") == "training" else INFO
    if s.get("explained"):
        return INFO
    if kind in EVENT_KINDS:
        if not s.get("moved"):
            return INFO
        lines = sum(bool(s.get(k)) for k in SECOND_LINES if not (k == "recurs" and s.get("composition_high")))
        lines += s.get("replay") == "data"
        lines += {"recurring": 1, "unique_held": -1}.get(str(s.get("compare")), 0)
        if lines >= 1:
            return CRITICAL
        return WARNING
    if kind in KIND_DEFAULTS:
        if s.get("critical") or s.get("replay") == "data":
            return CRITICAL
        if s.get("warning"):
            return max(KIND_DEFAULTS[kind], WARNING, key=SEVERITIES.index)
        return KIND_DEFAULTS[kind]
    if s.get("loss_weak"):
        return WARNING
    return given if given in SEVERITIES else INFO


def support_of(f: Finding) -> dict[str, Any]:
    """A finding's evidence (created empty when the rule gave none)."""
    return f.details.setdefault("support", {})


def assign_severities(findings: Iterable[Finding]) -> None:
    """Set every finding's severity from its evidence (in place)."""
    for f in findings:
        f.severity = severity_of(f.kind, f.details.get("support"), f.severity)


def most_severe(severities: Iterable[str]) -> str:
    """The most urgent of several severities (``info`` for none)."""
    return max(severities, key=SEVERITIES.index, default=INFO)
