"""One online shape and one parameter mixin: every rule that runs live hands the live loop an ``OnlineRule``
(``update(rows) -> findings``, ``finish()``), every engine behind it is driven the same way, and every rule and
detector takes ``get_params``/``validate`` from :class:`ParamsMixin` (introspection written once)."""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
import pytest

from forensics.detect.base import OnlineRule, RunTables
from forensics.detect.evidence.jumpiness import JumpinessDetector
from forensics.detect.findings import Finding
from forensics.detect.metric_detector import MetricDetector
from forensics.detect.params import ParamsMixin
from forensics.detect.rules import build_rules, rule_classes
from forensics.detect.rules.nonfinite import LiveNonfinite, NonfiniteDetector
from forensics.detect.spikes import SpikeDetector, SpikeDriver
from forensics.detect.spikes.rule import LiveSpikes, SpikeRule
from forensics.errors import ForensicsError
from forensics.evaluation.framework_rules import FRAMEWORK_RULES

DETECTORS = [SpikeDetector, NonfiniteDetector, JumpinessDetector, *FRAMEWORK_RULES]
ENGINES = [SpikeDriver, LiveSpikes, LiveNonfinite, *DETECTORS]


def _run(n: int = 400) -> RunTables:
    """A loss with a 2x spike at step 250, a grad norm that spikes with it, and a NaN in a context metric."""
    rng = np.random.default_rng(0)
    loss = 2.0 + 0.02 * rng.standard_normal(n)
    grad = 1.0 + 0.02 * rng.standard_normal(n)
    loss[250], grad[249] = 4.0, 3.0
    lr = np.full(n, 1e-3)
    lr[100] = np.nan
    metrics = pd.DataFrame({"step": np.arange(n), "loss": loss, "grad_norm": grad, "lr": lr})
    return RunTables(metrics=metrics, loss_key="loss", analysed=["loss", "grad_norm"], grad_norm_key="grad_norm")


def _dicts(found: list[Finding]) -> list[dict]:
    return sorted((f.to_dict() for f in found), key=lambda d: (d["step"], d["kind"], str(d.get("metric"))))


@pytest.mark.parametrize("cls", rule_classes(), ids=lambda c: c.name)
def test_every_registered_rules_online_state_is_the_one_shape_and_answers_as_detect(cls):
    run = _run()
    state = cls().online(run)
    if state is None:
        return
    assert isinstance(state, OnlineRule)
    found: list[Finding] = []
    for a in range(0, 400, 37):
        found += state.update(run.metrics.iloc[a : a + 37])
    found += state.finish()
    assert _dicts(found) == _dicts(cls().detect(run))


def test_the_rules_that_run_live_are_the_spike_and_nonfinite_rules_and_they_find_the_planted_steps():
    run = _run()
    live = {c.name: c().online(run) for c in rule_classes()}
    assert sorted(n for n, s in live.items() if s is not None) == ["nonfinite", "spikes"]
    spikes = live["spikes"].update(run.metrics) + live["spikes"].finish()
    assert sorted((f.metric, f.step) for f in spikes if f.kind == "spike") == [("grad_norm", 249), ("loss", 250)]
    nonfinite = live["nonfinite"].update(run.metrics) + live["nonfinite"].finish()
    assert [(f.metric, f.step) for f in nonfinite] == [("lr", 100)]


@pytest.mark.parametrize("cls", ENGINES, ids=lambda c: c.__name__)
def test_every_engine_is_driven_by_update_rows_and_finish(cls):
    """``update``'s first argument is ``rows``; anything after it is optional context; ``finish`` takes nothing."""
    assert issubclass(cls, OnlineRule)
    update = list(inspect.signature(cls.update).parameters.values())[1:]
    assert update[0].name == "rows"
    assert [p.name for p in update[1:] if p.default is inspect.Parameter.empty] == []
    assert list(inspect.signature(cls.finish).parameters) == ["self"]


def test_the_spike_driver_and_a_detector_answer_update_rows_alone_as_detect():
    run = _run()
    driver = SpikeDriver(["loss", "grad_norm"], "grad_norm")
    detector = SpikeDetector("loss")
    found_driver, found_detector = [], []
    for a in range(0, 400, 50):
        found_driver += driver.update(run.metrics.iloc[a : a + 50])
        found_detector += detector.update(run.metrics.iloc[a : a + 50])
    found_driver += driver.finish()
    found_detector += detector.finish()
    assert _dicts(found_driver) == _dicts(SpikeDriver(["loss", "grad_norm"], "grad_norm").detect(run.metrics))
    assert _dicts(found_detector) == _dicts(SpikeDetector("loss").detect(run.metrics))
    assert [f.step for f in found_detector if f.kind == "spike"] == [250]


