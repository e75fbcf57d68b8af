"""What a user meets first: a log given where a case is expected, a loss column of text, counts in the summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from forensics.cli import main
from forensics.errors import ForensicsError
from forensics.report.summary import fold_causes
from forensics.schema import find_loss_key
from forensics.schema.keys import choose_key
from forensics.schema.tables import LEFT_OUT
from forensics.schema.words import counted, plural
from forensics.sources import read_metrics


# --- a log file where a case is expected ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def metrics_files(demo_small: Path, real_logs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same kind of input in the forms a user has at hand: a real nanoGPT text log (its first 3,000 lines), and
    the demo's metrics as JSONL and CSV."""
    out = tmp_path_factory.mktemp("door-files")
    log = out / "train.log"
    with open(real_logs_dir / "modded-nanogpt-1b-adamw.log", encoding="utf-8") as src:
        log.write_text("".join(line for _, line in zip(range(3000), src)))
    metrics = pd.read_parquet(demo_small / "static/metrics.parquet")
    metrics.to_json(out / "metrics.jsonl", orient="records", lines=True)
    metrics.to_csv(out / "metrics.csv", index=False)
    return {"log": log, "jsonl": out / "metrics.jsonl", "csv": out / "metrics.csv"}


@pytest.mark.parametrize("form", ["log", "jsonl", "csv"])
def test_a_metrics_file_given_as_the_case_is_audited_as_its_metrics(form, metrics_files, tmp_path, capsys):
    source = tmp_path / metrics_files[form].name
    shutil.copy(metrics_files[form], source)
    as_case, as_flag = tmp_path / "as_case.json", tmp_path / "as_flag.json"

    assert main(["audit", str(source), "--no-html", "--json", str(as_case)]) == 0
    assert main(["audit", "--metrics", str(source), "--no-html", "--json", str(as_flag)]) == 0

    a, b = json.loads(as_case.read_text()), json.loads(as_flag.read_text())
    assert a["run"]["steps"] == b["run"]["steps"] > 100
    assert a["run"]["loss_key"] == b["run"]["loss_key"]
    assert [s["step"] for s in a["spikes"]] == [s["step"] for s in b["spikes"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([source.name, "as_case.json", "as_flag.json"])


# --- a loss column that holds no number -----------------------------------------------------------------------------
TEXT_LOSS = [  # (column, given key, what the one line says)
    (
        "loss",
        None,
        "no loss column found: column 'loss' of {f} holds no numeric value (e.g. 'high'); expected a column of numbers",
    ),
    (
        "loss",
        "loss",
        "loss key 'loss' holds no number: column 'loss' of {f} holds no numeric value (e.g. 'high'); "
        "expected a column of numbers",
    ),
    (
        "train/loss",
        None,
        "no loss column found: column 'train/loss' of {f} holds no numeric value (e.g. 'high'); "
        "expected a column of numbers",
    ),
    (
        "train/loss",
        "train/loss",
        "loss key 'train/loss' holds no number: column 'train/loss' of {f} holds no "
        "numeric value (e.g. 'high'); expected a column of numbers",
    ),
]


def _text_loss_csv(tmp_path: Path, column: str) -> Path:
    path = tmp_path / "textloss.csv"
    rows = "\n".join(f"{s},{w},0.1" for s, w in enumerate(["high", "low", "mid"] * 20))
    path.write_text(f"step,{column},lr\n{rows}\n")
    return path


#: compare takes no loss key: it looks for the loss by name only
WHERE_THE_LOSS_IS_LOOKED_FOR = [
    (command, *row)
    for command in ("audit", "compare", "replay-session")
    for row in TEXT_LOSS
    if not (command == "compare" and row[1])
]


@pytest.mark.parametrize(("command", "column", "given", "said"), WHERE_THE_LOSS_IS_LOOKED_FOR)
def test_a_loss_column_of_text_is_named_with_why(command, column, given, said, tmp_path, capsys):
    path = _text_loss_csv(tmp_path, column)
    expected = said.format(f=path)
    if command == "replay-session":  # where replay looks for the loss: a metrics table read by the one reader
        metrics, _ = read_metrics([str(path)])
        with pytest.raises(ForensicsError) as err:
            find_loss_key(metrics.columns, given, left_out=metrics.attrs.get(LEFT_OUT))
        assert str(err.value).startswith(expected)
        return
    argv = ["audit", str(path), "--no-html"] if command == "audit" else ["compare", str(path), str(path)]
    if given:
        argv += ["--loss-key", given]
    capsys.readouterr()
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith(f"forensics: error: {expected}")


def test_the_live_loop_names_a_loss_column_of_text(tmp_path):
    """The dashboard's and watch's loop looks for the loss where the audit does, and says the same."""
    from forensics.live.run import LiveRun
    from forensics.live.target import Target

    path = _text_loss_csv(tmp_path, "loss")
    with pytest.raises(
        ForensicsError,
        match=r"^no loss column found: column 'loss' of .*textloss.csv holds no "
        r"numeric value \(e.g. 'high'\)",
    ):
        LiveRun(Target(sources=[str(path)])).start()


def test_a_numeric_loss_beside_a_text_column_is_chosen():
    """Left-out fields speak only when the lookup finds nothing: a numeric loss still wins over a text one."""
    choice = choose_key(
        ["train/loss", "lr"], "loss", required=True, left_out={"loss": "column 'loss' of x.csv holds no numeric value"}
    )
    assert choice.key == "train/loss"


# --- plurals --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "noun", "many", "said"),
    [
        (0, "spike", None, "0 spikes"),
        (1, "spike", None, "1 spike"),
        (2, "spike", None, "2 spikes"),
        (1, "batch", None, "1 batch"),
        (2, "batch", None, "2 batches"),
        (3, "NaN/inf value", None, "3 NaN/inf values"),
        (1, "spike without a batch", "spikes without a batch", "1 spike without a batch"),
        (31, "spike without a batch", "spikes without a batch", "31 spikes without a batch"),
    ],
)
def test_counted_says_the_plural_at_its_boundary(n, noun, many, said):
    assert counted(n, noun, many) == said
    assert plural(noun, n, many) == said.split(" ", 1)[1]


@pytest.mark.parametrize(
    ("kind", "n", "line"),
    [
        ("event", 1, "and 1 spike without a batch (at most warning): findings.json cause C1"),
        (
            "event",
            31,
            "and 31 spikes without a batch (at most warning): findings.json causes C1, C2, C3, C4, C5, C6, C7, C8 ...",
        ),
        ("batch", 1, "and 1 batch cause (at most warning): findings.json cause C1"),
        ("batch", 2, "and 2 batch causes (at most warning): findings.json causes C1, C2"),
        (
            "grad_norm",
            2,
            "and 2 sets of grad-norm spikes the loss did not follow (at most warning): findings.json causes C1, C2",
        ),
        ("level_shift", 2, "and 2 level shifts (at most warning): findings.json causes C1, C2"),
        ("crash", 2, "and 2 crash causes (at most warning): findings.json causes C1, C2"),
    ],
)
def test_folded_causes_are_counted_in_words(kind, n, line):
    causes = [{"id": f"C{i + 1}", "kind": kind, "severity": "warning"} for i in range(n)]
    assert fold_causes(causes) == [line]


@pytest.mark.parametrize(("warnings", "said"), [(0, "ok"), (1, "ok (1 warning)"), (2, "ok (2 warnings)")])
def test_validate_counts_its_warnings(warnings, said, tmp_path, capsys):
    path = tmp_path / "m.csv"
    text_columns = "".join(f",note{i}" for i in range(warnings))
    rows = "".join(f"{s},{2 + 0.01 * s}" + ",x" * warnings + "\n" for s in range(50))
    path.write_text(f"step,loss{text_columns}\n{rows}")
    assert main(["validate", "--metrics", str(path)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == said
