"""Numerics read from the logs (forensics.detect.evidence.log_numerics): the keys recognised as loggers write them,
the window around a spike at its boundaries, and a Megatron-format fp16 log whose loss spike follows an overflow,
audited end to end: the cause carries ``numerics`` evidence and its summary says a numerics event."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.detect.evidence.log_numerics import LEAD_WINDOW, first_count, log_numerics, loss_scale_drop
from forensics.schema.keys import (
    find_loss_key,
    grad_norm_column,
    loss_scale_column,
    max_loss_column,
    nan_iterations_column,
    num_zeros_column,
    params_norm_column,
    skipped_iterations_column,
    update_norm_column,
    z_loss_column,
)

REPO = Path(__file__).resolve().parents[1]
MEGATRON_LOG = REPO / "fixtures" / "logs" / "megatron-fp16-overflow.log"
MEGATRON = [
    "lm loss",
    "loss scale",
    "grad norm",
    "num zeros",
    "params norm",
    "number of skipped iterations",
    "number of nan iterations",
    "learning rate",
]
TORCHTITAN = ["loss_metrics/global_avg_loss", "loss_metrics/global_max_loss", "grad_norm", "lr"]
OLMO_CORE = [
    "train/Z loss",
    "train/CE loss",
    "optim/total grad norm",
    "optim/LR (group 0)",
    "optim/step skipped",
    "optim/update norm",
]


@pytest.mark.parametrize(
    ("lookup", "names", "expected"),
    [
        (loss_scale_column, MEGATRON, "loss scale"),
        (loss_scale_column, ["loss", "optimizer/grad_scale"], "optimizer/grad_scale"),
        (loss_scale_column, TORCHTITAN, None),
        (skipped_iterations_column, MEGATRON, "number of skipped iterations"),
        (skipped_iterations_column, OLMO_CORE, "optim/step skipped"),
        (nan_iterations_column, MEGATRON, "number of nan iterations"),
        (nan_iterations_column, OLMO_CORE, None),
        (max_loss_column, TORCHTITAN, "loss_metrics/global_max_loss"),
        (max_loss_column, MEGATRON, None),
        (update_norm_column, OLMO_CORE, "optim/update norm"),
        (update_norm_column, MEGATRON, None),
        (params_norm_column, MEGATRON, "params norm"),
        (params_norm_column, ["param_norm", "grad_norm"], "param_norm"),
        (params_norm_column, ["parameter norm"], "parameter norm"),
        (params_norm_column, ["train/weight_norm"], "train/weight_norm"),
        (params_norm_column, ["param_update_norm", "param_grad_norm"], None),  # an update or a gradient's norm
        (params_norm_column, OLMO_CORE, None),
        (num_zeros_column, MEGATRON, "num zeros"),
        (num_zeros_column, ["num_zeros_in_grad", "grad_norm"], "num_zeros_in_grad"),
        (num_zeros_column, OLMO_CORE, None),
        (z_loss_column, OLMO_CORE, "train/Z loss"),
        (z_loss_column, ["z_loss", "loss"], "z_loss"),
        (z_loss_column, MEGATRON, None),
        (update_norm_column, ["param_update_norm", "params norm"], "param_update_norm"),
        # the loss and grad-norm lookups are not misled by them
        (find_loss_key, MEGATRON, "lm loss"),
        (find_loss_key, OLMO_CORE, "train/CE loss"),  # the z loss listed first is not the loss
        (find_loss_key, ["z_loss", "loss"], "loss"),
        (grad_norm_column, MEGATRON, "grad norm"),
        (grad_norm_column, ["num_zeros_in_grad", "param_norm", "grad_norm"], "grad_norm"),
        (find_loss_key, TORCHTITAN, "loss_metrics/global_avg_loss"),
        (grad_norm_column, OLMO_CORE, "optim/total grad norm"),
    ],
)
def test_numerics_keys_as_loggers_write_them(lookup, names: list[str], expected: str | None) -> None:
    assert lookup(names) == expected


def _metrics(rows: dict[str, dict[int, float]]) -> pd.DataFrame:
    steps = sorted({s for col in rows.values() for s in col})
    out = pd.DataFrame({"step": np.array(steps, np.int64)})
    for name, col in rows.items():
        out[name] = [col.get(s, np.nan) for s in steps]
    return out


START = 50


@pytest.mark.parametrize(
    ("drop_at", "found"),
    [
        (START - LEAD_WINDOW - 1, False),  # just before the window
        (START - LEAD_WINDOW, True),
        (START, True),
        (START + 1, False),  # after the spike's start, every step logged: not before it
    ],
)
def test_loss_scale_drop_in_the_window(drop_at: int, found: bool) -> None:
    scale = {s: (65536.0 if s < drop_at else 32768.0) for s in range(30, 70)}
    m = _metrics({"lm loss": {s: 3.0 for s in range(30, 70)}, "loss scale": scale})
    drop = loss_scale_drop(m, START)
    assert (drop is not None) is found
    if found:
        assert drop == {"step": drop_at, "before": 65536.0, "after": 32768.0}
    assert log_numerics(m, START, "lm loss")["numerics"] is found


def test_a_rising_loss_scale_is_no_drop() -> None:
    m = _metrics({"loss scale": {s: (32768.0 if s < START else 65536.0) for s in range(30, 70)}})
    assert loss_scale_drop(m, START) is None


@pytest.mark.parametrize(
    ("logged_every", "start", "nan_row", "found"),
    [
        (1, START, START, True),
        (1, START, START + 1, False),
        (1, START, START - LEAD_WINDOW, True),
        (1, START, START - LEAD_WINDOW - 1, False),
        # logged every 10 steps: the row at 60 counts 51-60, so it covers a spike starting at 51; the row at 70 does not
        (10, 51, 60, True),
        (10, 51, 70, False),
        (10, 51, 50, True),
        (10, 51, 40, False),  # 11 steps ahead of it: past the lead window
    ],
)
def test_nan_iterations_in_the_window(logged_every: int, start: int, nan_row: int, found: bool) -> None:
    counts = {s: (1.0 if s == nan_row else 0.0) for s in range(0, 100, logged_every)}
    m = _metrics({"number of nan iterations": counts})
    hit = first_count(m, "number of nan iterations", start)
    assert hit == ({"step": nan_row, "count": 1.0} if found else None)
    assert log_numerics(m, start)["numerics"] is found


def test_skipped_iterations_alone_are_reported_not_numerics() -> None:
    m = _metrics({"number of skipped iterations": {s: (1.0 if s == START else 0.0) for s in range(30, 70)}})
    found = log_numerics(m, START)
    assert found["skipped_iterations"] == {"step": START, "count": 1.0}
    assert found["numerics"] is False


def test_no_numerics_series_is_none() -> None:
    assert log_numerics(_metrics({"loss": {s: 3.0 for s in range(10)}}), 5, "loss") is None


def test_worst_rank_against_the_mean() -> None:
    m = _metrics(
        {
            "global_avg_loss": {s: 2.0 for s in range(10)},
            "global_max_loss": {s: (9.0 if s == 5 else 2.5) for s in range(10)},
        }
    )
    assert log_numerics(m, 5, "global_avg_loss")["max_over_avg"] == pytest.approx(4.5)


def test_megatron_overflow_log_puts_numerics_on_its_cause(tmp_path: Path) -> None:
    out = tmp_path / "findings.json"
    assert main(["audit", "--metrics", str(MEGATRON_LOG), "--json", str(out), "--no-html"]) == 0
    findings = json.loads(out.read_text(encoding="utf-8"))
    # iteration 62's spike (canonical 61) follows the loss scale's halving at iteration 61 (canonical 60)
    cause = next(c for c in findings["causes"] if 61 in c["steps"])
    numerics = cause["details"]["numerics"]
    assert numerics["numerics"] is True
    assert numerics["loss_scale_drop"] == {"step": 60, "before": 65536.0, "after": 32768.0}
    assert numerics["skipped_iterations"] == {"step": 60, "count": 1.0}
    assert numerics["nan_iterations"] is None
    assert cause["summary"].endswith("(a numerics event).")
    loss_spike = next(s for s in findings["spikes"] if s["metric"] == "lm loss" and s["step"] == 61)
    assert loss_spike["details"]["support"]["numerics"] is True
