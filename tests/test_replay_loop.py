"""The loop a new user runs on a plain ``record(trainer)`` run: audit, replay every batch cause, read the verdicts
in the same findings.json, summary and report; and the demo's printed next steps, run as printed.

The run is fixtures/hf_cases.py's ``static_corrupt``: a real HF Trainer run (GPT-2 with its default dropout 0.1,
checkpoints at 100/200/300/400, no ``trainer.save_model()``), 12 near-duplicates packed into one batch that comes
back at steps 84, 189, 208 and 376 (84 is before the first checkpoint). Each fixture below copies the cached case.

The audited copies (``audited``, and ``replayed`` and ``looped`` after it) also carry a logging glitch
(:func:`_logging_glitch`): the logged loss of clean step 54 raised 1.8x while its batch and the model are clean.
Its grad norm really rose there, so the audit flags step 54 as a critical batch cause of its own; replayed at
checkpoint 100 (after the step: no checkpoint before it, so no segment re-run) the batch lies within its controls,
and the replay clears the cause (``normal``, lowered to ``info``). So both ways of replaying are compared on a data
cause and a cleared one. Tests that copy ``hf_cases["static_corrupt"]`` themselves read the run as recorded.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fixtures.hf_cases import step_losses  # noqa: E402
from forensics.cli import main  # noqa: E402

CLEAN = (230, 300)  # clean steps: 230 at checkpoint 200 (30 updates on), 300 at its own checkpoint
GLITCH_STEP, GLITCH_FACTOR = 54, 1.8  # a clean step whose logged loss the glitch raises (module docstring)
BATCH_KINDS = ("batch", "samples", "event", "nonfinite")


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _logging_glitch(case: Path) -> Path:
    """The copy ``case`` with the logged loss of clean step :data:`GLITCH_STEP` raised :data:`GLITCH_FACTOR` x in
    every trainer_state.json (the run's and each checkpoint's: HF writes one log_history into both), as a logger
    that wrote a wrong value would leave it; the batch, the plan and the checkpoints stay the run's.

    trainer_state.json's ``loss`` is the key the audit analyses (tied with the TensorBoard and W&B copies'
    ``train/loss``, which stay as logged; the audit takes the first): the glitch reaches what the audit and the
    replay read as the logged loss. HF logs global_step after the update, from 1: canonical step 54 is logged 55."""
    logged = GLITCH_STEP + 1
    for path in [case / "trainer_state.json", *case.glob("checkpoint-*/trainer_state.json")]:
        state = _read(path)
        rows = [h for h in state["log_history"] if h.get("step") == logged and "loss" in h]
        if path.parent == case:
            assert len(rows) == 1, path  # the run's own file holds every logged step
        for row in rows:
            row["loss"] *= GLITCH_FACTOR
        path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")  # as HF writes it
    return case


@pytest.fixture(scope="module")
def audited(hf_cases, tmp_path_factory) -> Path:
    """The case with the logging glitch, audited once (findings.json, report.html), no replay yet."""
    case = _logging_glitch(hf_cases["static_corrupt"].copy_to(tmp_path_factory.mktemp("loop") / "out"))
    assert main(["audit", str(case)]) == 0
    return case


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _whole_budget(case: Path) -> Path:
    """The case with a replay budget no re-run reaches: what the replays do then depends on the run alone, not on
    how busy the machine is (the budget's own path is tested with a budget too small for anything)."""
    with (case / "run.toml").open("a", encoding="utf-8") as fh:
        fh.write("\n[replay]\nbudget = 100000\n")
    return case


@pytest.fixture(scope="module")
def replayed(audited, tmp_path_factory) -> tuple[Path, str]:
    """``forensics replay OUTPUT_DIR --from-findings`` after the audit, as docs/your-run.md gives it: no flag."""
    case = _whole_budget(_copy(audited, tmp_path_factory.mktemp("replayed") / "out"))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["replay", str(case), "--from-findings"])
    assert rc == 0
    return case, out.getvalue()


