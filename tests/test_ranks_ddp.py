"""A spike planted on one rank's micro-batch of a real 2-process run is named by its rank and micro-batch.

torchrun with 2 CPU processes (DDP over gloo) trains the tiny GPT-2 of ``fixtures/`` with ``record()``; each rank
logs its own loss (``metrics-rank{R}.jsonl``, a ``rank`` column), and rank 1's micro-batch 0 of step 45 holds two
corrupted rows (``fixtures/hf_ddp_spike.py``). Built once per test session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.hf_ddp_spike import SPIKE_MICRO, SPIKE_RANK, SPIKE_STEP, rows
from forensics.cli import main
from forensics.schema import load_plan, load_samples

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def ddp_spike_run(tmp_path_factory, repo_root) -> Path:
    out = tmp_path_factory.mktemp("ddp_spike")
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(repo_root), os.environ.get("PYTHONPATH", "")]),
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "fixtures.hf_ddp_spike", str(out)]
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _case(run: Path, tmp_path: Path, metrics_line: str) -> Path:
    """A copy of the run's case folder whose run.toml names ``metrics_line`` as its metrics."""
    case = tmp_path / "case"
    shutil.copytree(run, case)
    text = (case / "run.toml").read_text(encoding="utf-8").splitlines()
    (case / "run.toml").write_text(
        "\n".join(metrics_line if line.startswith("metrics =") else line for line in text) + "\n", encoding="utf-8"
    )
    return case


def test_the_planted_rows_are_on_the_named_rank_and_micro_batch(ddp_spike_run):
    """The run's truth, observed by compute_loss and recorded in the plan: the planted rows went to rank 1's
    micro-batch 0 of step 45, nowhere else."""
    train, planted = rows()
    observed = json.loads((ddp_spike_run / f"observed-{SPIKE_RANK}.json").read_text())
    at_step = [o["rows"] for o in observed if o["step"] == SPIKE_STEP]
    assert at_step[SPIKE_MICRO] == [train[i]["input_ids"] for i in planted]
    samples = load_samples(ddp_spike_run / "samples.parquet")
    plan = load_plan(ddp_spike_run / "plan", samples)
    bad = plan[plan["sample_id"].isin(planted)]
    assert bad[["step", "micro", "rank"]].drop_duplicates().values.tolist() == [[SPIKE_STEP, SPIKE_MICRO, SPIKE_RANK]]


def test_a_spike_on_one_rank_names_the_rank_and_its_micro_batch(ddp_spike_run, tmp_path):
    """Per-rank logs with a ``rank`` column beside the Trainer's averaged loss: the one loss spike is at step 45,
    on rank 1 only, and the plan's rank 1 micro-batch 0 (the planted rows) is named first."""
    _, planted = rows()
    case = _case(
        ddp_spike_run,
        tmp_path,
        'metrics = ["trainer_state.json", "metrics-rank0.jsonl", "metrics-rank1.jsonl"]',
    )
    assert main(["audit", str(case), "--json", str(tmp_path / "f.json"), "--no-html"]) == 0
    found = json.loads((tmp_path / "f.json").read_text())
    spikes = [s for s in found["spikes"] if s["metric"] == "loss"]
    assert [(s["step"], s["ranks"]) for s in spikes] == [(SPIKE_STEP, [SPIKE_RANK])]
    first = spikes[0]["details"]["rank_batches"][0]
    assert first == {"rank": SPIKE_RANK, "micro": SPIKE_MICRO, "sample_ids": planted}
    assert f"rank {SPIKE_RANK} micro-batch {SPIKE_MICRO} samples {planted[0]}, {planted[1]}" in " ".join(
        spikes[0]["evidence"]
    )
    cause = next(c for c in found["causes"] if c["id"] == spikes[0]["cause"])
    assert cause["details"]["ranks"] == [SPIKE_RANK]
    assert cause["details"]["rank_batch"] == {"rank": SPIKE_RANK, "micro": SPIKE_MICRO, "sample_ids": planted}
    assert cause["summary"].endswith(
        f"On rank {SPIKE_RANK} only; rank {SPIKE_RANK}'s micro-batch {SPIKE_MICRO} held samples "
        f"{planted[0]}, {planted[1]}."
    )


def test_per_rank_logs_named_in_ranks_name_the_same_rank(ddp_spike_run, tmp_path):
    """The same per-rank logs without their ``rank`` column, named in run.toml ``ranks`` (entry i is rank i): the
    loss spike is on rank 1 only, as with the column."""
    case = _case(ddp_spike_run, tmp_path, 'metrics = ["trainer_state.json"]\nranks = ["own-0.jsonl", "own-1.jsonl"]')
    for rank in (0, 1):
        lines = (case / f"metrics-rank{rank}.jsonl").read_text().splitlines()
        own = [json.dumps({k: v for k, v in json.loads(line).items() if k != "rank"}) for line in lines]
        (case / f"own-{rank}.jsonl").write_text("\n".join(own) + "\n", encoding="utf-8")
        (case / f"metrics-rank{rank}.jsonl").unlink()
    assert main(["audit", str(case), "--json", str(tmp_path / "f.json"), "--no-html"]) == 0
    found = json.loads((tmp_path / "f.json").read_text())
    spikes = [s for s in found["spikes"] if s["metric"] == "loss"]
    assert [(s["step"], s["ranks"]) for s in spikes] == [(SPIKE_STEP, [SPIKE_RANK])]
    assert spikes[0]["details"]["rank_batches"][0]["micro"] == SPIKE_MICRO
