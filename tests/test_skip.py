"""``forensics skip``: which causes a skip list takes, Megatron's numbering, the sample-id list and
``exclude_samples`` on the datasets a training script holds, and a real Trainer run re-trained without them."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from forensics.cli import main
from forensics.errors import ForensicsError
from forensics.integrations import exclude_samples
from forensics.integrations.skip_lists import megatron_steps, skip_list


def _cause(cid="C1", kind="batch", severity="critical", steps=(10,), samples=(7, 8), verdict=None):
    c = {"id": cid, "kind": kind, "severity": severity, "steps": list(steps), "suspect_samples": list(samples)}
    if verdict is not None:
        c["replay"] = {"verdict": verdict, "samples": [samples[0]] if samples else []}
    return c


# --- which causes: every rule at its boundary ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "min_severity, severity, taken",
    [
        ("critical", "critical", True),
        ("critical", "warning", False),
        ("warning", "warning", True),
        ("warning", "info", False),
        ("info", "info", True),
        ("info", "critical", True),
    ],
)
def test_min_severity_takes_causes_at_or_above_it(min_severity, severity, taken):
    skip = skip_list({"causes": [_cause(severity=severity)]}, min_severity=min_severity)
    assert [c["id"] for c in skip.taken] == (["C1"] if taken else [])
    assert skip.steps == ([10] if taken else [])


@pytest.mark.parametrize(
    "kind, taken",
    [
        ("batch", True),
        ("samples", True),
        ("event", True),
        ("nonfinite", True),
        ("grad_norm", False),
        ("divergence", False),
        ("oscillation", False),
        ("plan", False),
        ("crash", False),
    ],
)
def test_only_data_causes_are_skipped(kind, taken):
    skip = skip_list({"causes": [_cause(kind=kind)]})
    assert bool(skip.taken) is taken
    if not taken:
        assert skip.left_out == [("C1", f"a {kind} cause, not a data event: skipping steps does not address it")]


@pytest.mark.parametrize(
    "verdicts, all_verdicts, taken",
    [
        (("data", "normal"), False, ["C1"]),
        (("data", "normal"), True, ["C1", "C2"]),
        (("data", None), False, ["C1"]),  # not replayed while another was: left out
        (("data", None), True, ["C1", "C2"]),
        ((None, None), False, ["C1", "C2"]),  # no replay at all: the severity alone decides
        (("state", "nondeterministic"), False, []),
    ],
)
def test_replay_verdicts_keep_only_data_causes(verdicts, all_verdicts, taken):
    causes = [
        _cause("C1", steps=(10,), samples=(1,), verdict=verdicts[0]),
        _cause("C2", steps=(20,), samples=(2,), verdict=verdicts[1]),
    ]
    skip = skip_list({"causes": causes}, all_verdicts=all_verdicts)
    assert [c["id"] for c in skip.taken] == taken


def test_a_confirmed_cause_skips_the_samples_its_replay_named():
    cause = _cause(samples=(7, 8, 9), verdict="data")
    assert skip_list({"causes": [cause]}).sample_ids == [7]
    cause["replay"]["verdict"] = "normal"
    assert skip_list({"causes": [cause]}, all_verdicts=True).sample_ids == [7, 8, 9]


def test_a_cause_without_steps_or_samples_is_left_out_with_its_reason():
    skip = skip_list({"causes": [_cause(steps=(), samples=())]})
    assert skip.taken == [] and skip.left_out == [("C1", "names no step or sample")]


def test_a_bad_min_severity_is_a_user_error():
    with pytest.raises(ForensicsError, match="--min-severity must be one of info, warning, critical"):
        skip_list({"causes": []}, min_severity="high")


@pytest.mark.parametrize("indexing, expected", [("logged", [1, 255, 14160]), ("zero", [0, 254, 14159])])
def test_megatron_numbering_of_canonical_steps(indexing, expected):
    skip = skip_list({"causes": [_cause(steps=(254, 0, 14159))]})
    assert megatron_steps(skip, indexing) == expected


# --- Megatron: its own argument definition reads the list ------------------------------------------------------------
def _megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's definition of the flag (megatron/training/arguments.py), written out here."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--iterations-to-skip", nargs="+", type=int, default=[], help="List of iterations to skip, empty by default."
    )
    return parser


def _megatron_log(template: str, losses: np.ndarray) -> str:
    lines = []
    for i, loss in enumerate(losses):
        line = re.sub(r"iteration\s+\d+/", f"iteration {i + 1:8d}/", template)
        lines.append(re.sub(r"lm loss: [0-9.E+-]+", f"lm loss: {loss:.6E}", line))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("indexing, printed_minus", [("logged", 0), ("zero", 1)])
def test_megatron_list_is_the_printed_iteration_or_one_less(real_logs_dir, tmp_path, capsys, indexing, printed_minus):
    template = (real_logs_dir / "bloom-176b-tr11-megatron.log").read_text().splitlines()[0]
    rng = np.random.default_rng(5)
    losses = 2.5 * (1 + 0.01 * rng.standard_normal(300))
    printed = [110, 230]
    for it in printed:
        losses[it - 1] *= 2.5
    case = tmp_path / "megatron"
    case.mkdir()
    (case / "train.log").write_text(_megatron_log(template, losses))
    assert (
        main(["audit", "--metrics", str(case / "train.log"), "--no-html", "--json", str(case / "findings.json")]) == 0
    )
    capsys.readouterr()
    assert (
        main(["skip", str(case), "--format", "megatron", "--min-severity", "warning", "--megatron-indexing", indexing])
        == 0
    )
    out, err = capsys.readouterr()
    parsed = _megatron_parser().parse_args(["--iterations-to-skip", *out.split()])
    assert parsed.iterations_to_skip == [it - printed_minus for it in printed]
    assert "2 step(s)" in err and f"{indexing} indexing" in err


# --- the demo: ids and steps -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_case(demo_small, tmp_path_factory) -> Path:
    case = tmp_path_factory.mktemp("skip-demo") / "static"
    shutil.copytree(demo_small / "static", case, symlinks=True)
    assert main(["audit", str(case), "--no-html"]) == 0
    return case


def test_ids_list_names_each_sample_with_its_cause(demo_case, tmp_path, capsys):
    findings = json.loads((demo_case / "findings.json").read_text())
    critical = [c for c in findings["causes"] if c["severity"] == "critical" and c["kind"] in ("batch", "samples")]
    out = tmp_path / "skip.json"
    assert main(["skip", str(demo_case), "--format", "ids", "-o", str(out)]) == 0
    capsys.readouterr()
    doc = json.loads(out.read_text())
    expected = sorted({i for c in critical for i in c["suspect_samples"]})
    assert doc["sample_ids"] == expected and len(expected) > 0
    assert set(doc["why"]) == {str(i) for i in expected}
    assert all(doc["why"][str(i)].startswith(critical[0]["id"] + " ") for i in critical[0]["suspect_samples"])


def test_steps_are_canonical_or_as_logged(demo_case, capsys):
    findings = json.loads((demo_case / "findings.json").read_text())
    offset = findings["run"]["logged_offset"]
    steps = sorted(
        {s for c in findings["causes"] if c["severity"] == "critical" and c["kind"] == "batch" for s in c["steps"]}
    )
    for steps_as, shift in (("canonical", 0), ("logged", offset)):
        assert main(["skip", str(demo_case), "--format", "steps", "--steps-as", steps_as]) == 0
        out = capsys.readouterr().out.splitlines()
        assert [int(x) for x in out if not x.startswith("#")] == [s + shift for s in steps]
        assert out[0].startswith("# skip list from ")


# --- bad input -------------------------------------------------------------------------------------------------------
def test_no_findings_json_is_one_line_exit_2(tmp_path, capsys):
    assert main(["skip", str(tmp_path), "--format", "ids"]) == 2
    err = capsys.readouterr().err
    assert err == f"forensics: error: {tmp_path} has no findings.json: run `forensics audit {tmp_path}` first\n"


def test_a_damaged_findings_json_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "findings.json").write_text('{"causes": [')
    assert main(["skip", str(tmp_path), "--format", "megatron"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"forensics: error: findings file {tmp_path / 'findings.json'} is not valid JSON")
        and err.count("\n") == 1
    )


def test_no_cause_at_that_severity_is_nothing_to_skip(tmp_path, capsys):
    (tmp_path / "findings.json").write_text(json.dumps({"causes": [_cause(severity="warning")]}))
    out_file = tmp_path / "skip.txt"
    assert main(["skip", str(tmp_path), "--format", "megatron", "-o", str(out_file)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and not out_file.exists()
    assert captured.err.splitlines() == [
        f"nothing to skip: no data cause at critical or above in {tmp_path / 'findings.json'}",
        "  left out C1: warning, below --min-severity",
    ]


# --- exclude_samples on what a training script holds -----------------------------------------------------------------
def _skip_file(tmp_path: Path, ids: list[int]) -> Path:
    path = tmp_path / "skip.json"
    path.write_text(json.dumps({"sample_ids": ids, "why": {str(i): "C1" for i in ids}}))
    return path


def test_exclude_from_a_hf_dataset_by_its_sample_id_column(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"sample_id": [10, 11, 12, 13], "input_ids": [[1], [2], [3], [4]]})
    kept = exclude_samples(ds, _skip_file(tmp_path, [11, 13]))
    assert kept["sample_id"] == [10, 12] and len(ds) == 4


def test_exclude_from_a_hf_dataset_by_row_index(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1], [2], [3], [4]]})
    assert exclude_samples(ds, _skip_file(tmp_path, [0, 2]))["input_ids"] == [[2], [4]]


def test_exclude_from_a_torch_map_style_dataset(tmp_path):
    torch = pytest.importorskip("torch")

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return torch.tensor([i]), i * 10

    kept = exclude_samples(Pairs(), _skip_file(tmp_path, [1, 4]))
    assert isinstance(kept, torch.utils.data.Subset)
    assert [kept[i][1] for i in range(len(kept))] == [0, 20, 30]


def test_exclude_from_a_lightning_datamodule_after_its_setup(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")

    rows = [{"sample_id": 100 + i} for i in range(6)]

    class RowDataset:
        def __len__(self):
            return len(rows)

        def __getitem__(self, i):
            return rows[i]

    class Module(pl.LightningDataModule):
        def setup(self, stage=None):
            self.train_ds = RowDataset()
            self.names = {"not": "a dataset"}

    dm = exclude_samples(Module(), _skip_file(tmp_path, [101, 104]))
    dm.setup("fit")
    assert [dm.train_ds[i]["sample_id"] for i in range(len(dm.train_ds))] == [100, 102, 103, 105]
    dm.setup("fit")  # a second setup builds the dataset again: filtered again, once
    assert len(dm.train_ds) == 4


def test_a_skip_list_that_is_not_one_is_a_user_error(tmp_path):
    bad = tmp_path / "skip.json"
    bad.write_text(json.dumps({"sample_ids": ["a"]}))
    with pytest.raises(ForensicsError, match="expected"):
        exclude_samples([{"x": 1}], bad)


# --- a real Trainer run re-trained without the samples the skip list names ------------------------------------------
def test_retrained_without_the_skip_list_has_none_of_the_corrupted_spikes(hf_cases, tmp_path, capsys):
    from fixtures.hf_retrained import retrained_with_skip_list

    before = hf_cases["random_corrupt"].copy_to(tmp_path / "before")
    assert main(["audit", str(before), "--no-html"]) == 0
    assert (
        main(["skip", str(before), "--format", "ids", "--min-severity", "warning", "-o", str(tmp_path / "skip.json")])
        == 0
    )
    capsys.readouterr()
    corrupt = hf_cases["random_corrupt"].corrupt_ids
    skipped = json.loads((tmp_path / "skip.json").read_text())["sample_ids"]
    assert set(corrupt) <= set(skipped)
    loss_spikes_before = [
        s["step"] for s in json.loads((before / "findings.json").read_text())["spikes"] if s["metric"] == "loss"
    ]
    assert len(loss_spikes_before) >= 5

    after_case = retrained_with_skip_list("random_corrupt", tmp_path / "skip.json")
    assert after_case.corrupt_ids == []
    after = after_case.copy_to(tmp_path / "after")
    import pandas as pd

    trained_on = set(pd.read_parquet(after / "plan")["sample_id"])
    assert trained_on.isdisjoint(skipped) and len(trained_on) == 2010 - len(skipped)
    assert main(["audit", str(after), "--no-html"]) == 0
    capsys.readouterr()
    findings = json.loads((after / "findings.json").read_text())
    assert [s["step"] for s in findings["spikes"] if s["metric"] == "loss"] == []
    assert [c["id"] for c in findings["causes"] if c["severity"] == "critical"] == []
