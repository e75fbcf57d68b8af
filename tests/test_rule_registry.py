"""One rule protocol and a registry of finding kinds: a new rule is one module plus its registration, and its
parameters come from run.toml's [detect.<rule>] tables and --set like every built-in rule's."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from forensics.cli import main

TOY_RULE = '''
"""A toy rule: the loss above a fixed ceiling (written as a user would, in a module of its own)."""
from forensics.detect.base import Rule
from forensics.detect.findings import CRITICAL, Finding
from forensics.detect.kinds import FindingKind, register_kind
from forensics.detect.params import positive
from forensics.detect.rules import register_rule
from forensics.schema import metric_values


class LossAbove(Rule):
    """Parameter: ``ceiling`` 100 (a loss above it is reported)."""

    name = "loss_above"
    parameter_constraints = {"ceiling": positive()}

    def __init__(self, ceiling: float = 100.0):
        self.ceiling = ceiling

    def detect(self, run, found=None):
        self.reset()
        values = metric_values(run.metrics, run.loss_key)
        steps = run.metrics["step"].to_numpy()
        return [Finding(kind="loss_above", step=int(s), metric=run.loss_key, value=float(v), severity=CRITICAL,
                        evidence=[f"loss {v:.1f} is above the ceiling {self.ceiling:g}"])
                for s, v in zip(steps, values) if v > self.ceiling]


def loss_above_card(items, context):
    """Its own card in the report: one line per step, in the rule's words."""
    rows = "".join(f"<li>step {f['step']}: {f['value']:.1f}</li>" for f in items)
    return f'<article class="card toy-card" data-kind="loss_above"><h3>Over the ceiling</h3><ul>{rows}</ul></article>'


register_rule(LossAbove)
register_kind(FindingKind("loss_above", "loss above the ceiling", fail_on="loss-above", card=loss_above_card))
'''


def _loss_log(path: Path, peak_at: int | None = 60, peak: float = 150.0, n: int = 200) -> Path:
    rng = np.random.default_rng(0)
    loss = 2.0 + 0.02 * rng.standard_normal(n)
    if peak_at is not None:
        loss[peak_at] = peak
    path.write_text("".join(json.dumps({"step": i, "loss": float(v)}) + "\n" for i, v in enumerate(loss)))
    return path


@pytest.fixture()
def toy_rule(tmp_path, monkeypatch):
    (tmp_path / "toy_rule_module.py").write_text(TOY_RULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("toy_rule_module")
    yield module
    from forensics.detect.kinds import KINDS
    from forensics.detect.rules import unregister_rule

    unregister_rule("loss_above")
    KINDS.pop("loss_above", None)
    sys.modules.pop("toy_rule_module", None)


def test_a_rule_in_one_module_reaches_summary_findings_report_and_fail_on(tmp_path, toy_rule, capsys):
    log = _loss_log(tmp_path / "m.jsonl")
    out_json, out_html = tmp_path / "f.json", tmp_path / "r.html"
    code = main(
        ["audit", "--metrics", str(log), "--json", str(out_json), "--html", str(out_html), "--fail-on", "loss-above"]
    )
    printed = capsys.readouterr().out
    assert code == 1
    assert "loss above the ceiling: step 60 loss = 150" in printed
    findings = json.loads(out_json.read_text())
    (toy,) = [f for f in findings["findings"] if f["kind"] == "loss_above"]
    assert (toy["step"], toy["value"], toy["severity"]) == (60, 150.0, "critical") and 0 <= toy["confidence"] <= 1
    html = out_html.read_text()
    assert html.count('class="card toy-card"') == 1 and "<h3>Over the ceiling</h3><ul><li>step 60: 150.0</li>" in html
    # its parameter from --set: a higher ceiling, no finding, no failure
    code = main(
        [
            "audit",
            "--metrics",
            str(log),
            "--json",
            str(out_json),
            "--no-html",
            "--fail-on",
            "loss-above",
            "--set",
            "detect.loss_above.ceiling=200",
        ]
    )
    assert code == 0 and not [f for f in json.loads(out_json.read_text())["findings"] if f["kind"] == "loss_above"]


def test_an_unknown_fail_on_kind_rule_or_parameter_is_one_line_exit_2(tmp_path, capsys):
    log = _loss_log(tmp_path / "m.jsonl")
    for extra, message in (
        (["--fail-on", "loss-above"], "--fail-on: unknown kind loss-above"),
        (["--set", "detect.nosuch.x=1"], "detect.nosuch: no such rule"),
        (["--set", "detect.spikes.zz=1"], "detect.spikes: unknown parameter 'zz'"),
        (["--set", "detect.spikes.window=2"], "detect.spikes: 'window' must be an integer >= 4"),
        (["--set", "detect.causes.same_samples=1.5"], "detect.causes: 'same_samples' must be a number > 0 and <= 1"),
    ):
        code = main(["audit", "--metrics", str(log), "--no-html", "--json", str(tmp_path / "f.json"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, (extra, err)


def test_a_spike_rule_parameter_from_run_toml_and_from_set_changes_the_finding(tmp_path, capsys):
    case = tmp_path / "case"
    case.mkdir()
    _loss_log(case / "metrics.jsonl", peak_at=150, peak=3.6)  # a 1.8x spike of a 2.0 loss
    (case / "run.toml").write_text('metrics = ["metrics.jsonl"]\n')

    def spike_steps(*extra: str) -> list[int]:
        assert main(["audit", str(case), "--no-html", *extra]) == 0
        capsys.readouterr()
        return [s["step"] for s in json.loads((case / "findings.json").read_text())["spikes"]]

    assert spike_steps() == [150]  # the default ratio 1.5
    (case / "run.toml").write_text('metrics = ["metrics.jsonl"]\n\n[detect.spikes]\nratio = 2.0\n')
    assert spike_steps() == []  # run.toml asks for a 2x jump
    assert spike_steps("--set", "detect.spikes.ratio=1.5") == [150]  # --set wins over run.toml


@pytest.mark.parametrize("cuts", [[], [61], [30, 59, 60, 61, 150], list(range(5, 200, 7))])
def test_a_registered_rule_gives_the_audits_findings_on_the_live_loop_for_any_chunking(tmp_path, toy_rule, cuts):
    """The live loop runs every rule of the registry, a user's too: the rows fed in chunks (the run opened on its
    first 20) end in the audit's findings and causes, the toy rule's included."""
    from forensics.live import LiveRun, resolve_target
    from forensics.pipeline.audit import run_audit
    from forensics.schema import open_case

    case = tmp_path / "case"
    case.mkdir()
    (case / "run.toml").write_text('metrics = ["metrics.jsonl"]\n')
    lines = _loss_log(case / "metrics.jsonl", peak_at=60).read_text().splitlines(keepends=True)
    offline = run_audit(open_case(case)).findings
    (case / "metrics.jsonl").write_text("".join(lines[:20]))
    run = LiveRun(resolve_target([str(case)])).start()
    bounds = [20, *(c for c in cuts if c > 20), len(lines)]
    for a, b in zip(bounds, bounds[1:]):
        with (case / "metrics.jsonl").open("a") as fh:
            fh.write("".join(lines[a:b]))
        run.refresh()
    online = run.finish()
    assert [(f["kind"], f["step"], f["severity"]) for f in offline["findings"] if f["kind"] == "loss_above"] == [
        ("loss_above", 60, "critical")
    ]
    assert sorted(online["findings"], key=json.dumps) == sorted(offline["findings"], key=json.dumps)
    assert online["causes"] == offline["causes"]
