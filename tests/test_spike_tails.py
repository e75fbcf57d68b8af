"""The spike rule's answers where noise is heavy-tailed and where a metric's history is a constant: a tail fit that
extrapolates past the run's largest clean score yields to the fixed rule, and a constant (a grad norm logged as 0.000
while it is not computed) is no baseline."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.datasets.heavy_tails import HeavyTailSpec, make_heavy_tail_run
from forensics.datasets.loss_model import GRAD_NORM, LOSS
from forensics.detect import detect_spikes
from forensics.detect.spikes import kernel_tail as KT
from forensics.detect.spikes.detector import SpikeDetector
from forensics.detect.spikes.kernel_state import BY_FIXED, BY_OBSERVED_MAX, BY_TAIL, empty_counts
from forensics.evaluation.scoring import score_run


def _params(has_support: int = 1) -> np.ndarray:
    det = SpikeDetector("loss")  # z 6, ratio 1.5, false_rate 0.05
    det.reset()
    params = det.params_.copy()
    params["has_support"] = has_support
    return params


# (z_tail, clean_max, score, jump ratio) -> (flagged, decided_by); base 1, the row not supported by the grad norm
DECIDE_TABLE = [
    (200.0, 20.0, 21.0, 1.6, True, BY_OBSERVED_MAX),  # exactly 1.05 x the clean maximum
    (200.0, 20.0, 20.99, 1.6, False, BY_TAIL),  # just under it
    (200.0, 20.0, 22.0, 1.5, True, BY_OBSERVED_MAX),  # exactly the fixed rule's 1.5x jump
    (200.0, 20.0, 22.0, 1.49, False, BY_TAIL),  # just under it
    (200.0, 4.0, 6.0, 1.6, True, BY_OBSERVED_MAX),  # a small clean maximum: the fixed score z = 6 still applies
    (200.0, 4.0, 5.99, 1.6, False, BY_TAIL),
    (15.0, 20.0, 16.0, 1.6, True, BY_TAIL),  # a fit within what the run has shown decides by itself
    (15.0, 20.0, 14.99, 1.6, False, BY_TAIL),
    (math.nan, -math.inf, 22.0, 1.6, True, BY_FIXED),  # no fit yet: the fixed rule
    (math.nan, -math.inf, 22.0, 1.49, False, BY_FIXED),
]


@pytest.mark.parametrize(("z_tail", "clean_max", "score", "ratio", "flagged", "decided_by"), DECIDE_TABLE)
def test_an_extrapolating_tail_yields_to_the_observed_maximum(z_tail, clean_max, score, ratio, flagged, decided_by):
    params, counts = _params(), empty_counts()
    counts["z_tail"], counts["clean_max"] = z_tail, clean_max
    r = ratio - 1.0
    z_thr = 6.0 if math.isnan(z_tail) else z_tail
    floor = KT.FALLBACK_RATIO if math.isnan(z_tail) else 1.0
    got = KT._decide(params[0], counts[0], r, r / score, 1.0, False, z_thr, floor)
    assert (bool(got[0]), int(got[1])) == (flagged, decided_by)


# judged rows (score, jump ratio, flagged) in order -> the clean maximum after them; z 6 and 1.5x make a fixed spike
NOTE_TABLE = [
    ([(3.0, 1.1, False)], 3.0),
    ([(8.0, 1.2, False)], 8.0),  # a high score on a small jump is ordinary noise: counted at once
    ([(3.0, 1.1, False), (8.0, 1.6, False)], 3.0),  # a fixed spike waits for the next row
    ([(3.0, 1.1, False), (8.0, 1.6, False), (2.0, 1.0, False)], 8.0),  # it came alone: counted
    ([(3.0, 1.1, False), (8.0, 1.6, False), (9.0, 1.7, False), (2.0, 1.0, False)], 3.0),  # two in a row: neither
    ([(3.0, 1.1, False), (8.0, 1.6, False), (9.0, 3.0, True), (2.0, 1.0, False)], 3.0),  # a flag next: not alone
    ([(5.99, 1.6, False)], 5.99),  # just under z: ordinary
]


@pytest.mark.parametrize(("rows", "clean_max"), NOTE_TABLE)
def test_the_clean_maximum_counts_a_fixed_spike_only_when_it_came_alone(rows, clean_max):
    params, counts = _params(), empty_counts()
    for score, ratio, flagged in rows:
        KT._note_clean(params[0], counts[0], score, ratio - 1.0, 1.0, flagged)
    assert float(counts["clean_max"][0]) == clean_max


def _trace(values: list[float]) -> list[str]:
    metrics = pd.DataFrame({"step": np.arange(len(values)), "m": values})
    return list(SpikeDetector("m", min_periods=5, false_rate=None).trace(metrics)["status"])


NOISE = [1.0, 1.02, 0.99, 1.01, 0.98, 1.03, 1.0, 0.97, 1.02, 1.01]
# (history, next values) -> statuses of the next values
RESTART_TABLE = [
    ([0.0] * 10, [0.3, 0.31, 0.29, 0.3, 0.32, 0.3], ["restarted"] + ["warmup"] * 4 + ["accepted"]),
    ([2.0] * 10, [2.5, 2.52, 2.49], ["restarted", "warmup", "warmup"]),  # any constant, not only 0
    ([0.0] * 10, [0.0], ["accepted"]),  # the constant goes on: nothing moved
    ([0.0], [0.3], ["warmup"]),  # one value is no history yet: still the warm-up
    (NOISE, [3.0], ["flagged"]),  # a history with spread judges the jump
]


@pytest.mark.parametrize(("history", "then", "statuses"), RESTART_TABLE)
def test_a_constant_history_starts_over_at_the_first_move(history, then, statuses):
    assert _trace(history + then)[len(history) :] == statuses


def test_heavy_tail_run_finds_its_events_with_no_other():
    """One run of the heavy-tailed family at the issue's settings (20K steps, t3 noise of 4% sd, 14 events)."""
    run = make_heavy_tail_run(HeavyTailSpec(name="heavy-tail", seed=7))
    found = detect_spikes(run.metrics, [LOSS, GRAD_NORM])
    sc = score_run(run.labels.spikes, run.labels.spans(), run.metrics["step"].to_numpy(), found, metric=LOSS)
    assert (sc.n_labels, sc.n_hits, sc.n_false) == (14, 14, 0)
    decided = Counter(f.details["tail"]["decided_by"] for f in found if f.kind == "spike" and f.metric == LOSS)
    assert decided == {"observed_max": 11, "fixed_rule": 4, "tail": 1}  # 16: the 14 and two noise steps of >= 1.5x


