"""Plain-text log reader: each common line form as training code prints it, the real public logs, and --pattern."""

from __future__ import annotations

import logging
import math

import pytest

from forensics.errors import ForensicsError
from forensics.sources import read_metrics
from forensics.sources.registry import open_reader
from forensics.sources.text_log import LineParser, parse_value

LOSS = [4.21, 3.9, 3.75, math.nan, 3.5]


def _megatron_line(it: int, total: int, loss: float, gnorm: float) -> str:
    # Megatron-LM training_log(): each field formatted this way, joined by " |".
    s = f" iteration {it:8d}/{total:8d} |"
    s += f" consumed samples: {it * 2048:12d} |"
    s += f" elapsed time per iteration (ms): {1234.5:.1f} |"
    s += f" learning rate: {3e-4:.3E} |"
    s += f" global batch size: {2048:5d} |"
    s += f" lm loss: {loss:.6E} |"
    s += f" loss scale: {4096.0:.1f} |"
    s += f" grad norm: {gnorm:.3f} |"
    s += f" number of skipped iterations: {0:3d} |"
    return s


@pytest.mark.parametrize(
    "form",
    [
        lambda s, v: f"step {s} | loss {v:.4f} | lr 3.0e-04 | tok/s 28123",
        lambda s, v: f"2024-05-01 12:00:{s:02d} INFO train: step={s} loss={v:.4f} lr=3e-4",
        lambda s, v: f"[rank0] step: {s}, loss: {v:.4f}, lr: 0.0003",
        lambda s, v: f"step:{s}/5 loss:{v:.4f} train_time:{1000 * s}ms step_avg:nanms",
        lambda s, v: f"iter {s} loss {v:.4f} lr 0.0003",
    ],
    ids=["pipes", "key=value", "key: value", "step:N/M", "spaced"],
)
def test_default_forms_read_step_and_values(tmp_path, form):
    path = tmp_path / "train.log"
    lines = ["Starting training...", "WARNING: something unrelated at 12:00"]
    lines += [form(s, v) for s, v in enumerate(LOSS)]
    lines += ["saving checkpoint at step 5", "done"]
    path.write_text("\n".join(lines) + "\n")
    df, report = read_metrics([path])
    assert df["step"].tolist() == [0, 1, 2, 3, 4]
    loss = df["loss"].tolist()
    assert loss[:3] == [4.21, 3.9, 3.75] and math.isnan(loss[3]) and loss[4] == 3.5
    assert report.malformed == 0
    assert report.metrics["loss"]["nan"] == 1


def test_megatron_lines_with_keys_that_contain_spaces(tmp_path):
    path = tmp_path / "megatron.log"
    losses = [2.2, 2.25, 5.098124, 3.4]
    norms = [0.24, 2.39, 960.351, 353.2]
    body = [_megatron_line(31216 + i, 115311, x, g) for i, (x, g) in enumerate(zip(losses, norms))]
    path.write_text("\n".join(["> building GPT model ...", *body, "[after training is done]"]) + "\n")
    df, report = read_metrics([path])
    assert df["step"].tolist() == [31215, 31216, 31217, 31218]  # Megatron prints N after update N
    assert df["lm loss"].tolist() == losses
    assert df["grad norm"].tolist() == norms
    assert df["consumed samples"].tolist() == [float(i * 2048) for i in range(31216, 31220)]
    assert df["elapsed time per iteration (ms)"].tolist() == [1234.5] * 4
    assert report.malformed == 0


def test_python_logging_output_with_key_value_pairs(tmp_path):
    path = tmp_path / "run.log"
    logger = logging.getLogger("forensics-test-train")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        logger.info("loaded 120000 samples")
        for s in range(10):
            logger.info("global_step=%d train/loss=%.5f grad_norm=%.3f", s, 1.0 / (s + 1), 0.1 * s)
    finally:
        logger.removeHandler(handler)
        handler.close()
    df = open_reader(path).read_all()
    assert df["step"].tolist() == list(range(10))
    assert df["train/loss"].tolist() == [round(1.0 / (s + 1), 5) for s in range(10)]
    assert df["grad_norm"].tolist() == [round(0.1 * s, 3) for s in range(10)]