@pytest.fixture(scope="module")
def looped(hf_cases, tmp_path_factory) -> tuple[Path, str]:
    """``forensics audit OUTPUT_DIR --replay`` on a fresh copy with the same logging glitch as ``audited``: one
    command."""
    case = _whole_budget(_logging_glitch(hf_cases["static_corrupt"].copy_to(tmp_path_factory.mktemp("looped") / "out")))
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["audit", str(case), "--replay"])
    assert rc == 0
    return case, out.getvalue()


def test_record_writes_no_model_and_replay_takes_the_architecture_from_a_checkpoint(hf_cases):
    case = hf_cases["static_corrupt"]
    assert "model =" not in (case.out / "run.toml").read_text()
    assert not (case.out / "config.json").exists() and (case.out / "checkpoint-100" / "config.json").exists()


def test_from_findings_gives_every_batch_cause_a_verdict_and_the_data_its_samples(hf_cases, audited, replayed):
    case, out = replayed
    before = _read(audited / "findings.json")
    batch_causes = [c for c in before["causes"] if c["kind"] in BATCH_KINDS]
    # two batch causes: the corrupted batch's and the glitched step's
    assert sorted(c["steps"] for c in batch_causes) == [[GLITCH_STEP], [84, 189, 208, 376]]
    doc = _read(case / "replay" / "replay.json")
    by = {d["step"]: d for d in doc["steps"]}
    suspects = sorted(s for s, d in by.items() if d["role"] == "suspect")
    assert suspects == [GLITCH_STEP, 84, 189, 208]  # each cause's first events (at most 3)
    after = _read(case / "findings.json")
    assert all(c.get("replay") for c in after["causes"] if c["kind"] in BATCH_KINDS)
    # the corrupted batch: data, its near-duplicates first
    bad = set(hf_cases["static_corrupt"].corrupt_ids)
    d = by[189]
    assert (d["verdict"], d["checkpoint_step"], d["checkpoint"]) == ("data", 100, "before")
    assert {x["sample_id"] for x in d["samples"][: len(bad)]} == bad and set(d["leave_out"]["sample_ids"]) == bad
    assert d["controls"]["z"] > 10 and d["gradient"]["z"] > 10
    # the table a person reads: integer checkpoints, '-' for none, the logged step beside the canonical one
    assert re.search(r"^\s*189\s+190\s+cause C\d\s+data\s+eval\s+100\s", out, re.M), out
    assert "nan" not in out and "100.000" not in out


def test_a_step_before_the_first_checkpoint_gets_a_verdict_from_the_next_one(replayed):
    case, out = replayed
    by = {d["step"]: d for d in _read(case / "replay" / "replay.json")["steps"]}
    for step, verdict, confidence in ((GLITCH_STEP, "normal", 0.6), (84, "data", 0.8)):
        d = by[step]
        assert (d["verdict"], d["checkpoint_step"], d["checkpoint"], d["confidence"]) == (
            verdict,
            100,
            "after",
            confidence,
        )
        assert f"{100 - step} updates after the step" in d["evidence"][0]
    assert "100 (after)" in out


def test_the_replay_adds_a_clean_control_step_that_comes_back_normal(replayed):
    case, _ = replayed
    (control,) = [d for d in _read(case / "replay" / "replay.json")["steps"] if d["role"] == "control"]
    assert control["verdict"] == "normal" and control["control_of"] == 84 and control["checkpoint"] == "before"