@pytest.mark.parametrize("cls", [*rule_classes(), *DETECTORS], ids=lambda c: getattr(c, "name", "") or c.__name__)
def test_every_rule_and_detector_takes_its_parameters_from_the_one_mixin(cls):
    assert issubclass(cls, ParamsMixin)
    for method in ("parameter_defaults", "get_params", "clone"):  # introspection is written once
        assert getattr(cls, method).__qualname__.startswith("ParamsMixin."), method
    obj = cls()
    assert obj.get_params() == cls.parameter_defaults()
    again = type(obj)(**obj.get_params())
    assert again.get_params() == obj.get_params()
    assert repr(obj.clone()) == repr(obj)


def test_the_spike_rule_declares_the_detectors_parameters_and_defaults():
    detector = {k: v for k, v in SpikeDetector.parameter_defaults().items() if k != "metric"}
    assert SpikeRule.parameter_defaults() == detector
    assert set(SpikeRule.parameter_constraints) == set(detector)
    rule = SpikeRule(z=5.0, ratio=2.0)
    assert rule.get_params() == {**detector, "z": 5.0, "ratio": 2.0}
    driver = rule.driver(_run())
    assert driver.detectors_["loss"].get_params() == {**detector, "metric": "loss", "z": 5.0, "ratio": 2.0}


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SpikeRule(window=4), None),
        (lambda: SpikeRule(window=3), "detect.spikes: 'window' must be an integer >= 4; got 3"),
        (lambda: SpikeRule(window=4.0), "detect.spikes: 'window' must be an integer >= 4; got 4.0"),
        (lambda: SpikeRule(min_peaks=3000), None),
        (lambda: SpikeRule(min_peaks=3001), "detect.spikes: 'min_peaks' (3001) cannot exceed 'tail_window' (3000)"),
        (lambda: SpikeRule(false_rate=None), None),
        (
            lambda: SpikeRule(false_rate=0.0),
            "detect.spikes: 'false_rate' must be a number > 0 and < 10000, or none; got 0.0",
        ),
        (lambda: SpikeDetector(z=1e-9), None),
        (lambda: SpikeDetector(z=0), "SpikeDetector: 'z' must be a number > 0; got 0"),
        (lambda: SpikeDetector(tail_window=49), "SpikeDetector: 'min_peaks' (50) cannot exceed 'tail_window' (49)"),
        (lambda: SpikeDetector(trend=1), "SpikeDetector: 'trend' must be true or false; got 1"),
    ],
)
def test_a_parameter_outside_its_constraint_fails_validate_with_one_message(make, message):
    obj = make()
    if message is None:
        obj.validate()
        return
    with pytest.raises(ForensicsError) as err:
        obj.validate()
    assert str(err.value) == message


@pytest.mark.parametrize(
    "table, message",
    [
        ({"spikes": {"z": 5.0}}, None),
        ({"spikes": {"zz": 5.0}}, "detect.spikes: unknown parameter 'zz'; its parameters are "),
        ({"spikes": {"confirm": 0}}, "detect.spikes: 'confirm' must be an integer >= 1; got 0"),
    ],
)
def test_run_toml_spike_tables_build_the_rule_or_name_the_bad_key(table, message):
    if message is None:
        (rule,) = [r for r in build_rules(table, has_plan=False) if r.name == "spikes"]
        assert rule.z == 5.0 and rule.get_params()["z"] == 5.0
        return
    with pytest.raises(ForensicsError) as err:
        build_rules(table, has_plan=False)
    assert str(err.value).startswith(message)


def test_metric_detector_subclasses_are_all_checked():
    """A new detector is covered by the tests above once it is listed here (every subclass in the package)."""
    import forensics.detect.evidence.jumpiness  # noqa: F401
    import forensics.detect.rules.nonfinite  # noqa: F401

    def subclasses(cls: type) -> set[type]:
        return {s for c in cls.__subclasses__() for s in (c, *subclasses(c))}

    found = {c for c in subclasses(MetricDetector) if c.__module__.startswith("forensics.")}
    framework_base = {c for c in found if c.__name__ == "FrameworkRule"}
    assert found - framework_base == set(DETECTORS)
