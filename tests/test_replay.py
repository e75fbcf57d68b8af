"""Replay on real runs: the tiny LM of fixtures/tiny_lm.py trained on CPU, with known causes for its spikes.

Three runs are trained once per session (~15 s together on one core): ``corrupt`` (12 samples of one short batch
overwritten with runs of token ids the run never uses; the batch recurs once per epoch), ``jolt`` (clean data,
the learning rate x20 for one update, a checkpoint right after it) and ``composition`` (clean one-cluster batches of
two clusters sharing token ids).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from fixtures.tiny_lm import JOLT_STEP, build_tiny_run, tiny_gpt  # noqa: E402
from forensics.cli import main  # noqa: E402
from forensics.replay import ReplayOptions, replay_case  # noqa: E402


@pytest.fixture(scope="session")
def corrupt_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny-corrupt")
    return out, build_tiny_run(out, "corrupt", seed=0, wandb=True)


@pytest.fixture(scope="session")
def jolt_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny-jolt")
    return out, build_tiny_run(out, "jolt", seed=0, wandb=False)


@pytest.fixture(scope="session")
def composition_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny-composition")
    return out, build_tiny_run(out, "composition", seed=0, wandb=False)


def _suspects(steps: list[dict]) -> list[dict]:
    """The replayed suspects (without the clean control step a replay adds)."""
    return [d for d in steps if d.get("role") != "control"]


def _copy_case(src: Path, dst: Path, **toml: object) -> Path:
    """A copy of a case without its checkpoints (run.toml points back at them), with run.toml keys replaced."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("samples.parquet", "plan.parquet", "metrics.jsonl"):
        shutil.copy(src / name, dst / name)
    lines = [
        ln
        for ln in (src / "run.toml").read_text().splitlines()
        if ln.split("=")[0].strip() not in toml and not ln.startswith("checkpoints")
    ]
    lines.append(f'checkpoints = "{src / "checkpoints"}"')
    lines += [f"{k} = {json.dumps(v)}" for k, v in toml.items()]
    (dst / "run.toml").write_text("\n".join(lines) + "\n")
    return dst