def test_clean_steps_are_normal_with_the_dropout_loss_reproduced_in_train_mode(audited, tmp_path, capsys):
    case = _copy(audited, tmp_path / "out")
    assert main(["replay", str(case), "--steps", ",".join(map(str, CLEAN)), "--no-control-step"]) == 0
    by = {d["step"]: d for d in _read(case / "replay" / "replay.json")["steps"]}
    assert [by[s]["verdict"] for s in CLEAN] == ["normal", "normal"], [by[s]["evidence"] for s in CLEAN]
    d = by[300]  # its own checkpoint: eval mode misses the logged loss (taken with dropout 0.1 on), train mode not
    assert d["mode"] == "train" and d["seeds"] == [0, 1, 2] and d["spread"] > 0
    assert abs(d["replayed_eval"] - d["logged"]) > 0.02 * d["logged"]
    assert abs(d["replayed_train"] - d["logged"]) < 0.02 * d["logged"]
    assert d["controls"]["mode"] == "eval" and d["determinism"]["train"]["equal"] is True
    assert "canonical 0-based" in capsys.readouterr().err


def test_the_same_batch_with_its_tokens_shifted_by_one_is_not_reproduced(audited, tmp_path):
    """The negative control: the verdicts discriminate (the batch is high against its controls, but it is not the
    batch the run fed)."""
    from fixtures.text_corpus import VOCAB

    case = _copy(audited, tmp_path / "out")
    plan = pd.concat(pd.read_parquet(p) for p in sorted((case / "plan").glob("*.parquet")))
    ids = set(plan.loc[plan["step"] == 300, "sample_id"])
    samples = pd.read_parquet(case / "samples.parquet")
    shifted = samples["input_ids"].where(
        ~samples["sample_id"].isin(ids), samples["input_ids"].map(lambda t: [(int(x) + 1) % len(VOCAB) for x in t])
    )
    samples.assign(input_ids=shifted).to_parquet(case / "samples.parquet", index=False)
    assert main(["replay", str(case), "--steps", "300", "--no-control-step", "--no-probes"]) == 0
    (d,) = _read(case / "replay" / "replay.json")["steps"]
    assert d["verdict"] == "not-reproduced", d["evidence"]
    assert "the tokens of step 300's batch differ" in d["evidence"][-1]


def test_steps_as_logged_reads_the_runs_own_numbers(audited, tmp_path, capsys):
    case = _copy(audited, tmp_path / "out")
    assert (
        main(
            [
                "replay",
                str(case),
                "--steps",
                "301",
                "--steps-as",
                "logged",
                "--no-control-step",
                "--no-probes",
                "--controls",
                "3",
            ]
        )
        == 0
    )
    (d,) = _read(case / "replay" / "replay.json")["steps"]
    assert (d["step"], d["logged_step"]) == (300, 301)
    assert "logged steps (the run's own numbering): 301 -> canonical 300" in capsys.readouterr().err


