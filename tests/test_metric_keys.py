"""The one metric-key lookup (forensics.schema.keys) over the names real loggers write.

Table-driven: each row is the metric names one logger (or an export of it) writes and the key the lookup must take,
or the names that tie (a true ambiguity, warned about). Then the losslint cases (a non-finite step is a skipped
record with a reason; upper-case headers audit end to end) and a real PyTorch Lightning run's CSVLogger and
TensorBoardLogger output audited by the CLI without ``--loss-key``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forensics.cli import main
from forensics.errors import ForensicsError
from forensics.schema import find_column, find_loss_key, grad_norm_column, lr_column, tokens_per_s_column
from forensics.schema.keys import choose_key, is_training_quantity, key_line, tokens
from forensics.sources import read_metrics

REPO = Path(__file__).resolve().parents[1]

# (what writes it, the metric names, the loss key the lookup must choose)
LOSS_CASES = [
    ("losslint upper-case CSV", ["GLOBAL_STEP", "TRAIN_LOSS", "VAL_LOSS"], "TRAIN_LOSS"),
    ("Lightning on_step+on_epoch", ["epoch", "train_loss_epoch", "train_loss_step", "val_loss"], "train_loss_step"),
    ("Lightning self.log('train/loss')", ["epoch", "train/loss", "val/loss"], "train/loss"),
    ("TensorBoard under a run prefix", ["tb/train/loss", "tb/val/loss", "tb/lr"], "tb/train/loss"),
    ("TensorBoard Loss/<split>", ["Loss/val", "Loss/train"], "Loss/train"),
    ("Megatron text log", ["lm loss", "loss scale", "grad norm", "learning rate", "samples per second"], "lm loss"),
    (
        "Megatron TensorBoard",
        ["lm loss vs samples", "lm loss", "loss-scale", "lm loss validation", "lm loss validation ppl"],
        "lm loss",
    ),
    (
        "Megatron W&B sections",
        ["lm-loss-validation/lm loss", "lm-loss-training/lm loss", "lm-loss-training/lm loss vs samples"],
        "lm-loss-training/lm loss",
    ),
    ("NeMo", ["reduced_train_loss", "val_loss", "lr", "global_step"], "reduced_train_loss"),
    (
        "HF Trainer on W&B",
        ["train/epoch", "train/grad_norm", "train/learning_rate", "train/loss", "eval/loss"],
        "train/loss",
    ),
    ("HF trainer_state.json", ["loss", "grad_norm", "learning_rate", "epoch", "eval_loss"], "loss"),
    ("Keras", ["Loss", "val_Loss", "accuracy"], "Loss"),
    ("Keras TensorBoard", ["train/epoch_loss", "validation/epoch_loss"], "train/epoch_loss"),
    ("upper-case CSV export", ["STEP", "TEST_LOSS", "TRAIN_LOSS"], "TRAIN_LOSS"),
    (
        "W&B chart export",
        ["my-run - train/loss__MIN", "my-run - train/loss", "my-run - train/loss__MAX"],
        "my-run - train/loss",
    ),
    ("W&B export, run named test-...", ["test-run - train/loss", "test-run - eval/loss"], "test-run - train/loss"),
    ("modded-nanogpt", ["val_loss", "train_loss", "train_time", "step_avg"], "train_loss"),
    ("camelCase", ["valLoss", "trainLoss"], "trainLoss"),
    ("fp16 loss scale is not a loss", ["loss_scale", "lm_loss"], "lm_loss"),
    ("one word", ["trainloss", "accuracy"], "trainloss"),
]


@pytest.mark.parametrize(("producer", "names", "expected"), LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_loss_key_is_found_as_loggers_write_it(producer: str, names: list[str], expected: str) -> None:
    choice = choose_key(names, "loss")
    assert choice.key == expected, choice.reason
    assert choice.warning is None
    assert choice.candidates[0] == expected
    assert find_loss_key(names) == expected


GRAD_CASES = [
    (["step", "grad_norm", "loss"], "grad_norm"),
    (["train/loss", "train/grad_norm"], "train/grad_norm"),
    (["grad-norm vs samples", "grad-norm", "params-norm"], "grad-norm"),
    (["total_grad_norm", "loss"], "total_grad_norm"),
    (["gradient_norm"], "gradient_norm"),
    (["lm loss", "grad norm", "params norm"], "grad norm"),
    (["Grad Norm"], "Grad Norm"),
    # Lightning's grad_norm utility: one series per parameter, and the total
    (["grad_2.0_norm/net.0.weight", "grad_2.0_norm/net.0.bias", "grad_2.0_norm_total"], "grad_2.0_norm_total"),
    (["optimizer/grad_norm_total"], "optimizer/grad_norm_total"),
    (["max_grad_norm", "grad_norm"], "grad_norm"),
]


@pytest.mark.parametrize(("names", "expected"), GRAD_CASES)
def test_grad_norm_key_is_found_as_loggers_write_it(names: list[str], expected: str) -> None:
    choice = choose_key(names, "grad_norm")
    assert (choice.key, choice.warning) == (expected, None), choice.reason
    assert grad_norm_column(names) == expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["lr", "loss"], "lr"),
        (["train/learning_rate", "train/loss"], "train/learning_rate"),
        (["learning rate", "lm loss"], "learning rate"),
        (["learning-rate vs samples", "learning-rate"], "learning-rate"),
        (["lr-AdamW", "train_loss_step"], "lr-AdamW"),
        (["learningRate"], "learningRate"),
        (["grad_norm", "loss"], None),
    ],
)
def test_lr_key(names: list[str], expected: str | None) -> None:
    assert lr_column(names) == expected


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["tokens_per_s", "loss"], "tokens_per_s"),
        (["tokens per second"], "tokens per second"),
        (["perf/tok/s"], "perf/tok/s"),
        (["throughput"], "throughput"),
        (["samples per second", "tokens_per_second"], "tokens_per_second"),  # tokens before samples
        (["samples per second", "lm loss"], "samples per second"),
        (["train_time", "step_avg"], None),
    ],
)
def test_throughput_key(names: list[str], expected: str | None) -> None:
    assert tokens_per_s_column(names) == expected


@pytest.mark.parametrize(
    ("names", "role", "tied", "flag"),
    [
        (["runA - train/loss", "runB - train/loss"], "loss", ["runA - train/loss", "runB - train/loss"], "--loss-key"),
        (["loss", "train/loss"], "loss", ["loss", "train/loss"], "--loss-key"),  # two merged sources
        (["train_loss", "TRAIN_LOSS"], "loss", ["train_loss", "TRAIN_LOSS"], "--loss-key"),
        (["total_grad_norm", "gradient_norm"], "grad_norm", ["total_grad_norm", "gradient_norm"], "--spike-metric"),
    ],
)
def test_equally_good_names_warn_naming_both_and_the_flag(
    names: list[str], role: str, tied: list[str], flag: str
) -> None:
    choice = choose_key(names, role)
    assert choice.key == tied[0]  # the first in column order, deterministically
    assert list(choice.tied) == tied
    assert choice.warning is not None
    assert all(f"'{t}'" in choice.warning for t in tied) and flag in choice.warning


def test_dense_series_beats_a_sparse_one_of_the_same_name_quality() -> None:
    # HF: the per-step "loss" and, once at the end of training, "train_loss" (its mean over the run)
    names = ["loss", "grad_norm", "train_loss", "train_runtime"]
    assert choose_key(names, "loss").tied == ("loss", "train_loss")  # names alone cannot tell them apart
    choice = choose_key(names, "loss", counts={"loss": 120, "train_loss": 1, "grad_norm": 120})
    assert (choice.key, choice.warning) == ("loss", None)
    assert "'train_loss' (sparse: 1 value against 120" in choice.reason
    w = choose_key(["train/train_loss", "train/loss"], "loss", counts={"train/loss": 50, "train/train_loss": 1})
    assert (w.key, w.warning) == ("train/loss", None)


def test_only_an_eval_loss_is_taken_with_a_warning() -> None:
    choice = choose_key(["val_loss", "lr"], "loss")
    assert choice.key == "val_loss"
    assert choice.warning is not None and "val/eval/test" in choice.warning and "--loss-key" in choice.warning


def test_given_key_wins_and_must_exist() -> None:
    names = ["GLOBAL_STEP", "TRAIN_LOSS", "VAL_LOSS"]
    choice = choose_key(names, "loss", given="VAL_LOSS")
    assert (choice.key, choice.given, choice.warning) == ("VAL_LOSS", True, None)
    assert find_loss_key(names, "VAL_LOSS") == "VAL_LOSS"
    with pytest.raises(
        ForensicsError,
        match=r"loss key 'train_loss' is not among the metrics \(did you mean "
        r"'TRAIN_LOSS'\?\); the metrics are GLOBAL_STEP, TRAIN_LOSS, VAL_LOSS",
    ):
        find_loss_key(names, "train_loss")
    with pytest.raises(
        ForensicsError,
        match=r"'lm_loss' is not among the metrics \(did you mean 'TRAIN_LOSS', "
        r"'VAL_LOSS'\?\)",
    ):
        find_loss_key(names, "lm_loss")


@pytest.mark.parametrize("names", [["accuracy", "lr"], ["loss_scale", "lr"], []])
def test_no_loss_is_one_clear_error(names: list[str]) -> None:
    with pytest.raises(ForensicsError, match="no loss column found.*--loss-key"):
        find_loss_key(names)
    assert choose_key(names, "loss").key is None


def test_tokens_split_separators_humps_and_run_prefixes() -> None:
    assert tokens("lm-loss-training/lm loss") == ("lm", "loss", "training", "lm", "loss")
    assert tokens("my run - train/loss__MIN") == ("train", "loss", "min")
    assert tokens("grad_2.0_norm/net.0.weight") == ("grad", "norm", "net", "weight")
    assert tokens("TRAIN_LOSS") == ("train", "loss")
    assert tokens("valLoss") == ("val", "loss")


def test_find_column_keeps_its_contract() -> None:
    assert find_column(["step", "Grad Norm", "lr"], ("grad_norm",)) == "Grad Norm"
    assert find_column(["optimizer/grad_norm_total"], ("grad_norm",), ("gradnorm",)) == "optimizer/grad_norm_total"
    assert find_column(["totalgradnorm"], ("grad_norm",), ("gradnorm",)) == "totalgradnorm"
    assert find_column(["loss"], ("grad_norm",), ("gradnorm",)) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("train_loss_step", True),  # the loss key
        ("gn", True),  # the grad-norm key, whatever its name
        ("aux_loss", True),
        ("grad_2.0_norm/net.0.weight", True),
        ("params-norm", True),
        ("train_loss_epoch", True),
        ("val_loss", False),
        ("eval/loss", False),
        ("TEST_LOSS", False),
        ("lm loss validation", False),
        ("loss-scale", False),
        ("lr-SGD", False),
        ("tokens_per_s", False),
        ("train_time", False),
        ("epoch", False),
    ],
)
def test_training_quantities_per_design(name: str, expected: bool) -> None:
    assert is_training_quantity(name, "train_loss_step", "gn") is expected


# --- the losslint cases: non-finite steps, upper-case headers ------------------------------------------------------
UPPER_CSV = "GLOBAL_STEP,TRAIN_LOSS,VAL_LOSS\n0,2.5,\n1,2.4,\ninf,2.3,\n3,2.2,2.25\nnan,2.1,\n5,2.0,\n"
INF_JSONL = (
    '{"step": 0, "loss": 2.5}\n{"step": Infinity, "loss": 2.4}\n{"step": "inf", "loss": 2.3}\n'
    '{"step": NaN, "loss": 2.2}\n{"step": 4, "loss": 2.1}\n'
)


@pytest.mark.parametrize(
    ("name", "text", "kept", "bad_lines", "step_key"),
    [
        ("steps.csv", UPPER_CSV, [0, 1, 3, 5], [4, 6], "GLOBAL_STEP"),
        ("steps.jsonl", INF_JSONL, [0, 4], [2, 3, 4], "step"),
    ],
    ids=["csv", "jsonl"],
)
def test_nonfinite_step_is_a_skipped_record_with_a_reason(
    tmp_path: Path, name: str, text: str, kept: list[int], bad_lines: list[int], step_key: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    metrics, report = read_metrics([path])
    assert metrics["step"].tolist() == kept
    assert report.malformed == len(bad_lines)
    line = next(w for w in report.warnings if "malformed" in w)
    for n in bad_lines:
        assert f"{n}: {step_key} is missing or not a whole number" in line


def test_upper_case_headers_audit_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.csv"
    path.write_text(UPPER_CSV)
    out = tmp_path / "findings.json"
    assert main(["audit", "--metrics", str(path), "--json", str(out), "--no-html"]) == 0
    run = json.loads(out.read_text())["run"]
    assert (run["loss_key"], run["grad_norm_key"]) == ("TRAIN_LOSS", None)
    assert run["key_choice"]["loss"]["candidates"] == ["TRAIN_LOSS", "VAL_LOSS"]
    assert "VAL_LOSS" in run["key_choice"]["loss"]["reason"]
    assert "keys  loss = TRAIN_LOSS: names the loss" in capsys.readouterr().out


def test_ambiguity_reaches_the_audit_warnings(tmp_path: Path) -> None:
    path = tmp_path / "export.csv"
    path.write_text(
        "Step,runA - train/loss,runB - train/loss\n"
        + "".join(f"{i},{2 - i / 100},{2.1 - i / 100}\n" for i in range(20))
    )
    out = tmp_path / "findings.json"
    assert main(["audit", "--metrics", str(path), "--json", str(out), "--no-html"]) == 0
    findings = json.loads(out.read_text())
    assert findings["run"]["loss_key"] == "runA - train/loss"
    assert findings["run"]["key_choice"]["loss"]["tied"] == ["runA - train/loss", "runB - train/loss"]
    assert any("equally good" in w and "--loss-key" in w for w in findings["warnings"])
    assert (
        main(["audit", "--metrics", str(path), "--json", str(out), "--no-html", "--loss-key", "runB - train/loss"]) == 0
    )
    run = json.loads(out.read_text())["run"]
    assert (run["loss_key"], run["key_choice"]["loss"]["given"]) == ("runB - train/loss", True)


def test_run_toml_loss_key_wins_and_must_exist(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text(UPPER_CSV)
    (tmp_path / "run.toml").write_text('metrics = ["x.csv"]\nloss_key = "VAL_LOSS"\n')
    assert main(["audit", str(tmp_path), "--no-html"]) == 0
    run = json.loads((tmp_path / "findings.json").read_text())["run"]
    assert (run["loss_key"], run["key_choice"]["loss"]["given"]) == ("VAL_LOSS", True)
    (tmp_path / "run.toml").write_text('metrics = ["x.csv"]\nloss_key = "val_loss"\n')
    assert main(["audit", str(tmp_path), "--no-html"]) == 2


def test_key_line_reads_findings_without_key_choice() -> None:
    assert key_line({"loss_key": "loss"}) == ""


# --- a real Lightning run --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def lightning_audits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict]]:
    """A real Lightning run (CSVLogger + TensorBoardLogger) and ``forensics audit`` of each output, without
    ``--loss-key``; built once per session, the two audits run side by side as the user would run them."""
    pytest.importorskip("pytorch_lightning")
    pytest.importorskip("tensorboard")
    from fixtures.lightning_logs import build_lightning_logs

    root = tmp_path_factory.mktemp("lightning")
    logs = build_lightning_logs(root / "logs")
    assert logs.steps == 120
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    runs = {}
    for name, source in (("csv", logs.csv), ("tensorboard", logs.tensorboard)):
        out = root / f"{name}.json"
        cmd = [sys.executable, "-m", "forensics", "audit", "--metrics", str(source), "--json", str(out), "--no-html"]
        runs[name] = (out, subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = {}
    for name, (out, proc) in runs.items():
        stdout, stderr = proc.communicate(timeout=120)
        done[name] = (proc.returncode, stdout + stderr, json.loads(out.read_text()) if out.exists() else {})
    return done


@pytest.mark.slow
@pytest.mark.parametrize("source", ["csv", "tensorboard"])
def test_lightning_run_audits_without_loss_key(lightning_audits: dict, source: str) -> None:
    rc, output, findings = lightning_audits[source]
    assert rc == 0, output
    run = findings["run"]
    assert run["steps"] == 120
    assert run["loss_key"] == "train_loss_step"
    assert run["grad_norm_key"] == "grad_2.0_norm_total"
    assert run["analysed_metrics"] == ["train_loss_step", "grad_2.0_norm_total"]
    loss = run["key_choice"]["loss"]
    assert loss["candidates"][:3] == ["train_loss_step", "train_loss_epoch", "val_loss"]
    assert loss["tied"] == ["train_loss_step"] and not loss["given"]
    assert "'train_loss_epoch' (per-epoch)" in loss["reason"] and "120 values" in loss["reason"]
    assert not [w for w in findings["warnings"] if "equally good" in w]
    assert "keys  loss = train_loss_step" in output
