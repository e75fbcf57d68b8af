"""The one rule protocol: every built-in rule declares each parameter's allowed values, the declarations are
checked at their boundaries, and a missing column is reported from the rule's declaration."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forensics.detect.base import Rule, RunTables
from forensics.detect.params import Param, at_least, check_params, fraction, positive
from forensics.detect.rules import rule_classes
from forensics.errors import ForensicsError


@pytest.mark.parametrize("cls", rule_classes(), ids=lambda c: c.name)
def test_every_builtin_rule_declares_each_parameter_and_its_defaults_pass(cls):
    defaults = cls.parameter_defaults()
    assert set(cls.parameter_constraints) == set(defaults)
    rule = cls()
    rule.validate()
    assert rule.get_params() == defaults


@pytest.mark.parametrize(
    "param, value, allowed",
    [
        (positive("int"), 1, True),
        (positive("int"), 0, False),
        (positive("int"), 1.5, False),
        (positive("int"), True, False),
        (positive("int"), np.int64(3), True),
        (positive("int"), None, False),
        (positive(), 1e-12, True),
        (positive(), 0.0, False),
        (positive(), float("nan"), False),
        (positive("int", none=True), None, True),
        (fraction(), 1.0, True),
        (fraction(), 1.0001, False),
        (fraction(), 1e-9, True),
        (fraction(), 0, False),
        (at_least(4, "int"), 4, True),
        (at_least(4, "int"), 3, False),
        (at_least(0), 0.0, True),
        (Param(low=0, low_open=True, high=1e4, high_open=True, none=True), 1e4, False),
        (Param(low=0, low_open=True, high=1e4, high_open=True, none=True), 9999.9, True),
        (Param(low=0, low_open=True, high=1e4, high_open=True, none=True), None, True),
        (Param("bool"), False, True),
        (Param("bool"), 0, False),
        (Param("str"), "bucket", True),
        (Param(choices=("eval", "train")), "train", True),
        (Param(choices=("eval", "train")), "test", False),
    ],
)
def test_parameter_constraints_at_their_boundaries(param, value, allowed):
    assert param.allows(value) is allowed


def test_a_disallowed_value_names_the_rule_the_parameter_and_what_is_allowed():
    with pytest.raises(ForensicsError) as err:
        check_params("detect.toy", {"window": at_least(4, "int")}, {"window": 2})
    assert str(err.value) == "detect.toy: 'window' must be an integer >= 4; got 2"


class NeedsCluster(Rule):
    name = "needs_cluster"
    required_columns = {"tags": ("step", "cluster")}

    def __init__(self) -> None:
        pass

    def detect(self, run, found=None):
        self.check_inputs(run)
        return []


def test_a_missing_column_is_reported_from_the_rules_declaration():
    metrics = pd.DataFrame({"step": np.arange(3), "loss": [1.0, 2.0, 3.0]})
    run = RunTables(metrics=metrics, loss_key="loss", analysed=["loss"], tags=pd.DataFrame({"step": [0, 1, 2]}))
    with pytest.raises(ForensicsError) as err:
        NeedsCluster().detect(run)
    assert str(err.value).startswith(
        "detect.needs_cluster: the tags table lacks column 'cluster' (this rule reads step, cluster)"
    )
    assert NeedsCluster().detect(RunTables(metrics=metrics, loss_key="loss", analysed=["loss"])) == []


@pytest.mark.parametrize(
    ("seconds", "want"),
    [
        ({}, ""),
        ({"spikes": 0.049, "samples": 0.0}, ""),  # under the floor: nothing worth naming
        ({"spikes": 0.05}, "spikes 0.1 s"),  # at the floor
        ({"a": 1.0, "b": 2.0, "c": 0.5, "d": 0.7, "e": 0.6}, "b 2.0 s, a 1.0 s, d 0.7 s, e 0.6 s"),  # the top 4
        ({"b": 1.0, "a": 1.0}, "a 1.0 s, b 1.0 s"),  # a tie: by name
    ],
)
def test_the_rules_stage_line_names_the_slowest_rules(seconds, want):
    from forensics.detect.rules import slowest_rules

    assert slowest_rules(seconds) == want