def test_audit_replay_clears_a_logging_glitch_and_confirms_the_data_in_every_output(hf_cases, audited, looped):
    """``audit --replay`` writes findings.json, the summary and the report from the replayed evidence: the corrupted
    batch is confirmed as data, and the glitched step (its batch and the model clean) is cleared: replayed at
    checkpoint 100, the first one, 46 updates after the step (so no segment re-run), its batch lies within its
    same-bucket controls, so the cause and its events drop to ``info`` and its next step says nothing is to fix."""
    case, out = looped
    # before the replay the glitch is a critical cause of its own (the grad norm really rose at step 54)
    (before,) = [c for c in _read(audited / "findings.json")["causes"] if c["steps"] == [GLITCH_STEP]]
    assert (before["kind"], before["severity"]) == ("batch", "critical")
    f = _read(case / "findings.json")
    top = f["causes"][0]
    assert (top["kind"], top["severity"], top["replay"]["verdict"]) == ("batch", "critical", "data")
    assert "confirmed by replay: data" in out and "confirmed by replay" in f["verdict"]
    cleared = next(c for c in f["causes"] if (c.get("replay") or {}).get("verdict") == "normal")
    assert cleared["severity"] == "info" and cleared["steps"] == [GLITCH_STEP] and cleared["key"] == before["key"]
    rv = cleared["replay"]
    assert (rv["checkpoint_step"], rv["checkpoint"], rv["steps"]) == (100, "after", {str(GLITCH_STEP): "normal"})
    assert "cause_class" not in cleared  # no checkpoint before the step: nothing to re-run, so no class
    by = {d["step"]: d for d in _read(case / "replay" / "replay.json")["steps"]}
    # the replay compared the glitched loss the run logged, and ran no segment
    recorded = step_losses(hf_cases["static_corrupt"])[GLITCH_STEP]
    assert (
        by[GLITCH_STEP]["logged"] == pytest.approx(GLITCH_FACTOR * recorded, rel=1e-4)
        and "rerun" not in by[GLITCH_STEP]
    )
    assert {(s["metric"], s["severity"]) for s in f["spikes"] if s.get("cause") == cleared["id"]} == {
        ("loss", "info"),
        ("grad_norm", "info"),
    }
    cleared_next = "Replay clears step 54 (logged 55): the batch's loss lies within its same-bucket controls' spread"
    assert cleared["next_step"].startswith(cleared_next) and "nothing in these samples to fix" in cleared["next_step"]
    steps = out[out.index("next steps") :]
    assert "forensics replay" not in steps and "Replay confirms the data" in steps and cleared_next in steps
    assert "cleared by replay: normal at checkpoint 100 (after the step)" in out
    # the report's cards show the verdicts, and their next steps are the replayed ones
    html = (case / "report.html").read_text(encoding="utf-8")
    assert "Replay (forensics replay)" in html and "Replay confirms the data" in html
    card = html[html.index(f'id="cause-{cleared["id"]}"') :]
    card = card[: card.index("</article>")]
    assert '<span class="badge info">' in card and "Replay clears step 54 (logged 55)" in card
    assert f"<td>{GLITCH_STEP}</td><td><b>normal</b></td><td>100 (after)</td>" in card


def test_audit_replay_and_a_replay_after_the_audit_give_the_same_findings(looped, replayed):
    """Both re-run the causes from the checkpoints (they hold optimizer state), so both class the data cause; both
    clear the glitched step alike, which has no checkpoint before it to re-run from and so no class."""

    def told(path: Path) -> list:
        f = _read(path / "findings.json")
        return [f["verdict"].replace(str(path), "CASE")] + [
            (
                c["id"],
                c["key"],
                c["severity"],
                (c.get("replay") or {}).get("verdict"),
                c["next_step"].replace(str(path), "CASE"),
            )
            for c in f["causes"]
        ]

    assert told(looped[0]) == told(replayed[0])
    for case, _ in (looped, replayed):
        classes = [c.get("cause_class") for c in _read(case / "findings.json")["causes"] if c["kind"] == "batch"]
        assert classes == ["data", None], classes


def test_a_budget_too_small_lists_the_causes_it_did_not_replay(hf_cases, tmp_path, capsys):
    case = hf_cases["static_corrupt"].copy_to(tmp_path / "out")
    assert main(["audit", str(case), "--replay", "--replay-budget", "0.001", "--no-html"]) == 0
    f = _read(case / "findings.json")
    assert [g["steps"] for g in f["replay"]["not_replayed"]] == [[84, 189, 208]]
    assert not any(c.get("replay") for c in f["causes"])
    assert "not replayed: C1 (steps 84, 189, 208): the replay budget (0.001 s) was spent" in capsys.readouterr().out


