"""The plan recorder inside real torch DataLoader loops, killed and resumed, and read while it writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.plan.builders import bucketed_shuffle
from forensics.plan.rebuild import rebuild_plan, resolve_builder
from forensics.plan.recorder import PlanRecorder, recorded_parts
from forensics.plan.step_mapping import assign_steps, batches_to_plan
from forensics.schema import load_plan
from forensics.tagging import batch_gap_warnings

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler, Sampler  # noqa: E402

from forensics.plan.recorder import RecordingSampler  # noqa: E402

KEY = ["epoch", "batch_id", "sample_id"]


def _samples(n: int = 160, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {"sample_id": np.arange(n, dtype=np.int64), "n_tokens": rng.integers(20, 4000, n).astype(np.int32)}
    )


class _IdDataset(torch.utils.data.Dataset):
    """Returns each sample's id, so the loop can check what it consumed."""

    def __init__(self, ids):
        self.ids = list(ids)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return self.ids[i]


class _BuilderBatchSampler(Sampler):
    """A trainer's batch sampler that calls a builder each epoch (samples are indexed by position)."""

    def __init__(self, samples, seed=0, **params):
        self.samples, self.seed, self.params, self.epoch = samples, seed, params, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        yield from bucketed_shuffle(self.samples, self.epoch, self.seed, **self.params)

    def __len__(self):
        return len(bucketed_shuffle(self.samples, self.epoch, self.seed, **self.params))


def test_recorded_plan_of_a_dataloader_loop_equals_the_rebuilt_plan(tmp_path):
    samples = _samples()
    rec = PlanRecorder(tmp_path / "plan", flush_every=7)
    sampler = RecordingSampler(_BuilderBatchSampler(samples, seed=3, token_budget=8192), rec)
    loader = DataLoader(_IdDataset(samples["sample_id"]), batch_sampler=sampler)
    consumed = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for b, batch in enumerate(loader):
            consumed.append(pd.DataFrame({"epoch": epoch, "batch_id": b, "sample_id": batch.numpy()}))
    rec.close()
    recorded = load_plan(tmp_path / "plan")
    rebuilt = rebuild_plan(samples, resolve_builder("bucketed_shuffle", token_budget=8192), epochs=3, seed=3)
    pd.testing.assert_frame_equal(recorded[KEY], rebuilt[KEY])
    pd.testing.assert_frame_equal(recorded[KEY], pd.concat(consumed, ignore_index=True)[KEY], check_dtype=False)
    assert recorded["batch_id"].max() > 10  # several parts' worth of batches (flush_every=7)
    assert len(recorded_parts(tmp_path / "plan")) > 3


def test_two_ranks_with_distributed_sampler_match_the_sampler_logic_and_map_per_rank(tmp_path):
    # 22 samples on 2 ranks: 11 indices per rank, batches of 4 -> 3 batches (4, 4, 3) per rank and epoch.
    n, batch_size, epochs = 22, 4, 2
    ids = 1000 + np.arange(n)  # sample ids differ from dataset indices
    dataset = _IdDataset(ids)
    for rank in (0, 1):
        rec = PlanRecorder(tmp_path / "plan", rank=rank, flush_every=2)
        sampler = RecordingSampler(
            DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=5),
            rec,
            batch_size=batch_size,
            sample_ids=ids,
        )
        loader = DataLoader(dataset, sampler=sampler, batch_size=batch_size)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for _ in loader:
                pass
        rec.close()
    recorded = load_plan(tmp_path / "plan").sort_values(["rank", "epoch", "batch_id"], kind="stable")

    expected = []
    for rank in (0, 1):
        for epoch in range(epochs):
            ds = DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True, seed=5)
            ds.set_epoch(epoch)
            order = list(ds)
            batches = [[int(ids[i]) for i in order[k : k + batch_size]] for k in range(0, len(order), batch_size)]
            expected.append(batches_to_plan([batches], first_epoch=epoch).assign(rank=rank))
    expected = pd.concat(expected, ignore_index=True)
    cols = ["rank", "epoch", "batch_id", "sample_id"]
    pd.testing.assert_frame_equal(recorded[cols].reset_index(drop=True), expected[cols])

    steps = assign_steps(recorded, grad_accum=2, world_size=2, rank_split="per_rank")
    # per rank and epoch: batches j=0,1 -> one step (8 samples), j=2 -> a partial step (3 samples); 2 ranks
    assert steps.groupby("step").size().tolist() == [16, 6, 16, 6]
    assert steps.groupby("step")["epoch"].first().tolist() == [0, 0, 1, 1]


def test_single_index_sampler_with_drop_last_records_only_full_batches(tmp_path):
    dataset = _IdDataset(range(10))
    rec = PlanRecorder(tmp_path / "plan")
    sampler = RecordingSampler(torch.utils.data.SequentialSampler(dataset), rec, batch_size=4, drop_last=True)
    got = [b.tolist() for b in DataLoader(dataset, sampler=sampler, batch_size=4, drop_last=True)]
    rec.close()
    plan = load_plan(tmp_path / "plan")
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert plan.groupby("batch_id")["sample_id"].apply(list).tolist() == got


_CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from forensics.plan.recorder import PlanRecorder
    rec = PlanRecorder(sys.argv[1], flush_every=5)
    for epoch in range(3):
        for b, batch in enumerate(np.random.default_rng([7, epoch]).permutation(60).reshape(15, 4)):
            rec.record(batch, epoch=epoch, batch_id=b)
            print(epoch, b, flush=True)
            sys.stdin.readline()  # the training step: the parent decides when it ends (or kills the run in it)
