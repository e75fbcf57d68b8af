"""``forensics replay CASE --rerun`` on real tiny HF Trainer runs, each with one planted fault (fixtures/hf_faults.py):
the segment re-run from the checkpoint before the spike names the fault's class, and where it began.

- ``data``: six corrupted near-duplicates packed into step 17's batch -> ``data``, the six first by per-sample
  gradient norm;
- ``lr_spike``: the learning rate x30 at step 13 only -> the loss of step 14 spikes whatever its batch: ``optimizer``,
  naming the first group whose update/weight ratio jumped (at step 13);
- ``bitflip``: the final layer norm's scale changed in memory at step 13, the checkpoint before it clean ->
  ``hardware`` (the re-run from the same state and batches does not reproduce the spike);
- ``overflow``: an embedding row at 1e30 in the checkpoint's state, reached by step 17's batch -> ``numerics``;
- ``clean``: no fault: its largest events (the largest loss rise, the largest loss after the first checkpoint, the
  largest grad norm) are no spike to the re-run: no class, and no cause at warning or above.

Each run is built once per session (a few seconds each) and copied before a replay writes into it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fixtures.hf_faults import FAULT_STEP, fault_runs  # noqa: E402
from forensics.cli import main  # noqa: E402
from forensics.replay import ReplayOptions, replay_case  # noqa: E402

#: A light replay beside the re-run: the verdicts are not what these tests pin.
LIGHT = dict(device="cpu", controls=2, earlier=0, probes=False, control_step=False, rerun=True)


@pytest.fixture(scope="module")
def runs():
    return fault_runs()


#: The first re-run of each fault run in this session (a second one is asked for only to compare with it).
_FIRST: dict[str, dict] = {}


def _rerun(run, tmp_path: Path, again: bool = False) -> dict:
    if run.name in _FIRST and not again:
        return _FIRST[run.name]
    case = run.copy_to(tmp_path / run.name)
    s = run.spike_step
    result = replay_case(case, ReplayOptions(steps=[s], **LIGHT))
    entry = next(d for d in result.steps if d["step"] == s)
    on_disk = json.loads((case / "replay" / "replay.json").read_text(encoding="utf-8"))
    assert next(d for d in on_disk["steps"] if d["step"] == s)["rerun"] == entry["rerun"]
    _FIRST.setdefault(run.name, entry["rerun"])
    return entry["rerun"]


def test_corrupted_batch_is_data_with_the_corrupted_samples_first(runs, tmp_path):
    run = runs["data"]
    r = _rerun(run, tmp_path)
    assert r["cause_class"] == "data"
    assert r["from_checkpoint"] == 12
    assert [x["step"] for x in r["segment"]] == [12, 13, 14, 15, 16, 17]
    assert r["reproduced"] is True and r["deterministic"] is True
    assert r["replaced"]["spike_gone"] is True
    ranked = [x["sample_id"] for x in r["per_sample"]]
    assert len(ranked) == 8
    assert set(ranked[:6]) == set(run.corrupt_ids)
    # the re-run reproduces the logged loss and grad norm of every step of the segment
    for x in r["segment"]:
        assert x["loss"] == pytest.approx(x["logged"], rel=1e-4)
        assert x["grad_norm"] == pytest.approx(x["logged_grad_norm"], rel=1e-4)
    assert set(r["segment"][0]["groups"]) == {
        "embeddings",
        "block.0.attn",
        "block.0.mlp",
        "block.1.attn",
        "block.1.mlp",
        "norms",
    }
    assert "skip" in r["action"].lower()


def test_one_step_lr_spike_is_optimizer_naming_the_first_group_that_jumped(runs, tmp_path):
    r = _rerun(runs["lr_spike"], tmp_path)
    assert r["cause_class"] == "optimizer"
    assert r["reproduced"] is True
    assert r["replaced"]["spike_gone"] is False
    seg = {x["step"]: x for x in r["segment"]}
    before, at = seg[FAULT_STEP - 1]["groups"], seg[FAULT_STEP]["groups"]
    factors = {g: at[g]["update_ratio"] / before[g]["update_ratio"] for g in at}
    assert min(factors.values()) > 3  # every group's update was 30x the lr-implied size
    assert r["first_group"] == max(factors, key=factors.get) == "block.0.attn"
    assert r["first_group"] in r["action"]
    assert any(f"at step {FAULT_STEP}" in e for e in r["evidence"])


def test_weight_changed_in_memory_is_hardware(runs, tmp_path):
    r = _rerun(runs["bitflip"], tmp_path)
    assert r["cause_class"] == "hardware"
    assert r["reproduced"] is False
    assert r["deterministic"] is True
    assert r["from_checkpoint"] == 8
    last = r["segment"][-1]
    assert last["step"] == FAULT_STEP
    assert last["logged"] > 2 * last["loss"]


def test_planted_overflow_is_numerics(runs, tmp_path):
    run = runs["overflow"]
    r = _rerun(run, tmp_path)
    assert r["cause_class"] == "numerics"
    last = r["segment"][-1]
    assert last["step"] == run.spike_step
    assert last["grad_norm"] in ("nan", "inf")


def test_same_inputs_give_the_same_rerun(runs, tmp_path):
    first = _rerun(runs["lr_spike"], tmp_path / "a")
    assert _rerun(runs["lr_spike"], tmp_path / "b", again=True) == first


def test_rerun_from_findings_puts_the_class_on_the_cause(runs, tmp_path):
    case = runs["data"].copy_to(tmp_path / "case")
    assert main(["audit", str(case), "--no-html"]) == 0
    assert (
        main(
            [
                "replay",
                str(case),
                "--from-findings",
                "--rerun",
                "--device",
                "cpu",
                "--controls",
                "2",
                "--no-probes",
                "--no-control-step",
            ]
        )
        == 0
    )
    findings = json.loads((case / "findings.json").read_text(encoding="utf-8"))
    cause = next(c for c in findings["causes"] if runs["data"].spike_step in c["steps"])
    assert cause["cause_class"] == "data"
    assert cause["action"].startswith("Skip the suspect samples")


def test_rerun_without_optimizer_state_is_one_line(runs, tmp_path, capsys):
    case = runs["data"].copy_to(tmp_path / "case")
    for ck in case.glob("checkpoint-*"):
        (ck / "optimizer.pt").unlink()
    assert (
        main(["replay", str(case), "--steps", "17", "--rerun", "--device", "cpu", "--no-probes", "--no-control-step"])
        == 2
    )
    err = capsys.readouterr().err
    assert "optimizer.pt" in err and "Traceback" not in err


def _largest_events(run) -> list[int]:
    """The clean run's largest events (module docstring), canonical steps."""
    state = json.loads((run.out / "trainer_state.json").read_text(encoding="utf-8"))
    rows = [(int(r["step"]) - 1, float(r["loss"]), float(r["grad_norm"])) for r in state["log_history"] if "loss" in r]
    after = [r for r in rows if r[0] > 4]  # past the first checkpoint: a segment with a baseline
    return sorted({run.spike_step, max(after, key=lambda r: r[1])[0], max(after, key=lambda r: r[2])[0]})