def test_no_model_anywhere_is_one_line_naming_where_it_looked(audited, tmp_path, capsys):
    case = _copy(audited, tmp_path / "out")
    for config in case.glob("checkpoint-*/config.json"):
        config.unlink()
    assert main(["replay", str(case), "--steps", "300"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"found no config.json in {case} or {case}/checkpoint-N/" in err and "--model" in err


def test_a_model_folder_without_config_falls_back_to_a_checkpoint(audited, tmp_path, capsys):
    case = _copy(audited, tmp_path / "out")
    with open(case / "run.toml", "a", encoding="utf-8") as f:
        f.write('model = "."\n')  # what record() wrote before: the output folder, before trainer.save_model()
    assert main(["replay", str(case), "--steps", "300", "--no-control-step", "--no-probes", "--controls", "3"]) == 0
    assert "has no config.json (saved only by trainer.save_model())" in capsys.readouterr().err


# --- the demo proves itself --------------------------------------------------------------------------------------
def _commands(summary: str) -> list[str]:
    """The commands the summary's next steps print (between backticks)."""
    steps = summary[summary.index("next steps") :]
    return re.findall(r"`(forensics [^`]+)`", steps)


def test_demo_next_steps_run_as_printed_and_the_replay_proves_the_story(demo_small, tmp_path, monkeypatch, capsys):
    shutil.copytree(demo_small, tmp_path / "forensics-demo", symlinks=True)
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "--demo"]) == 0
    commands = _commands(capsys.readouterr().out)
    # one command per cause (each cause's first step and its return), each runnable as printed
    assert commands == [
        "forensics replay forensics-demo/static --steps 254,754",
        "forensics replay forensics-demo/static --steps 258,1107",
    ]
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, command
    by = {d["step"]: d for d in _read(tmp_path / "forensics-demo/static/replay/replay.json")["steps"]}
    assert by[254]["verdict"] == by[258]["verdict"] == "data"
    controls = [d for d in by.values() if d["role"] == "control"]
    assert controls and all(d["verdict"] == "normal" for d in controls)
    # the stand-in's own log is what replay compares with (the demo's metrics are simulated)
    assert by[254]["logged"] == pytest.approx(_stand_in_loss(tmp_path, 254), rel=1e-5)
    # and after the replay the audit's next steps no longer ask for it
    assert main(["audit", "--demo"]) == 0
    again = capsys.readouterr().out
    assert "confirmed by replay: data" in again
    skip = "forensics skip forensics-demo/static --format ids --min-severity warning -o skip.json"
    assert set(_commands(again)) == {skip}  # no replay asked again; the way to train without the samples instead
    assert main(shlex.split(skip)[1:]) == 0
    ids = json.loads((tmp_path / "skip.json").read_text())["sample_ids"]
    confirmed = [
        c
        for c in _read(tmp_path / "forensics-demo/static/findings.json")["causes"]
        if (c.get("replay") or {}).get("verdict") == "data"
    ]
    assert len(confirmed) == 2 and all(set(c["replay"]["samples"]) <= set(ids) for c in confirmed)


def _stand_in_loss(root: Path, step: int) -> float:
    for line in (root / "forensics-demo/static/replay-model/train_log.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] == step:
            return row["train/loss"]
    raise AssertionError(step)


def test_hf_run_shows_logged_steps_and_its_printed_replay_command_replays_the_step_it_names(audited, tmp_path, capsys):
    case = _copy(audited, tmp_path / "out")
    assert main(["audit", str(case), "--no-html"]) == 0
    summary = capsys.readouterr().out
    findings = _read(case / "findings.json")
    assert findings["run"]["logged_offset"] == 1
    spikes = findings["spikes"]
    assert spikes and all(s["logged_step"] == s["step"] + 1 for s in spikes)
    first = spikes[0]["step"]
    assert f"{first} (logged {first + 1})" in summary
    command = _commands(summary)[0]
    named = [int(s) for s in shlex.split(command)[shlex.split(command).index("--steps") + 1].split(",")]
    assert main(shlex.split(command)[1:]) == 0, command  # as printed
    capsys.readouterr()
    replayed = [d for d in _read(case / "replay/replay.json")["steps"] if d.get("role") != "control"]
    assert sorted(d["step"] for d in replayed) == sorted(named)
    assert all(d["logged_step"] == d["step"] + 1 for d in replayed)