def test_corrupted_batch_gets_data_with_corrupted_samples_first(corrupt_run, tmp_path):
    case, labels = corrupt_run
    s = labels["corrupted_steps"][0]
    out = tmp_path / "r.json"
    assert main(["replay", str(case), "--steps", str(s), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc == json.loads((case / "replay" / "replay.json").read_text()) | {"steps": doc["steps"]}
    (d,) = _suspects(doc["steps"])
    assert d["verdict"] == "data", d["evidence"]
    (control,) = [x for x in doc["steps"] if x.get("role") == "control"]
    assert control["verdict"] == "normal" and control["control_of"] == s and control["bucket"] == d["bucket"]
    assert d["controls"]["z"] > 10
    assert all(e["z"] > 3 for e in d["earlier"]) and len(d["earlier"]) == 2
    bad = set(labels["corrupted_samples"])
    ranked = [x["sample_id"] for x in d["samples"]]
    assert set(ranked[: len(bad)]) == bad
    # leaving out the top (corrupted) sample lowers the batch loss; leaving all of them out makes it normal
    assert d["samples"][0]["leave_one_out"] < d["replayed"]
    assert set(d["leave_out"]["sample_ids"]) == bad and d["leave_out"]["z"] < 3
    top = d["samples"][0]["signals"]
    assert top["rare_token_share"] > 0.8 and top["repeat_run"] >= 4
    assert d["samples"][-1]["signals"]["rare_token_share"] == 0.0
    assert abs(d["replayed"] - d["logged"]) < 0.3 * d["logged"]
    # the gradient probe: the corrupted batch pulls far harder than its bucket
    assert d["gradient"]["z"] > 10 and d["gradient"]["suspect"] > 3 * max(d["gradient"]["controls"]["same_bucket"])
    assert d["determinism"] == {"max_abs_diff": 0.0, "equal": True}
    assert (case / "wandb").is_dir() and list((case / "wandb").glob("offline-run-*/run-*.wandb"))


def test_lr_jolt_gets_state(jolt_run):
    case, labels = jolt_run
    res = replay_case(case, ReplayOptions(steps=[labels["spike_step"]], probes=False))
    (d,) = _suspects(res.steps)
    assert d["checkpoint_step"] == JOLT_STEP + 1
    assert d["verdict"] == "state", d["evidence"]
    assert d["replayed"] == pytest.approx(d["logged"], rel=1e-4)
    assert d["replayed"] > 2 * d["earlier"][0]["replayed"]


def test_clean_steps_get_normal_and_later_replays_merge(corrupt_run):
    case, labels = corrupt_run
    normal = [20, 44, 52, 61]
    assert not set(normal) & set(labels["corrupted_steps"])
    res = replay_case(case, ReplayOptions(steps=normal, controls=4, probes=False, control_step=False))
    by = {d["step"]: d for d in res.steps}
    assert [by[s]["verdict"] for s in normal] == ["normal"] * 4, [d["evidence"] for d in res.steps]
    d = by[20]
    assert d["replayed"] == pytest.approx(d["logged"], rel=1e-4)  # checkpoint 20 is the step's own state
    assert abs(d["controls"]["z"]) < 3 and len(d["controls"]["same_bucket"]) == 4
    assert len(d["controls"]["other_buckets"]) == 4
    assert by[44]["checkpoint_step"] == 40 and by[44]["calibration"]  # 4 updates away: tolerance measured
    merged = json.loads((case / "replay" / "replay.json").read_text())
    assert set(normal) <= {x["step"] for x in merged["steps"]}


def test_metrics_shifted_by_one_step_get_misaligned(corrupt_run, tmp_path):
    case, labels = corrupt_run
    shifted = _copy_case(case, tmp_path / "shifted", step_offset=-1)  # metrics step = logged step + 1
    s = labels["corrupted_steps"][0] + 1
    res = replay_case(shifted, ReplayOptions(steps=[s], probes=False, control_step=False))
    (d,) = res.steps
    assert d["verdict"] == "misaligned", d["evidence"]
    assert d["neighbours"]["-1"] == pytest.approx(d["logged"], rel=0.1)
    assert any("step_offset = 0" in e for e in d["evidence"])


def test_from_findings_reads_loss_spikes(corrupt_run, tmp_path):
    case, labels = corrupt_run
    c = _copy_case(case, tmp_path / "c")
    s = labels["corrupted_steps"][1]
    (c / "findings.json").write_text(
        json.dumps(
            {
                "run": {"loss_key": "train/loss"},
                "spikes": [{"metric": "train/loss", "peak_step": s}, {"metric": "grad_norm", "peak_step": 3}],
            }
        )
    )
    res = replay_case(c, ReplayOptions(from_findings=True, controls=3, control_step=False))
    assert [d["step"] for d in res.steps] == [s] and not res.warnings
    assert res.steps[0]["verdict"] == "data"
    # no loss spike (the loss detector's history window can hide one): the other spikes' peaks, with a warning
    (c / "findings.json").write_text(json.dumps({"spikes": [{"metric": "grad_norm", "peak_step": s}]}))
    res = replay_case(c, ReplayOptions(from_findings=True, controls=3, probes=False, control_step=False))
    assert [d["step"] for d in res.steps] == [s]


def test_mismatched_checkpoint_is_exit_2_naming_keys(corrupt_run, tmp_path, capsys):
    case, _ = corrupt_run
    state = tiny_gpt().state_dict()
    state["extra.weight"] = state.pop("ln.weight")
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save(state, ck / "step_20.pt")
    assert main(["replay", str(case), "--steps", "20", "--checkpoints", str(ck)]) == 2
    err = capsys.readouterr().err
    assert "missing keys ln.weight" in err and "unexpected keys extra.weight" in err
    assert len(err.strip().splitlines()) == 1


def test_pickled_object_checkpoint_is_refused(corrupt_run, tmp_path, capsys):
    case, _ = corrupt_run
    ck = tmp_path / "ck"
    ck.mkdir()
    torch.save(torch.nn.Linear(2, 2), ck / "step_20.pt")  # a whole module: unpickling it would run code
    assert main(["replay", str(case), "--steps", "20", "--checkpoints", str(ck)]) == 2
    err = capsys.readouterr().err
    assert "pickled object" in err and "weights_only=True" in err


def test_safetensors_checkpoints_and_npy_tokens_replay_the_same(corrupt_run, tmp_path):
    """The same states as .safetensors files with a manifest, and the tokens as a flat .npy with offsets."""
    import numpy as np
    import pandas as pd
    from safetensors.torch import save_file

    case, labels = corrupt_run
    ck = tmp_path / "st"
    ck.mkdir()
    entries = []
    for step in (15, 20):
        sd = torch.load(case / "checkpoints" / f"step_{step:06d}.pt", weights_only=True)["model"]
        sd = {k: v for k, v in sd.items() if k != "head.weight"}  # tied to tok.weight, saved once as HF does
        save_file(sd, ck / f"weights-{step}-final.safetensors")
        entries.append({"path": f"weights-{step}-final.safetensors", "step": step})
    (ck / "manifest.json").write_text(json.dumps({"checkpoints": entries}))
    samples = pd.read_parquet(case / "samples.parquet")
    flat = np.concatenate([np.asarray(t, dtype=np.int32) for t in samples["input_ids"]])
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in samples["input_ids"]])])
    np.save(tmp_path / "tok.npy", flat)
    np.save(tmp_path / "tok.offsets.npy", offsets)
    a = replay_case(
        case,
        ReplayOptions(
            steps=[20], controls=3, earlier=1, probes=False, control_step=False, json_path=str(tmp_path / "a.json")
        ),
    )
    b = replay_case(
        case,
        ReplayOptions(
            steps=[20],
            controls=3,
            earlier=1,
            control_step=False,
            checkpoints=str(ck),
            probes=False,
            tokens=str(tmp_path / "tok.npy"),
            max_tokens_per_forward=64,
        ),
    )
    assert b.steps[0]["replayed"] == pytest.approx(a.steps[0]["replayed"], rel=1e-5)
    assert b.steps[0]["earlier"][0]["checkpoint_step"] == 15
    assert b.forwards > a.forwards  # 64 tokens per forward splits every batch


