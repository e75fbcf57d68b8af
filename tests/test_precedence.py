"""Precedence: grad norm before, with or after the loss; lr changes; throughput anomalies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.detect.evidence.precedence import precedence
from forensics.detect.findings import Finding
from forensics.schema import find_column

SPIKE = 200


def _run(
    grad_event: dict[int, float] | None = None,
    lr: np.ndarray | None = None,
    tps_event: dict[int, float] | None = None,
    n: int = 300,
) -> pd.DataFrame:
    """A flat run with a loss spike at SPIKE; ``grad_event`` / ``tps_event`` set values at given steps."""
    rng = np.random.default_rng(0)
    s = np.arange(n)
    loss = 0.9 + rng.normal(0, 0.02, n)
    loss[SPIKE] = 4.0
    grad = 1.0 * rng.lognormal(0, 0.05, n)
    for step, v in (grad_event or {}).items():
        grad[step] = v
    tps = 30_000 * rng.lognormal(0, 0.02, n)
    for step, v in (tps_event or {}).items():
        tps[step] = v
    return pd.DataFrame(
        {
            "step": s,
            "train/loss": loss,
            "grad_norm": grad,
            "lr": lr if lr is not None else np.full(n, 3e-4),
            "tokens_per_s": tps,
        }
    )


SPIKE_FINDING = Finding(kind="spike", step=SPIKE, end_step=SPIKE, peak_step=SPIKE, metric="train/loss")


def test_grad_norm_climbing_over_five_steps_before_the_loss_leads():
    # like BLOOM: 1.5x, 3x, 6x, 12x, 24x over the 5 steps up to the loss spike
    climb = {SPIKE - 4: 1.5, SPIKE - 3: 3.0, SPIKE - 2: 6.0, SPIKE - 1: 12.0, SPIKE: 24.0, SPIKE + 1: 8.0}
    (p,) = precedence([SPIKE_FINDING], _run(climb))
    assert p["grad_norm"] == "leads"
    # the factor is the spike detector's ratio (1.5x), so the first 1.5x step already counts
    assert p["lead_steps"] == 4 and p["grad_norm_first_step"] == SPIKE - 4
    assert p["grad_norm_peak"] == 24.0 and p["grad_norm_peak_ratio"] == pytest.approx(24.0, rel=0.1)
    assert "optimizer-led" in p["evidence"][0]


def test_data_led_spike_moves_grad_norm_at_the_same_step():
    (p,) = precedence([SPIKE_FINDING], _run({SPIKE: 8.0}))
    assert (p["grad_norm"], p["lead_steps"], p["grad_norm_first_step"]) == ("with", 0, SPIKE)
    assert "data-led" in p["evidence"][0]


def test_grad_norm_after_the_loss_lags_and_flat_grad_norm_is_none():
    (lag,) = precedence([SPIKE_FINDING], _run({SPIKE + 2: 5.0, SPIKE + 3: 4.0}))
    assert (lag["grad_norm"], lag["lead_steps"]) == ("lags", -2)
    (flat,) = precedence([SPIKE_FINDING], _run())
    assert flat["grad_norm"] == "none" and flat["lead_steps"] is None
    assert flat["grad_norm_peak_ratio"] < 1.3


def test_an_unrelated_earlier_burst_does_not_count_as_leading():
    # elevated 8 steps before, back to normal, then up with the loss: the run that reaches the spike wins
    (p,) = precedence([SPIKE_FINDING], _run({SPIKE - 8: 5.0, SPIKE: 6.0}))
    assert (p["grad_norm"], p["lead_steps"]) == ("with", 0)


def test_lr_warmup_end_restart_and_steady():
    s = np.arange(300)
    warm = np.minimum((s + 1) / 195, 1.0) * 3e-4  # warm-up ends at step 194, 6 steps before the spike
    (p,) = precedence([SPIKE_FINDING], _run(lr=warm))
    assert p["lr"] == pytest.approx(3e-4)
    assert p["lr_change"]["kind"] == "warmup_end" and p["lr_change"]["step"] == 194
    restart = np.where(s < SPIKE - 3, 1e-4, 3e-4)
    (p,) = precedence([SPIKE_FINDING], _run(lr=restart))
    assert p["lr_change"]["kind"] == "restart" and p["lr_change"]["step"] == SPIKE - 3
    rising = (s + 1) / 1000 * 3e-4  # still warming up
    (p,) = precedence([SPIKE_FINDING], _run(lr=rising))
    assert p["lr_change"]["kind"] == "increase" and p["lr_change"]["relative"] > 0.05
    (p,) = precedence([SPIKE_FINDING], _run())
    assert p["lr_change"] == {"kind": "none", "step": None, "relative": 0.0}


def test_throughput_drop_at_the_spike_is_an_anomaly():
    (p,) = precedence([SPIKE_FINDING], _run(tps_event={SPIKE: 12_000.0}))
    assert p["tokens_per_s"]["anomaly"] is True
    assert p["tokens_per_s"]["ratio"] == pytest.approx(0.4, abs=0.02)
    (q,) = precedence([SPIKE_FINDING], _run())
    assert q["tokens_per_s"]["anomaly"] is False


def test_missing_metrics_give_none_and_say_so():
    metrics = _run()[["step", "train/loss"]]
    (p,) = precedence([{"step": SPIKE}], metrics)
    assert p["grad_norm"] == "none" and p["lr"] is None and p["tokens_per_s"] is None
    assert "No grad norm logged" in p["evidence"][0]
    json.dumps(p, allow_nan=False)


def test_column_names_are_found_by_their_usual_spellings():
    assert find_column(["step", "Grad Norm", "lr"], ("grad_norm",)) == "Grad Norm"
    assert find_column(["optimizer/grad_norm_total"], ("grad_norm",), ("gradnorm",)) == "optimizer/grad_norm_total"
    assert find_column(["loss"], ("grad_norm",), ("gradnorm",)) is None


def test_static_demo_spikes_are_data_led(demo_small: Path):
    folder = demo_small / "static"
    metrics = pd.read_parquet(folder / "metrics.parquet")
    labels = json.loads((folder / "labels.json").read_text())
    result = precedence(labels["spikes"], metrics)
    assert [p["grad_norm"] for p in result] == ["with"] * len(labels["spikes"])
    assert all(p["lr_change"]["kind"] == "none" and not p["tokens_per_s"]["anomaly"] for p in result)


def test_bloom_grad_norm_leads_its_first_loss_spike(real_logs_dir: Path):
    import forensics.sources as sources

    log = real_logs_dir / "bloom-176b-tr11-megatron.log"
    metrics, _ = sources.read_metrics([log])
    (p,) = precedence([Finding(kind="spike", step=31218, metric="lm loss")], metrics)  # printed 31219
    assert p["columns"]["grad_norm"] == "grad norm"
    assert p["grad_norm"] == "leads"
    assert p["grad_norm_first_step"] == 31214 and p["lead_steps"] == 4  # 0.947 is 5x the 0.174 before the window
    assert p["grad_norm_peak"] == pytest.approx(960.351)
    assert p["lr"] == pytest.approx(5.279e-05, rel=1e-3) and p["lr_change"]["kind"] == "none"