def test_lines_that_look_like_metrics_but_do_not_parse_are_counted(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(
        "step 1 | loss 2.5\n"
        "step 2 | loss 2.4.1\n"  # a value that tries to be a number
        "step x3 | loss 2.3\n"  # a step that is not a number
        "Saving checkpoint at step 3\n"  # prose: skipped silently
        "step 4 | loss 2.2\n"
    )
    df, report = read_metrics([path])
    assert df["step"].tolist() == [1, 4] and df["loss"].tolist() == [2.5, 2.2]
    assert report.malformed == 2
    assert [w for w, _ in report.sources[0].malformed_examples] == [2, 3]
    with pytest.raises(ForensicsError, match="line 2"):
        read_metrics([path], strict=True)


def test_resumed_text_log_replaces_rows_and_reports_rewind(tmp_path):
    path = tmp_path / "train.log"
    first = [f"step {s} | loss {10 + s}" for s in range(8)]
    resumed = ["resuming from checkpoint step 5"] + [f"step {s} | loss {100 + s}" for s in range(5, 10)]
    path.write_text("\n".join(first + resumed) + "\n")
    df, report = read_metrics([path])
    assert df["loss"].tolist() == [10.0 + s for s in range(5)] + [100.0 + s for s in range(5, 10)]
    (rw,) = report.rewinds
    assert (rw.from_step, rw.rows_replaced) == (5, 3)


def test_pattern_with_named_groups(tmp_path):
    path = tmp_path / "custom.log"
    path.write_text("".join(f"[{s:05d}] L={0.5 * s:.2f} acc {s}%\n" for s in range(6)) + "[00006] L=oops acc 1%\n")
    pattern = r"\[(?P<step>\d+)\] L=(?P<train__loss>\S+) acc (?P<acc>\d+)%"
    df, report = read_metrics([path], pattern=pattern)
    assert df["step"].tolist() == list(range(6))
    assert df["train/loss"].tolist() == [0.5 * s for s in range(6)]
    assert df["acc"].tolist() == [float(s) for s in range(6)]
    assert report.malformed == 1
    with pytest.raises(ForensicsError, match="named group 'step'"):
        read_metrics([path], pattern=r"L=(?P<loss>\S+)")
    with pytest.raises(ForensicsError, match="not a valid regular expression"):
        read_metrics([path], pattern=r"(?P<step>\d+")


def test_value_parsing_keeps_nonfinite_and_drops_units():
    assert parse_value("81991ms") == 81991.0
    assert parse_value("5.098124E+00") == 5.098124
    assert math.isnan(parse_value("nanms"))
    assert parse_value("-inf") == -math.inf
    assert parse_value("12%") == 12.0
    assert parse_value("warmup") is None
    assert LineParser().parse("Epoch 3 finished") is None


def test_modded_nanogpt_log_parses_every_step(real_logs_dir):
    df, report = read_metrics([real_logs_dir / "modded-nanogpt-1b-adamw.log"])
    assert int(df["train_loss"].notna().sum()) == 20_344
    assert df["step"].iloc[0] == 0 and df["step"].iloc[-1] == 20_344 and len(df) == 20_345
    assert int(df["val_loss"].notna().sum()) == 164
    loss = df.set_index("step")["train_loss"]
    assert loss[1] == 22.6211 and loss[5964] == 5.7021 and loss[20344] == 2.8204
    assert df.set_index("step")["val_loss"][20344] == 2.7737
    assert report.malformed == 0 and report.rewinds == []
    assert report.metrics["step_avg"]["nan"] == 13  # "step_avg:nanms" in the first steps is a logged NaN


def test_bloom_megatron_log_parses_every_iteration(real_logs_dir):
    df, report = read_metrics([real_logs_dir / "bloom-176b-tr11-megatron.log"])
    assert df["step"].tolist() == [12694, *range(31213, 31222), 31249, 31250, 44999]
    by_step = df.set_index("step")
    assert by_step["lm loss"][31218] == 5.098124  # printed as iteration 31219
    assert by_step["lm loss"][31213] == 2.198845
    assert by_step["grad norm"].loc[31213:31218].tolist() == [0.242, 0.947, 2.390, 15.886, 145.119, 960.351]
    assert by_step["lm loss value"][44999] == 2.327091  # the validation line at iteration 45000
    assert int(df["lm loss"].notna().sum()) == 13
    assert report.malformed == 0


def test_step_key_names_another_step_word(tmp_path):
    path = tmp_path / "train.log"
    path.write_text("".join(f"epoch 1 it {s} loss {s * 0.5}\n" for s in range(4)))
    df, _ = read_metrics([path], step_key="it")
    assert df["step"].tolist() == [0, 1, 2, 3] and df["loss"].tolist() == [0.0, 0.5, 1.0, 1.5]
    assert df["epoch"].tolist() == [1.0] * 4


def test_nanogpt_iter_and_eval_lines(tmp_path):
    """nanoGPT's train.py prints ``iter N: loss X, time Yms, mfu Z%`` and ``step N: train loss X, val loss Y``."""
    log = tmp_path / "nanogpt.log"
    lines = ["step 0: train loss 10.9876, val loss 10.9901"]
    lines += [
        f"iter {i}: loss {10 - i / 10:.4f}, time {120 + i:.2f}ms, mfu {30 + i / 100:.2f}%" for i in range(0, 50, 10)
    ]
    lines += ["step 50: train loss 5.5000, val loss 5.6000", "saving checkpoint to out"]
    log.write_text("\n".join(lines) + "\n")
    table, report = read_metrics([log])
    assert table["step"].tolist() == [0, 10, 20, 30, 40, 50]
    assert table["loss"].tolist()[:5] == [10.0, 9.0, 8.0, 7.0, 6.0]
    assert table.loc[table["step"] == 50, "val loss"].item() == 5.6
    assert table.loc[table["step"] == 0, "train loss"].item() == 10.9876
    assert table["time"].tolist()[1] == 130.0 and report.malformed == 0


def test_clock_and_date_fields_do_not_spoil_the_line(tmp_path):
    log = tmp_path / "eta.log"
    log.write_text(
        "step 1 | loss: 2.0 | eta 0:01:02\nstep 2 | loss: 1.9 | eta 0:00:58 | date 2024-05-01\nstep 3 | loss: 2.4.1\n"
    )
    table, report = read_metrics([log])
    assert table["step"].tolist() == [1, 2]
    assert table["loss"].tolist() == [2.0, 1.9]
    assert report.malformed == 1  # '2.4.1' looks like a number and is not one: counted
