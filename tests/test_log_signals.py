"""Optimizer and numerics signals read from the logs (forensics.detect.evidence.log_signals): the grad norm's
precedence rule applied to the update norm, params norm, z loss and zero-gradient count at its boundaries (leads at
one step, with, lags, none below the factor or the z), the class each relation implies, and Megatron-format logs
audited end to end: a synthetic one whose params norm leads its loss spike, and BLOOM-176B's, whose ``num zeros`` is
0 throughout and says nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.detect.evidence.log_signals import PARAMS_NORM_FACTOR, log_signals
from forensics.detect.evidence.precedence import PRECEDENCE_FACTOR, PRECEDENCE_Z, precedence, rise
from forensics.detect.findings import Finding

REPO = Path(__file__).resolve().parents[1]
PARAMS_LOG = REPO / "fixtures" / "logs" / "megatron-params-norm-rise.log"
START = 60
STEPS = np.arange(0, 80)
#: A wobble around the baseline: +-0.1% alternating, so the median of the rows before the window is the base exactly
#: (an even count) and its robust SD about 0.0015 x base, far below every factor.
WOBBLE = 0.001 * (-1.0) ** STEPS

#: (signal, column as the logger writes it, baseline level, factor that applies to it)
SIGNALS = [
    ("update_norm", "optim/update norm", 0.02, PRECEDENCE_FACTOR),
    ("params_norm", "params norm", 250.0, PARAMS_NORM_FACTOR),
    ("z_loss", "train/Z loss", 1e-4, PRECEDENCE_FACTOR),
]


def _frame(column: str, values: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"step": STEPS, "lm loss": 3.0 + 0.01 * np.cos(STEPS), column: values})


def _risen(base: float, factor: float, first: int, ratio: float | None = None) -> np.ndarray:
    """The signal at ``base`` with the wobble, then at ``ratio`` (default 1.2 x ``factor``) x base from ``first``."""
    values = base * (1.0 + WOBBLE)
    values[STEPS >= first] = base * (ratio if ratio is not None else 1.2 * factor)
    return values


@pytest.mark.parametrize(("name", "column", "base", "factor"), SIGNALS)
@pytest.mark.parametrize(
    ("first", "ratio_of_factor", "relation", "lead"),
    [
        (START - 1, 1.2, "leads", 1),  # one step ahead: leads
        (START, 1.2, "with", 0),
        (START + 1, 1.2, "lags", -1),
        (START - 1, 0.99, "none", None),  # just below the factor
        (START - 1, 1.01, "leads", 1),  # just above it
    ],
)
def test_relation_at_its_boundaries(
    name: str, column: str, base: float, factor: float, first: int, ratio_of_factor: float, relation: str, lead
) -> None:
    m = _frame(column, _risen(base, factor, first, ratio_of_factor * factor))
    got = log_signals(m, START)["signals"][name]
    assert got["column"] == column
    assert got["relation"] == relation
    assert got["lead_steps"] == lead
    assert got["first_step"] == (None if relation == "none" else first)
    assert got["peak_ratio"] == pytest.approx(ratio_of_factor * factor, rel=1e-6)


@pytest.mark.parametrize(("name", "column", "base", "factor"), SIGNALS)
def test_no_rise_below_the_robust_z(name: str, column: str, base: float, factor: float) -> None:
    # a baseline so noisy that 2x the factor is under PRECEDENCE_Z robust SDs: not elevated
    noisy = base * (1.0 + 2.0 * factor * np.sin(1.7 * STEPS))
    noisy = np.abs(noisy)
    m = _frame(column, noisy)
    m.loc[m["step"] >= START - 1, column] = 2.0 * factor * float(np.median(noisy[: START - 10]))
    got = log_signals(m, START)["signals"][name]
    assert got["relation"] == "none"


@pytest.mark.parametrize(
    ("first", "count", "relation", "lead"),
    [
        (START - 1, 1.0, "leads", 1),  # from 0: any count above it is a rise
        (START, 1.0, "with", 0),
        (START + 1, 1.0, "lags", -1),
        (START - 1, 0.0, "none", None),  # stays at 0 (BLOOM-176B's num zeros)
    ],
)
def test_num_zeros_rise_from_zero(first: int, count: float, relation: str, lead) -> None:
    zeros = np.zeros(len(STEPS))
    zeros[STEPS == first] = count
    got = log_signals(_frame("num zeros", zeros), START)["signals"]["num_zeros"]
    assert (got["relation"], got["lead_steps"], got["baseline"]) == (relation, lead, 0.0)
    assert got["peak_ratio"] is None


@pytest.mark.parametrize(
    ("ratio", "relation"), [(PRECEDENCE_FACTOR * 0.99, "none"), (PRECEDENCE_FACTOR * 1.01, "with")]
)
def test_num_zeros_above_a_nonzero_baseline_at_the_factor(ratio: float, relation: str) -> None:
    m = _frame("num_zeros_in_grad", _risen(1000.0, PRECEDENCE_FACTOR, START, ratio))
    assert log_signals(m, START)["signals"]["num_zeros"]["relation"] == relation


#: Which relations count for which class (module docstring): the update and the weights lead, numerics at or before.
CLASS_ROWS = [
    ("update_norm", "optim/update norm", 0.02, START - 1, "optimizer", True),
    ("update_norm", "optim/update norm", 0.02, START, "optimizer", False),
    ("params_norm", "params norm", 250.0, START - 1, "optimizer", True),
    ("params_norm", "params norm", 250.0, START, "optimizer", False),
    ("z_loss", "train/Z loss", 1e-4, START - 1, "numerics", True),
    ("z_loss", "train/Z loss", 1e-4, START, "numerics", True),
    ("z_loss", "train/Z loss", 1e-4, START + 1, "numerics", False),
]


@pytest.mark.parametrize(("name", "column", "base", "first", "cause", "says"), CLASS_ROWS)
def test_the_class_a_relation_implies(name: str, column: str, base: float, first: int, cause: str, says: bool) -> None:
    factor = PARAMS_NORM_FACTOR if name == "params_norm" else PRECEDENCE_FACTOR
    found = log_signals(_frame(column, _risen(base, factor, first)), START)
    other = "numerics" if cause == "optimizer" else "optimizer"
    assert (found[cause], found[other]) == (says, False)
    (sentence,) = found["evidence"]
    assert sentence.startswith(f"{column} rose ")
    assert sentence.endswith(f"({cause}).") is says


def test_update_norm_sentence() -> None:
    found = log_signals(_frame("update norm", _risen(0.02, PRECEDENCE_FACTOR, START - 3, 2.0)), START)
    assert found["evidence"] == [
        "update norm rose 3 steps ahead of the loss spike at 60 (2x its baseline 0.02): "
        "the updates grew before the loss (optimizer)."
    ]


def test_nothing_logged_is_none() -> None:
    assert log_signals(_frame("grad norm", np.ones(len(STEPS))), START) is None


def test_grad_norm_precedence_is_the_same_rule() -> None:
    # the grad norm's precedence and rise() on its column agree on every field
    values = _risen(0.5, PRECEDENCE_FACTOR, START - 2)
    m = _frame("grad_norm", values)
    (p,) = precedence([Finding(kind="spike", step=START, metric="lm loss")], m)
    r = rise(m, "grad_norm", START, factor=PRECEDENCE_FACTOR, z=PRECEDENCE_Z)
    assert (p["grad_norm"], p["lead_steps"], p["grad_norm_first_step"], p["grad_norm_peak_ratio"]) == (
        r["relation"],
        r["lead_steps"],
        r["first_step"],
        r["peak_ratio"],
    )
    assert r["relation"] == "leads" and r["lead_steps"] == 2


def _audit(log: Path, tmp_path: Path) -> dict:
    out = tmp_path / "findings.json"
    assert main(["audit", "--metrics", str(log), "--json", str(out), "--no-html"]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


def test_megatron_params_norm_rise_is_evidence_on_its_spike(tmp_path: Path) -> None:
    findings = _audit(PARAMS_LOG, tmp_path)
    # iteration 62's spike is canonical 61; params norm first 5% above its baseline at iteration 59 (canonical 58)
    params = (
        "params norm rose 3 steps ahead of the loss spike at 61 (1.36x its baseline 251): "
        "the weights grew before the loss (optimizer)."
    )
    zeros = (
        "num zeros rose at the loss spike's start, step 61 (from 0 to 1.89e+04): gradient entries went to 0 (numerics)."
    )
    spike = next(s for s in findings["spikes"] if s["metric"] == "lm loss" and s["step"] == 61)
    assert params in spike["evidence"] and zeros in spike["evidence"]
    cause = next(c for c in findings["causes"] if 61 in c["steps"])
    signals = cause["details"]["logged_signals"]
    assert signals["evidence"] == [params, zeros]
    assert (signals["optimizer"], signals["numerics"]) == (True, True)
    assert signals["signals"]["params_norm"]["first_step"] == 58
    assert signals["signals"]["num_zeros"]["relation"] == "with"


def test_bloom_num_zeros_all_zero_is_no_evidence(tmp_path: Path, real_logs_dir: Path) -> None:
    findings = _audit(real_logs_dir / "bloom-176b-tr11-megatron.log", tmp_path)
    spike = next(s for s in findings["spikes"] if s["metric"] == "lm loss")
    signals = spike["details"]["attribution"]["logged_signals"]
    assert signals["signals"]["num_zeros"]["relation"] == "none"
    assert (signals["optimizer"], signals["numerics"], signals["evidence"]) == (False, False, [])
    assert all("logged_signals" not in c["details"] for c in findings["causes"])