""")


def _expected_batches() -> pd.DataFrame:
    per_epoch = [np.random.default_rng([7, e]).permutation(60).reshape(15, 4).tolist() for e in range(3)]
    return batches_to_plan(per_epoch)


def _kill_after(folder: Path, n_batches: int) -> int:
    """Run the child recorder, SIGKILL it once it has recorded ``n_batches``; return how many it had printed."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    seen = 0
    try:
        for _ in child.stdout:
            seen += 1
            if seen >= n_batches:
                os.kill(child.pid, signal.SIGKILL)  # mid-step: batch n_batches is recorded, not yet flushed
                break
            child.stdin.write("\n")
            child.stdin.flush()
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    return seen


def test_killed_recorder_loses_only_its_unflushed_part_and_a_resume_neither_loses_nor_duplicates(tmp_path):
    folder = tmp_path / "plan"
    printed = _kill_after(folder, 23)  # killed in epoch 1 (15 batches per epoch)
    expected = _expected_batches()
    survived = load_plan(folder)
    n_batches = survived[["epoch", "batch_id"]].drop_duplicates().shape[0]
    # only whole parts of 5 batches survive (3 unflushed batches are lost), and they are the plan's prefix
    assert printed == 23 and n_batches == 20
    pd.testing.assert_frame_equal(survived[KEY], expected[KEY].iloc[: 4 * n_batches].reset_index(drop=True))
    assert not list(folder.glob("*.tmp"))  # no half-written part is left visible

    with pytest.raises(FileExistsError):
        PlanRecorder(folder)  # a new run must not mix with the old one
    # the trainer resumes from its checkpoint at the start of epoch 1 and replays that epoch
    rec = PlanRecorder(folder, flush_every=5, resume=True)
    assert rec.last_recorded == (1, n_batches - 16)
    for epoch in (1, 2):
        for b, batch in enumerate(np.random.default_rng([7, epoch]).permutation(60).reshape(15, 4)):
            rec.record(batch, epoch=epoch, batch_id=b)
    rec.close()
    assert rec.skipped == n_batches - 15
    final = load_plan(folder)
    pd.testing.assert_frame_equal(final[KEY], expected[KEY])
    assert not final.duplicated().any()
    assert batch_gap_warnings(final) == []


def test_resume_past_the_lost_part_is_reported_as_a_gap(tmp_path):
    folder = tmp_path / "plan"
    printed = _kill_after(folder, 24)  # the trainer consumed 24 batches: 15 of epoch 0, 9 of epoch 1
    flushed = load_plan(folder)[["epoch", "batch_id"]].drop_duplicates().shape[0]
    rec = PlanRecorder(folder, resume=True)
    rec.set_epoch(1, first_batch=printed - 15)  # its checkpoint is after the last consumed batch
    for batch in np.random.default_rng([7, 1]).permutation(60).reshape(15, 4)[printed - 15 :]:
        rec.record(batch)
    rec.close()
    plan = load_plan(folder)
    lost = set(range(flushed - 15, printed - 15))
    assert set(plan.loc[plan["epoch"] == 1, "batch_id"]) == set(range(15)) - lost
    assert lost == {5, 6, 7, 8}
    assert batch_gap_warnings(plan) == [
        f"plan: epoch 1 misses batch ids {min(lost)}-{max(lost)} (lost by a crashed recorder?)"
    ]


def test_parts_are_readable_while_the_run_goes_on(tmp_path):
    folder = tmp_path / "plan"
    rec = PlanRecorder(folder, flush_every=4, flush_seconds=3600)
    for b in range(10):
        rec.record([2 * b, 2 * b + 1])
    (folder / "part-000099.parquet.tmp").write_bytes(b"half a part")  # a writer mid-flush is invisible to readers
    live = load_plan(folder)
    assert live["batch_id"].max() == 7 and len(live) == 16 and rec.pending == 2
    rec.close()
    assert len(load_plan(folder)) == 20


def test_time_based_flush_writes_a_part_per_batch_when_due(tmp_path):
    rec = PlanRecorder(tmp_path / "plan", flush_every=1000, flush_seconds=0)
    for b in range(3):
        rec.record([b], step=b, micro=0)
    assert len(recorded_parts(tmp_path / "plan")) == 3
    plan = load_plan(tmp_path / "plan")
    assert plan["step"].tolist() == [0, 1, 2] and plan["micro"].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="every batch or for none"):
        rec.record([5])
    rec.close()
    with pytest.raises(RuntimeError, match="closed"):
        rec.record([6], step=3, micro=0)


def test_garbage_collected_recorder_flushes_its_buffer(tmp_path):
    rec = PlanRecorder(tmp_path / "plan", flush_every=100)
    rec.record([1, 2, 3])
    del rec
    assert load_plan(tmp_path / "plan")["sample_id"].tolist() == [1, 2, 3]


def test_recorder_module_imports_and_records_without_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # torch cannot be imported
        from forensics.plan.recorder import PlanRecorder
        with PlanRecorder({str(tmp_path / "plan")!r}) as rec:
            rec.record([4, 5])
        from forensics.plan.recorder import RecordingSampler  # the name imports; building one needs torch
        try:
            RecordingSampler([[0, 1]], rec)
        except ImportError:
            print("no torch sampler")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no torch sampler"
    assert load_plan(tmp_path / "plan")["sample_id"].tolist() == [4, 5]
