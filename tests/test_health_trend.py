"""Run health, the trend: divergence (and where to resume), overfitting, plateau / not learning, the LR schedule.

Each decision rule's boundary in a table; then whole generated runs with one planted fault each
(forensics.datasets.health) audited as a user would, a clean control that stays quiet, the real Trainer fixture and
the real public logs that must stay quiet."""

from __future__ import annotations

import numpy as np
import pytest

from forensics.datasets.health import health_run, write_case
from forensics.detect.base import RunTables
from forensics.detect.rules.divergence import DivergenceRule, find_divergence
from forensics.detect.rules.lr_schedule import LrScheduleRule, schedule_problems, unstable_start
from forensics.detect.rules.overfitting import OverfittingRule, find_overfitting
from forensics.detect.rules.plateau import PlateauRule, find_plateau
from forensics.pipeline.audit import run_audit
from forensics.schema.case import open_case

HEALTH = ("divergence", "overfitting", "plateau", "lr_schedule")


def _step_run(n: int, at: int, length: int, high: float, low: float = 2.0) -> np.ndarray:
    v = np.full(n, low)
    v[at : at + length] = high
    return v


@pytest.mark.parametrize(
    ("at", "length", "high", "onset"),
    [
        (200, 50, 3.0, None),  # lasted 49 steps: a rise that came back inside the window
        (200, 51, 3.0, 200),  # lasted 50 steps: the hold is reached
        (200, 100, 2.39, None),  # 19.5% above the best level: below rise 0.2
        (200, 100, 2.41, 200),  # 20.5%
        (349, 51, 3.0, 349),  # to the end of the run, 50 steps
        (350, 50, 3.0, None),  # the log ends inside the window: not judged a divergence yet
    ],
)
def test_divergence_boundaries(at, length, high, onset):
    v = _step_run(400, at, length, high)
    hit = find_divergence(np.arange(400), v, rise=0.2, z=6.0, hold=50, window_share=0.01)
    assert (None if hit is None else hit["onset_index"]) == onset


@pytest.mark.parametrize(
    ("d", "after", "train_falls", "found"),
    [
        (0.039, 3, True, False),
        (0.041, 3, True, True),  # rise 0.02 of the minimum 2.0 = 0.04
        (0.1, 2, True, False),  # two evals after the minimum: min_after 3
        (0.1, 3, False, False),  # the train loss rose too: no overfitting
    ],
)
def test_overfitting_boundaries(d, after, train_falls, found):
    ev = np.array([5.0, 4.0, 3.0, 2.0] + [2.0 + d] * after)
    steps = np.arange(len(ev)) * 100 + 99
    train_steps = np.arange(steps[-1] + 1)
    train = np.linspace(5.0, 1.0, len(train_steps)) if train_falls else np.linspace(1.0, 5.0, len(train_steps))
    hit = find_overfitting(steps, ev, train_steps, train, rise=0.02, z=0.0, min_after=3)
    assert (hit is not None) == found
    if found:
        assert steps[hit["best_index"]] == 399


@pytest.mark.parametrize(("drop", "problem"), [(0.49, "not_learning"), (0.51, None)])
def test_not_learning_boundary(drop, problem):
    v = np.r_[np.full(200, 10.0), np.full(200, 10.0 - drop)]  # min_drop 0.05 of 10
    hit = find_plateau(np.arange(400), v, share=0.05, min_drop=0.05, tail_share=0.25, flat_ratio=0.1, z=6.0)
    assert (None if hit is None else hit["problem"]) == problem


@pytest.mark.parametrize(("ratio", "problem"), [(0.095, "plateau"), (0.105, None)])
def test_late_plateau_boundary(ratio, problem):
    # medians of a falling series are its centre values: before = v[210] - v[300], tail = v[300] - v[389]
    v = np.r_[10.0 - 0.01 * np.arange(200), 8.0 - 0.01 * np.arange(1, 101)]
    before = v[210] - v[299] - 0.01
    tail_slope = ratio * before / 89.0
    v = np.r_[v, v[-1] - tail_slope * np.arange(1, 101)]
    hit = find_plateau(np.arange(400), v, share=0.05, min_drop=0.05, tail_share=0.25, flat_ratio=0.1, z=6.0)
    assert (None if hit is None else hit["problem"]) == problem


