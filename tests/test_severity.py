"""Severity is evidence: one function turns the lines of evidence a finding carries into its severity, at every
boundary of the rule (docs/concepts.md)."""

from __future__ import annotations

import pytest

from forensics.detect.causes.severity import most_severe, severity_of


@pytest.mark.parametrize(
    "kind, support, expected",
    [
        # a move beyond the noise alone is one line: warning
        ("spike", {"moved": True}, "warning"),
        # a second, independent line makes it critical: the grad norm, the samples spiking again, content, replay data
        ("spike", {"moved": True, "grad_norm": True}, "critical"),
        ("spike", {"moved": True, "recurs": True}, "critical"),
        ("spike", {"moved": True, "content": True}, "critical"),
        ("spike", {"moved": True, "replay": "data"}, "critical"),
        ("spike", {"moved": True, "replay": "inconclusive"}, "warning"),
        # what explains it, and a replay that clears it, make it info whatever else agrees
        ("spike", {"moved": True, "grad_norm": True, "explained": "batch_size"}, "info"),
        ("spike", {"moved": True, "recurs": True, "replay": "normal"}, "info"),
        ("spike", {"moved": True, "explained": "not_followed"}, "info"),
        # a grad-norm spike the loss followed weakly: warning
        ("spike", {"moved": True, "loss_weak": True}, "warning"),
        # evidence without a move is no event
        ("spike", {"grad_norm": True, "content": True}, "info"),
        ("spike", {}, "info"),
        # NaN/inf: critical by itself in a training quantity, recorded in a context metric
        ("nonfinite", {"nonfinite": "training"}, "critical"),
        ("nonfinite", {}, "critical"),
        ("nonfinite", {"nonfinite": "context"}, "info"),
        ("nonfinite", {"nonfinite": "training", "replay": "normal"}, "info"),
        # run-level kinds: their defaults, raised by a critical line, lowered by what explains them
        ("static_plan", {}, "warning"),
        ("static_plan", {"critical": True}, "critical"),
        ("oscillation", {"explained": "bucket"}, "info"),
        ("oscillation", {}, "warning"),
        ("grad_norm_spikes", {}, "info"),
        ("grad_norm_spikes", {"warning": True}, "warning"),
        ("divergence", {}, "critical"),
        ("restart", {}, "info"),
        ("restart", {"warning": True}, "warning"),
        ("lr_schedule", {"warning": True}, "warning"),
    ],
)
def test_severity_from_evidence(kind, support, expected):
    assert severity_of(kind, support) == expected


@pytest.mark.parametrize("given", ["info", "warning", "critical"])
def test_a_kind_this_module_does_not_know_keeps_its_rules_severity(given):
    assert severity_of("loss_above", None, given) == given


def test_the_most_severe_of_several():
    assert most_severe(["info", "critical", "warning"]) == "critical"
    assert most_severe(["info", "warning"]) == "warning"
    assert most_severe([]) == "info"