def _megatron_log(template: str, grad_norms: list[float], losses: list[float]) -> str:
    """Lines in the real log's format, one per iteration, from its first line."""
    out = []
    for i, (gn, loss) in enumerate(zip(grad_norms, losses, strict=True)):
        line = re.sub(r"iteration\s+\d+/", f"iteration {i + 1:8d}/", template)
        line = re.sub(r"lm loss: [0-9.E+-]+", f"lm loss: {loss:.6E}", line)
        out.append(re.sub(r"grad norm: [0-9.]+", f"grad norm: {gn:.3f}", line))
    return "\n".join(out) + "\n"


def test_grad_norm_logged_as_zero_then_real_is_no_spike(real_logs_dir, tmp_path, capsys):
    template = (real_logs_dir / "bloom-176b-tr11-megatron.log").read_text().splitlines()[0]
    rng = np.random.default_rng(3)
    n, n_zero = 140, 40
    i = np.arange(n)
    losses = 2.5 * (1 - 0.001 * i) * (1 + 0.01 * rng.standard_normal(n))
    losses[109] *= 2.0  # a real loss spike at iteration 110
    grad = np.where(i < n_zero, 0.0, (0.25 + 2.0 * np.exp(-(i - n_zero) / 3)) * np.exp(0.1 * rng.standard_normal(n)))
    log = tmp_path / "megatron.log"
    log.write_text(_megatron_log(template, grad.tolist(), losses.tolist()))
    out = tmp_path / "f.json"
    assert main(["audit", "--metrics", str(log), "--no-html", "--json", str(out)]) == 0
    capsys.readouterr()
    findings = json.loads(out.read_text())
    assert findings["run"]["grad_norm_key"] == "grad norm"
    # iteration 110 as Megatron prints it: the 110th update, canonical step 109
    assert [(s["metric"], s["peak_step"]) for s in findings["spikes"]] == [("lm loss", 109)]
    assert [c["kind"] for c in findings["causes"]] == ["event"]
