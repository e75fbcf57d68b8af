"""The metrics table carries its own meaning: null = not written, NaN/inf = logged as such, through every reader,
the merge, Parquet and back (no side channel beside the table)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from forensics.schema import METRIC_DTYPE, as_metrics, metric_values, write_metrics, written
from forensics.sources import read_metrics

#: step -> loss as logged; None = loss not written at that step (acc is written at every step but 1).
LOSS = {0: 1.0, 1: math.nan, 2: math.inf, 3: None, 4: -math.inf, 5: 0.5}
ACC = {0: 0.9, 1: None, 2: 0.8, 3: 0.7, 4: 0.6, 5: 0.5}


def _records() -> list[dict]:
    out = []
    for s in LOSS:
        rec = {"step": s}
        if LOSS[s] is not None:
            rec["loss"] = LOSS[s]
        if ACC[s] is not None:
            rec["acc"] = ACC[s]
        out.append(rec)
    return out


def _text(v: float) -> str:
    return "nan" if math.isnan(v) else ("inf" if v == math.inf else ("-inf" if v == -math.inf else repr(v)))


def _jsonl(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in _records()))  # json writes NaN / Infinity tokens
    return p


def _csv(tmp_path):
    p = tmp_path / "m.csv"
    rows = ["step,loss,acc"] + [
        f"{s},{'' if LOSS[s] is None else _text(LOSS[s])},{'' if ACC[s] is None else ACC[s]}" for s in LOSS
    ]
    p.write_text("\n".join(rows) + "\n")
    return p


def _text_log(tmp_path):
    p = tmp_path / "train.log"
    lines = []
    for s in LOSS:
        parts = [f"step {s}"]
        if LOSS[s] is not None:
            parts.append(f"loss {_text(LOSS[s])}")
        if ACC[s] is not None:
            parts.append(f"acc {ACC[s]}")
        lines.append(" | ".join(parts))
    p.write_text("\n".join(lines) + "\n")
    return p


def _json_document(tmp_path):
    p = tmp_path / "trainer_state.json"
    p.write_text(json.dumps({"log_history": _records()}))  # no global_step: not HF's, steps as logged
    return p


def _tensorboard(tmp_path):
    writer_mod = pytest.importorskip("torch.utils.tensorboard")
    folder = tmp_path / "tb"
    with writer_mod.SummaryWriter(folder) as w:
        for r in _records():
            for k in ("loss", "acc"):
                if k in r:
                    w.add_scalar(k, r[k], r["step"])
    return folder


def _wandb(tmp_path):
    pytest.importorskip("wandb")
    import wandb

    from forensics.datasets.wandb_writer import isolated_wandb_env

    with isolated_wandb_env(tmp_path):
        run = wandb.init(
            dir=str(tmp_path),
            mode="offline",
            project="roundtrip",
            settings=wandb.Settings(
                console="off", silent=True, x_disable_stats=True, x_disable_meta=True, disable_git=True
            ),
            reinit="create_new",
        )
        try:
            for r in _records():
                run.log({k: v for k, v in r.items() if k != "step"}, step=r["step"])
        finally:
            run.finish()
        wandb.teardown()
    return tmp_path / "wandb"


def _parquet(tmp_path):
    table, _ = read_metrics([_jsonl(tmp_path)])
    return write_metrics(table, tmp_path / "m.parquet")


WRITERS = {
    "jsonl": _jsonl,
    "csv": _csv,
    "text": _text_log,
    "json": _json_document,
    "tensorboard": _tensorboard,
    "wandb": _wandb,
    "parquet": _parquet,
}


def _check(table: pd.DataFrame, exact: bool = True) -> None:
    assert table["step"].tolist() == list(LOSS)
    assert table["loss"].dtype == METRIC_DTYPE
    assert written(table, "loss").tolist() == [LOSS[s] is not None for s in LOSS]
    assert written(table, "acc").tolist() == [ACC[s] is not None for s in ACC]
    loss = metric_values(table, "loss")
    for s, want in LOSS.items():
        if want is None or math.isnan(want):
            assert math.isnan(loss[s]), s
        elif exact:
            assert loss[s] == want, s
        else:
            assert loss[s] == pytest.approx(want, rel=1e-6), s


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_nan_inf_and_not_written_survive_every_reader_and_parquet(tmp_path, fmt):
    table, report = read_metrics([WRITERS[fmt](tmp_path)])
    exact = fmt != "tensorboard"  # SummaryWriter stores float32
    _check(table, exact)
    assert report.metrics["loss"] == {"values": 2, "nan": 1, "inf": 2, "missing": 1}
    back, _ = read_metrics([write_metrics(table, tmp_path / "back.parquet")])
    _check(back, exact)
    pd.testing.assert_frame_equal(back, table)


def test_merge_keeps_an_earlier_value_where_a_later_source_did_not_write(tmp_path):
    first = tmp_path / "a.jsonl"
    first.write_text('{"step": 0, "loss": 2.0}\n{"step": 1, "loss": 1.5}\n')
    second = tmp_path / "b.jsonl"
    second.write_text('{"step": 1, "acc": 0.1}\n{"step": 2, "loss": NaN}\n')
    table, _ = read_metrics([first, second])
    assert metric_values(table, "loss")[:2].tolist() == [2.0, 1.5] and written(table, "loss").tolist() == [True] * 3
    assert math.isnan(metric_values(table, "loss")[2])
    assert written(table, "acc").tolist() == [False, True, False]


def test_a_plain_float_nan_handed_over_is_a_logged_nan_and_pandas_na_is_not_written():
    df = pd.DataFrame(
        {"step": [2, 0, 1], "loss": [np.nan, 1.0, 2.0], "acc": pd.array([0.5, None, 0.7], dtype="Float64")}
    )
    out = as_metrics(df)
    assert out["step"].tolist() == [0, 1, 2]
    assert written(out, "loss").all() and math.isnan(metric_values(out, "loss")[2])
    assert written(out, "acc").tolist() == [False, True, True]
