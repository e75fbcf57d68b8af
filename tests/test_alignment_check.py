"""A metrics file whose step convention is unknown, beside a bucket-jumpy plan: the audit checks the offset from the
data and names the one that fits (the share of loss variance the batch's bucket explains is sharp in the offset)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from forensics.cli import main


@pytest.mark.parametrize("shift", [0, 1, 2])
def test_the_offset_that_fits_the_plan_is_named(demo_small, tmp_path, capsys, shift):
    src = demo_small / "static"
    case = tmp_path / "case"
    case.mkdir()
    for f in ("samples.parquet", "plan.parquet"):
        shutil.copy(src / f, case / f)
    metrics = pd.read_parquet(src / "metrics.parquet")
    metrics.assign(step=metrics["step"] + shift).to_json(case / "metrics.jsonl", orient="records", lines=True)
    (case / "run.toml").write_text('metrics = ["metrics.jsonl"]\nboundaries = [0, 770, 1216, 1728, 2432, 3296, 8192]\n')
    assert main(["audit", str(case), "--no-html"]) == 0
    capsys.readouterr()
    findings = json.loads((case / "findings.json").read_text())
    off = [f for f in findings["findings"] if f["kind"] == "misaligned_steps"]
    if shift == 0:
        assert off == []
    else:
        (f,) = off
        assert f["value"] == shift and f["details"]["shares"][str(shift)] > 0.5 > f["details"]["shares"]["0"]
        assert any(f"set step_offset = {shift}" in w for w in findings["warnings"])
    # a source that says how it counts is not second-guessed
    (case / "run.toml").write_text(
        f'metrics = [{{path = "metrics.jsonl", step_offset = {shift}}}]\n'
        "boundaries = [0, 770, 1216, 1728, 2432, 3296, 8192]\n"
    )
    assert main(["audit", str(case), "--no-html"]) == 0
    capsys.readouterr()
    findings = json.loads((case / "findings.json").read_text())
    assert not [f for f in findings["findings"] if f["kind"] == "misaligned_steps"]
    assert findings["run"]["sources"][0]["step_offset"] == shift
