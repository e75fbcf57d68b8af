"""run.toml ``ranks``: each rank's own metrics source becomes one rank of the metrics table's rank dimension.

Entry i is rank i's log unless a table names its ``rank``; its metrics read as ``NAME/rank{i}`` (what the rank rule
reads), beside the run's own sources. A value of another shape is bad input: one line naming run.toml and the key,
exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.cli import main
from forensics.detect.rules.rank_drift import rank_metrics
from forensics.schema import open_case
from forensics.sources import read_metrics

LOSSES = {0: [2.0, 1.9, 1.8], 1: [2.1, 2.4, 1.7]}


def _case(tmp_path: Path, ranks_toml: str) -> Path:
    """Two per-rank JSONL logs (``step``, ``loss``, ``step_time``; no ``rank`` column) and a run.toml naming them."""
    for rank, losses in LOSSES.items():
        lines = [json.dumps({"step": s, "loss": v, "step_time": 0.5 + rank}) for s, v in enumerate(losses)]
        (tmp_path / f"r{rank}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "run.toml").write_text(f"ranks = {ranks_toml}\n", encoding="utf-8")
    return tmp_path


def _table(case: Path):
    c = open_case(case)
    metrics, _ = read_metrics(c.metrics_sources, step_offset=c.config.step_offset)
    return metrics


def test_per_rank_files_become_one_table_with_a_rank_dimension(tmp_path):
    metrics = _table(_case(tmp_path, '["r0.jsonl", "r1.jsonl"]'))
    assert metrics["step"].tolist() == [0, 1, 2]
    for rank, losses in LOSSES.items():
        assert metrics[f"loss/rank{rank}"].tolist() == losses
        assert metrics[f"step_time/rank{rank}"].tolist() == [0.5 + rank] * 3
    assert rank_metrics(list(metrics.columns)) == {
        "loss": {0: "loss/rank0", 1: "loss/rank1"},
        "step_time": {0: "step_time/rank0", 1: "step_time/rank1"},
    }


def test_a_table_entry_names_its_own_rank(tmp_path):
    metrics = _table(_case(tmp_path, '[{path = "r0.jsonl", rank = 3}, {path = "r1.jsonl", rank = 5}]'))
    assert metrics["loss/rank3"].tolist() == LOSSES[0]
    assert metrics["loss/rank5"].tolist() == LOSSES[1]


def test_the_case_loads_with_ranks_alone(tmp_path, capsys):
    """No ``metrics`` key and no other source: the per-rank logs are the case's metrics."""
    assert main(["validate", str(_case(tmp_path, '["r0.jsonl", "r1.jsonl"]'))]) == 0


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"r0.jsonl"', "must list each rank's own metrics source"),
        ('["r0.jsonl"]', "must list each rank's own metrics source"),
        ("[1, 2]", "must list each rank's own metrics source"),
        ('[{path = "r0.jsonl", rank = -1}, "r1.jsonl"]', "must be a whole number >= 0; got -1"),
        ('[{path = "r0.jsonl", rank = 1}, "r1.jsonl"]', "names rank 1 more than once"),
        ('[{path = "r0.jsonl", colour = 1}, "r1.jsonl"]', "entries take path, step_key, step_offset and rank"),
    ],
)
def test_a_bad_ranks_value_is_one_line_and_exit_2(tmp_path, capsys, value, says):
    case = _case(tmp_path, value)
    assert main(["audit", str(case), "--no-html"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(case / "run.toml") in err and "'ranks'" in err and says in err
    assert "Traceback" not in err


def test_a_missing_rank_file_is_one_line_and_exit_2(tmp_path, capsys):
    case = _case(tmp_path, '["r0.jsonl", "r9.jsonl"]')
    assert main(["audit", str(case), "--no-html"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "r9.jsonl" in err
