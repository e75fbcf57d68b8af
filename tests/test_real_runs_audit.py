"""`forensics audit OUTPUT_DIR` on real Hugging Face Trainer runs, as a new user runs it: no flag, the right
0-based steps, the corrupted samples first, from each source alone and from all three merged; the gate passes HF's
own length-grouped sampler and fails the static batcher as built once."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from forensics.cli import main


def _corrupt_steps(run) -> list[int]:
    plan = pd.read_parquet(run.out / "plan")
    return sorted(plan[plan["sample_id"].isin(run.corrupt_ids)]["step"].unique().tolist())


def _loss_spikes(findings: dict, key: str) -> dict[int, dict]:
    return {int(s["peak_step"]): s for s in findings["spikes"] if s["metric"] == key}


def test_audit_of_the_output_folder_needs_no_flag(runs, tmp_path, capsys):
    run = runs["static"]
    out = tmp_path / "f.json"
    assert main(["audit", str(run.out), "--no-html", "--json", str(out)]) == 0
    capsys.readouterr()
    findings = json.loads(out.read_text())
    assert {(s["format"], s["step_offset"], s["convention"]) for s in findings["run"]["sources"]} == {
        ("json", 1, "hf-trainer"),
        ("tensorboard", 1, "hf-trainer"),
        ("wandb", 1, "hf-trainer"),
    }
    spikes = _loss_spikes(findings, findings["run"]["loss_key"])
    corrupt = _corrupt_steps(run)
    assert set(corrupt) <= set(spikes), (corrupt, sorted(spikes))
    for step in corrupt:
        assert set(spikes[step]["suspect_samples"][: len(run.corrupt_ids)]) == set(run.corrupt_ids)
    (cause,) = [c for c in findings["causes"] if set(corrupt) <= set(c["steps"])]
    assert cause["kind"] == "batch" and "built once" in findings["verdict"]
    assert findings["plan"]["static"] is True and "built_once" in findings["plan"]["failure_kinds"]


@pytest.mark.parametrize("source", ["trainer_state.json", "runs", "wandb"])
def test_each_source_alone_gives_the_same_steps(runs, tmp_path, capsys, source):
    run = runs["static"]
    path = {"runs": run.tensorboard_runs[-1], "wandb": run.wandb_runs[-1]}.get(source, run.out / source)
    out = tmp_path / "f.json"
    assert (
        main(
            [
                "audit",
                "--metrics",
                str(path),
                "--plan",
                str(run.out / "plan"),
                "--samples",
                str(run.out / "samples.parquet"),
                "--no-html",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    capsys.readouterr()
    findings = json.loads(out.read_text())
    assert findings["run"]["sources"][0]["step_offset"] == 1
    spikes = _loss_spikes(findings, findings["run"]["loss_key"])
    late = [s for s in _corrupt_steps(run) if s >= 50]  # past the first epochs' learning
    assert set(late) <= set(spikes) and not {s + 1 for s in late} & set(spikes)


def test_hf_length_grouped_sampler_passes_the_gate_and_is_not_called_static(runs, tmp_path, capsys):
    run = runs["grouped"]
    assert main(["check-plan", str(run.out), "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["passed"] is True
    static = runs["static"]
    assert main(["check-plan", str(static.out), "--json", str(tmp_path / "s.json")]) == 1
    gate = json.loads((tmp_path / "s.json").read_text())
    assert gate["failure_kinds"] == ["built_once"]
    capsys.readouterr()
    assert main(["audit", str(run.out), "--no-html", "--json", str(tmp_path / "f.json")]) == 0
    out = capsys.readouterr().out
    findings = json.loads((tmp_path / "f.json").read_text())
    assert findings["plan"]["static"] is False and "built once" not in out and "static" not in findings["verdict"]


def test_values_logged_every_5_steps_cover_their_window(runs, tmp_path, capsys):
    run = runs["logging5"]
    assert main(["audit", str(run.out), "--no-html", "--json", str(tmp_path / "f.json")]) == 0
    capsys.readouterr()
    findings = json.loads((tmp_path / "f.json").read_text())
    key = findings["run"]["loss_key"]
    assert {s["logging_steps"] for s in findings["run"]["sources"] if s["convention"] == "hf-trainer"} == {5}
    for s in findings["spikes"]:
        if s["metric"] == key:
            lo, hi = s["details"]["window_steps"]
            assert hi - lo == 4 and s["step"] == lo and any("mean over 5 steps" in e for e in s["evidence"])


def test_findings_and_the_summary_give_the_trainers_own_step_beside_the_canonical_one(runs, tmp_path, capsys):
    """HF counts global_step from 1: every finding carries logged_step = step + 1 and the summary shows both."""
    run = runs["static"]
    out = tmp_path / "f.json"
    assert main(["audit", str(run.out), "--no-html", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    findings = json.loads(out.read_text())
    assert findings["run"]["logged_offset"] == 1
    assert findings["findings"] and all(f["logged_step"] == f["step"] + 1 for f in findings["findings"])
    assert all(c["logged_steps"] == [s + 1 for s in c["steps"]] for c in findings["causes"])
    first = min(_corrupt_steps(run))
    (line,) = [x for x in printed.splitlines() if x.strip().startswith("C1 batch")]
    assert f"steps {first}, " in line and f"(logged {first + 1}, " in line