@pytest.mark.parametrize(
    ("lr", "found"),
    [
        ([1.0, 1.0, 1.0, 1.49, 1.49], []),
        ([1.0, 1.0, 1.0, 1.51, 1.51], [("jump", 3)]),
        ([0.1, 0.2, 0.3, 0.4, 0.5, 1.0], []),  # a warm-up: never from a steady rate
        ([1.0, 1.0, 1.0, 0.09, 0.2, 0.4], [("reset", 3)]),  # below reset_share 0.1, climbing again
        ([1.0, 1.0, 1.0, 0.11, 0.2, 0.4], []),
        ([1.0, 1.0, 1.0, 0.05, 0.05, 0.05], []),  # a drop that stays: no fresh scheduler
        ([1.0, 1.0], []),  # too short to have a step before the change
        ([1.0, float("nan"), 1.0, 2.0, 2.0], []),  # a rate not logged is never a steady one
        ([1.0, 1.0, 1.0, float("nan"), 1.6], []),
        ([0.0, 0.0, 1.0, 1.0, 2.0], [("jump", 4)]),  # from zero: judged once the rate is steady
    ],
)
def test_schedule_problem_boundaries(lr, found):
    got = schedule_problems(np.arange(len(lr)), np.array(lr), reset_share=0.1, jump=1.5)
    assert [(p["problem"], p["step"]) for p in got] == found


@pytest.mark.parametrize(("climb", "unstable"), [(0.49, False), (0.51, True)])
def test_unstable_start_boundary(climb, unstable):
    loss = np.r_[np.full(3, 10.0), np.full(7, 8.0), np.full(10, 8.0 + climb), np.full(10, 7.0)]  # 0.05 of 10
    assert (unstable_start(loss, early=30, unstable=0.05) is not None) == unstable


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """findings.json of each generated run (3,000 steps, HF checkpoint-N/ every 250), audited from its case folder."""
    pytest.importorskip("safetensors")
    out = {}
    for fault, kw in [
        ("clean", {}),
        ("divergence", {}),
        ("spike", {}),
        ("warm_restart", {}),
        ("not_learning", {}),
        ("plateau", {"lr_mode": "zero"}),
        ("plateau", {"lr_mode": "fine"}),
        ("overfitting", {}),
        ("no_warmup", {}),
        ("lr_reset", {}),
        ("lr_jump", {}),
    ]:
        name = fault + "".join(f"-{v}" for v in kw.values())
        case = write_case(health_run(fault, **kw), tmp_path_factory.mktemp(name), checkpoints="hf")
        out[name] = run_audit(open_case(case)).findings
    return out


def _health(findings, at_least_warning=False):
    return [
        f
        for f in findings["findings"]
        if f["kind"] in HEALTH and (not at_least_warning or f["severity"] in ("warning", "critical"))
    ]


def test_clean_control_and_recovering_runs_are_quiet(audited):
    for name in ("clean", "spike", "warm_restart"):
        assert _health(audited[name], at_least_warning=True) == [], name
    assert _health(audited["clean"]) == []
    assert audited["clean"]["verdict"] == "No spike and no NaN/inf in train/loss, grad_norm over 3,000 steps."
    assert [(f["details"]["problem"], f["step"]) for f in _health(audited["warm_restart"])] == [
        ("jump", 1000),
        ("jump", 2000),
    ]  # the planned restarts are recorded as info


def test_divergence_names_its_onset_and_where_to_resume(audited):
    f = audited["divergence"]
    (d,) = _health(f)
    assert (d["kind"], d["severity"], d["step"]) == ("divergence", "critical", 2015)  # planted at 2010: within 2%
    det = d["details"]
    # the last checkpoint at least max(10, 1% of 3,000 = 30) steps before the onset
    assert det["resume_step"] == 1750 and det["resume_checkpoint"].endswith("checkpoint-1750")
    assert det["lr"] == pytest.approx(1.0e-4, rel=0.01) and det["grad_norm"] > 2 * det["grad_norm_before"]
    assert not [x for x in f["findings"] if x["kind"] == "level_shift"]  # told once, as the divergence
    assert f["verdict"].startswith("train/loss diverged from step 2015")  # never an all-clear
    (cause,) = [c for c in f["causes"] if c["kind"] == "divergence"]
    assert cause["severity"] == "critical" and "checkpoint-1750" in cause["next_step"]


def test_overfitting_onset_at_the_eval_minimum(audited):
    f = audited["overfitting"]
    assert f["run"]["eval_loss_key"] == "eval/loss"
    (o,) = _health(f)
    assert (o["kind"], o["severity"], o["details"]["best_step"], o["details"]["onset_step"]) == (
        "overfitting",
        "warning",
        2099,
        2099,
    )
    assert o["details"]["best_checkpoint"].endswith("checkpoint-2000")


