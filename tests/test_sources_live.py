"""Live reading: files grow in rounds, each ending in a half-written line; read_new returns exactly what was added."""

from __future__ import annotations

import json

import numpy as np
import pytest

from forensics.sources.live import LiveMetrics
from forensics.sources.registry import open_reader

ROUNDS = 4
PER_ROUND = 7


def _value(s: int) -> float:
    return round(3.0 + np.sin(s / 3.0), 4)


FORMS = {
    "jsonl": ("m.jsonl", "", lambda s: json.dumps({"step": s, "train": {"loss": _value(s)}}) + "\n", "train/loss"),
    "csv": ("m.csv", "step,train/loss\n", lambda s: f"{s},{_value(s)}\n", "train/loss"),
    "text": (
        "train.log",
        "starting\n",
        lambda s: f"step:{s}/100 train_loss:{_value(s)} train_time:{s}ms\n",
        "train_loss",
    ),
    "megatron": ("megatron.log", "", lambda s: f" iteration {s:8d}/     100 | lm loss: {_value(s):.6E} |\n", "lm loss"),
}


@pytest.mark.parametrize("kind", list(FORMS))
def test_appended_rounds_are_read_exactly_once(tmp_path, kind):
    name, header, line, key = FORMS[kind]
    path = tmp_path / name
    path.write_text(header)
    reader = open_reader(path)
    assert len(reader.read_new()) == 0
    pending = ""
    step = 0
    seen: list[int] = []
    for _ in range(ROUNDS):
        lines = [line(s) for s in range(step, step + PER_ROUND)]
        nxt = line(step + PER_ROUND)
        half = nxt[: len(nxt) // 2]  # the writer is in the middle of the next line
        with open(path, "a") as fh:
            fh.write(pending + "".join(lines) + half)
        pending = nxt[len(half) :]
        new = reader.read_new()
        expected = list(range(step, step + PER_ROUND))
        assert new["step"].tolist() == expected
        assert new[key].tolist() == [_value(s) for s in expected]
        seen += new["step"].tolist()
        step += PER_ROUND
        assert len(reader.read_new()) == 0  # nothing new: nothing returned
    with open(path, "a") as fh:
        fh.write(pending)
    assert reader.read_new()["step"].tolist() == [step]
    assert seen + [step] == list(range(ROUNDS * PER_ROUND + 1))
    assert reader.report.malformed == 0
    assert reader.table["step"].tolist() == list(range(ROUNDS * PER_ROUND + 1))


def test_tensorboard_file_growing_with_truncated_records(tmp_path):
    SummaryWriter = pytest.importorskip("torch.utils.tensorboard").SummaryWriter
    src_dir = tmp_path / "src"
    with SummaryWriter(src_dir) as w:
        for s in range(40):
            w.add_scalar("loss", _value(s), s)
            w.add_scalar("lr", 1e-3, s)
    (src,) = list(src_dir.glob("events.out.tfevents.*"))
    data = src.read_bytes()
    live_dir = tmp_path / "live"
    live_dir.mkdir()
    dst = live_dir / src.name
    dst.write_bytes(b"")
    reader = open_reader(live_dir)
    cuts = [len(data) * k // 5 + 3 for k in range(1, 5)] + [len(data)]  # +3: inside a record header
    got: list[int] = []
    done = 0
    for cut in cuts:
        with open(dst, "ab") as fh:
            fh.write(data[done:cut])
        done = cut
        steps = reader.read_new()["step"].tolist()
        assert steps == sorted(set(steps))
        # Only a step whose events were split by the cut comes back, with the events added since.
        assert not got or steps[0] >= got[-1]
        got += [s for s in steps if not got or s != got[-1]]
    assert got == list(range(40))
    table = reader.table
    assert table["loss"].tolist() == pytest.approx([_value(s) for s in range(40)], rel=1e-6)
    assert table["lr"].notna().all()
    assert reader.report.malformed == 0 and reader.report.rewinds == []


def test_live_metrics_merges_sources_and_returns_new_rows(tmp_path):
    log = tmp_path / "train.log"
    jl = tmp_path / "eval.jsonl"
    log.write_text("".join(f"step {s} | loss {1.0 + s}\n" for s in range(5)))
    jl.write_text("".join(json.dumps({"step": s, "eval/loss": 0.5 * s}) + "\n" for s in (0, 4)))
    live = LiveMetrics([log, jl], step_offset=1)
    table, new = live.poll()
    assert table["step"].tolist() == [-1, 0, 1, 2, 3]
    assert new["step"].tolist() == [-1, 0, 1, 2, 3]
    assert table["eval/loss"].iloc[4] == 2.0
    table, new = live.poll()
    assert len(new) == 0 and len(table) == 5
    with open(log, "a") as fh:
        fh.write("step 5 | loss 6.0\nstep 6 | loss 7")
    with open(jl, "a") as fh:
        fh.write(json.dumps({"step": 4, "eval/acc": 0.9}) + "\n")
    table, new = live.poll()
    assert new["step"].tolist() == [3, 4]
    assert new["loss"].tolist() == [5.0, 6.0]
    assert new["eval/loss"].iloc[0] == 2.0 and new["eval/acc"].iloc[0] == 0.9
    assert live.report.rows == 6 and live.report.step_range == (-1, 4)