def test_one_cluster_update_gets_composition(composition_run):
    case, _ = composition_run
    res = replay_case(case, ReplayOptions(steps=[60], controls=4, control_step=False))
    (d,) = res.steps
    assert d["verdict"] == "composition", d["evidence"]
    probe = d["update_probe"]
    assert set(probe["per_cluster"]) == {"0", "1"}
    # the batch holds cluster 1 only; one update on it hurts cluster 0 far more than a mixed update does
    assert probe["per_cluster"]["0"] > 0.03 and probe["per_cluster"]["0"] > 3 * probe["mixed"]["0"]
    assert "leave_out" not in d and abs(d["controls"]["z"]) < 3


def test_unseeded_dropout_gets_nondeterministic(corrupt_run, tmp_path):
    case, labels = corrupt_run
    c = _copy_case(case, tmp_path / "drop", model="fixtures.tiny_lm:tiny_gpt_unseeded")
    res = replay_case(
        c,
        ReplayOptions(steps=[labels["corrupted_steps"][0]], controls=3, mode="train", probes=False, control_step=False),
    )
    (d,) = res.steps
    assert d["verdict"] == "nondeterministic", d["evidence"]
    assert d["determinism"]["equal"] is False and d["determinism"]["max_abs_diff"] > 1e-3
    assert d["mode"] == "train" and d["seeds"] == [0, 1, 2] and d["spread"] > 0


def test_bf16_second_dtype_agrees_within_tolerance(corrupt_run):
    case, _ = corrupt_run
    res = replay_case(
        case,
        ReplayOptions(steps=[20], controls=3, earlier=0, second_dtype="bfloat16", probes=False, control_step=False),
    )
    second = res.steps[0]["determinism"]["second"]
    assert second["dtype"] == "bfloat16" and 0 < second["max_abs_diff"] < 0.1 and second["equal"] is True


def test_dcp_checkpoint_replays_like_the_pt(corrupt_run, tmp_path):
    import torch.distributed.checkpoint as dcp

    case, _ = corrupt_run
    for step in (15, 20):
        sd = torch.load(case / "checkpoints" / f"step_{step:06d}.pt", weights_only=True)
        dcp.save({"model": sd["model"]}, checkpoint_id=str(tmp_path / "dcp" / f"step_{step}"))
    a = replay_case(case, ReplayOptions(steps=[20], controls=3, earlier=1, probes=False, control_step=False))
    b = replay_case(
        case,
        ReplayOptions(
            steps=[20], controls=3, earlier=1, probes=False, control_step=False, checkpoints=str(tmp_path / "dcp")
        ),
    )
    assert b.steps[0]["replayed"] == a.steps[0]["replayed"]
    assert b.steps[0]["earlier"] == a.steps[0]["earlier"]