def test_clean_run_largest_events_get_no_class(runs, tmp_path):
    run = runs["clean"]
    steps = _largest_events(run)
    assert len(steps) == 3
    case = run.copy_to(tmp_path / "case")
    assert main(["audit", str(case), "--no-html"]) == 0
    assert (
        main(
            [
                "replay",
                str(case),
                "--steps",
                ",".join(map(str, steps)),
                "--rerun",
                "--device",
                "cpu",
                "--controls",
                "2",
                "--no-probes",
                "--no-control-step",
            ]
        )
        == 0
    )
    replay = json.loads((case / "replay" / "replay.json").read_text(encoding="utf-8"))
    reruns = {d["step"]: d["rerun"] for d in replay["steps"] if d.get("rerun")}
    assert sorted(reruns) == steps
    for r in reruns.values():
        assert r["reproduced"] is True
        assert r["spike"] is False
        assert r["cause_class"] is None and r["action"] is None
    findings = json.loads((case / "findings.json").read_text(encoding="utf-8"))
    assert [c["severity"] for c in findings["causes"] if c["severity"] in ("warning", "critical")] == []
    assert [c for c in findings["causes"] if c.get("cause_class")] == []


def test_audit_replay_reruns_the_main_cause_and_names_its_class(runs, tmp_path):
    run = runs["data"]
    case = run.copy_to(tmp_path / "case")
    assert main(["audit", str(case), "--no-html", "--replay"]) == 0
    findings = json.loads((case / "findings.json").read_text(encoding="utf-8"))
    main_cause = findings["causes"][0]
    assert run.spike_step in main_cause["steps"]
    assert main_cause["cause_class"] == "data"
    assert main_cause["action"].startswith("Skip the suspect samples")
    assert findings["verdict"].endswith(f"; re-run: cause class data ({main_cause['action'].rstrip('.')}).")
    # the action's command names this case and runs as printed
    import re
    import shlex

    (command,) = re.findall(r"\((forensics skip [^)]*)\)", main_cause["action"])
    argv = shlex.split(command)
    assert argv[2] == str(case)
    assert main([*argv[1:], "-o", str(tmp_path / "skip.json")]) == 0
    assert set(run.corrupt_ids) <= set(json.loads((tmp_path / "skip.json").read_text())["sample_ids"])
    replay = json.loads((case / "replay" / "replay.json").read_text(encoding="utf-8"))
    assert next(d for d in replay["steps"] if d["step"] == run.spike_step)["rerun"]["cause_class"] == "data"


def test_audit_replay_without_optimizer_state_replays_without_a_class(runs, tmp_path):
    case = runs["data"].copy_to(tmp_path / "case")
    for ck in case.glob("checkpoint-*"):
        (ck / "optimizer.pt").unlink()
    assert main(["audit", str(case), "--no-html", "--replay"]) == 0
    findings = json.loads((case / "findings.json").read_text(encoding="utf-8"))
    assert findings["causes"][0]["replay"]["verdict"] == "data"
    assert "cause_class" not in findings["causes"][0]
    assert "re-run" not in findings["verdict"]