def test_plateau_and_not_learning_say_the_learning_rate(audited):
    (n,) = _health(audited["not_learning"])
    assert (n["severity"], n["details"]["problem"], n["details"]["start_step"]) == ("warning", "not_learning", 0)
    (z,) = _health(audited["plateau-zero"])
    assert (z["severity"], z["details"]["problem"], z["step"], z["details"]["lr_state"]) == (
        "warning",
        "plateau",
        1950,
        "zero",
    )
    (fine,) = _health(audited["plateau-fine"])  # at a fine rate: the data's floor looks the same, recorded only
    assert (fine["severity"], fine["details"]["lr_state"]) == ("info", "fine")


def test_lr_schedule_problems(audited):
    (w,) = _health(audited["no_warmup"])
    assert (w["severity"], w["details"]["problem"], w["step"]) == ("warning", "no_warmup", 0)
    assert [(f["severity"], f["details"]["problem"], f["step"]) for f in _health(audited["lr_reset"])] == [
        ("info", "reset", 2010)
    ]
    assert [(f["severity"], f["details"]["problem"], f["step"]) for f in _health(audited["lr_jump"])] == [
        ("info", "jump", 2010)
    ]


def test_real_trainer_runs_stay_quiet(hf_cases):
    for name in ("clean_grouped", "random_accum2_corrupt"):
        f = run_audit(open_case(hf_cases[name].out)).findings
        assert _health(f, at_least_warning=True) == [], name
        assert f["health"]["overfitting"] == {"judged": False, "why": "no eval loss logged"}


def test_real_public_logs_no_false_divergence(real_logs_dir):
    from forensics.schema import metric_columns
    from forensics.schema.keys import choose_key
    from forensics.sources import read_metrics

    for log, judged in (("modded-nanogpt-1b-adamw.log", True), ("bloom-176b-tr11-megatron.log", False)):
        metrics = read_metrics([real_logs_dir / log])[0]
        cols = metric_columns(metrics)
        loss = str(choose_key(cols, "loss").key)
        run = RunTables(
            metrics=metrics, loss_key=loss, analysed=[loss], eval_loss_key=choose_key(cols, "eval_loss").key
        )
        for rule in (DivergenceRule(), OverfittingRule(), PlateauRule(), LrScheduleRule()):
            assert [(f.kind, f.severity) for f in rule.detect(run, [])] == [], (log, rule.name)
        rule = DivergenceRule()
        rule.detect(run)
        assert rule.section_["divergence"]["judged"] is judged


def test_the_learning_rate_at_a_spike_is_in_its_evidence(audited):
    (spike,) = [s for s in audited["spike"]["spikes"] if s["metric"] == "train/loss"]
    lr = health_run("spike").metrics.set_index("step")["lr"]
    assert spike["step"] == 2010 and spike["details"]["lr"] == pytest.approx(float(lr[2010]), rel=1e-12)
    assert "The learning rate at step 2010: lr 0.0001 (33% of its peak 0.0003)." in spike["evidence"]


def _megatron_excerpt(template: str, losses: list[float], first: int = 7000, every: int = 10) -> str:
    import re

    lines = []
    for k, loss in enumerate(losses):
        line = re.sub(r"iteration\s+\d+/", f"iteration {first + every * k:8d}/", template)
        lines.append(re.sub(r"lm loss: [0-9.E+-]+", f"lm loss: {loss:.6E}", line))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("extra_spike, spikes", [(None, []), (33, [7329])])
def test_a_diverging_megatron_excerpt_is_one_divergence_and_only_spikes_above_its_new_level(
    real_logs_dir, tmp_path, extra_spike, spikes
):
    """A Megatron log excerpt (every 10th iteration) whose loss goes from 6.4 to 11.4 and stays: the divergence is
    the one cause; a value at the new level is not a spike against the old one, a jump 1.8x above it still is."""
    template = (real_logs_dir / "bloom-176b-tr11-megatron.log").read_text().splitlines()[0]
    rng = np.random.default_rng(1)
    k = np.arange(40)
    level = np.where(k < 25, 6.4, np.minimum(11.4, 6.4 + 1.5 * (k - 24)))
    losses = level * (1 + 0.01 * rng.standard_normal(40))
    if extra_spike is not None:
        losses[extra_spike] *= 1.8
    (tmp_path / "train.log").write_text(_megatron_excerpt(template, losses.tolist()))
    findings = run_audit(open_case(None, overrides={"metrics": [str(tmp_path / "train.log")]})).findings
    (div,) = [f for f in findings["findings"] if f["kind"] == "divergence"]
    assert (div["step"], div["logged_step"], div["severity"]) == (7249, 7250, "critical")
    assert [s["peak_step"] for s in findings["spikes"] if s["metric"] == "lm loss"] == spikes
    assert findings["causes"][0]["kind"] == "divergence"
