"""forensics.integrations.hf.record on real Hugging Face Trainer runs (tiny random GPT-2 on CPU, fixtures/hf_runs.py).

The fixture's Trainer subclass observes what compute_loss received (never records); each test compares the case
folder that record() wrote with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.errors import ForensicsError
from forensics.plan.rewinds import read_rewinds
from forensics.schema import load_plan, load_samples

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytest.importorskip("transformers")
pytest.importorskip("wandb")
pytest.importorskip("tensorboard")


def _plan(run) -> pd.DataFrame:
    samples = load_samples(run.out / "samples.parquet")
    return load_plan(run.out / "plan", samples)


def _recorded_batches(run) -> list[tuple[int, int, list[int]]]:
    """(step, micro, sample ids) per recorded micro-batch, in plan order."""
    plan = _plan(run)
    out = []
    for (step, micro), group in plan.groupby(["step", "micro"], sort=True):
        out.append((int(step), int(micro), group["sample_id"].tolist()))
    return out


def _tokens(run) -> dict[int, list[int]]:
    samples = load_samples(run.out / "samples.parquet")
    return {int(i): [int(t) for t in ids] for i, ids in zip(samples["sample_id"], samples["input_ids"])}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["static", "grouped", "accum2", "logging5"])
def test_recorded_plan_is_what_compute_loss_received(runs, name):
    run = runs[name]
    tokens = _tokens(run)
    recorded = _recorded_batches(run)
    assert len(recorded) == len(run.observed)
    for (step, _micro, ids), seen in zip(recorded, run.observed):
        assert step == seen["step"]
        assert [tokens[i] for i in ids] == seen["rows"]


@pytest.mark.slow
def test_grad_accum_2_records_two_micro_batches_per_step(runs):
    run = runs["accum2"]
    plan = _plan(run)
    micro = plan.groupby("step")["micro"].unique()
    assert len(micro) == 30  # 20 batches an epoch, 2 per update, 3 epochs
    assert all(sorted(m.tolist()) == [0, 1] for m in micro)
    assert plan.groupby(["step", "micro"]).size().eq(8).all()
    assert plan.groupby("epoch")["batch_id"].agg(["min", "max", "nunique"]).values.tolist() == [[0, 19, 20]] * 3
    assert plan.groupby("epoch")["step"].agg(["min", "max"]).values.tolist() == [[0, 9], [10, 19], [20, 29]]


@pytest.mark.slow
def test_resumed_run_continues_the_same_plan(runs):
    run = runs["resumed"]
    plan = _plan(run)
    assert sorted(plan["step"].unique().tolist()) == list(range(60))
    assert plan.groupby("step").size().eq(8).all()  # no step recorded twice, none missing
    assert plan.groupby("epoch")["batch_id"].agg(["min", "max", "nunique"]).values.tolist() == [[0, 19, 20]] * 3
    first = {o["step"]: o["rows"] for o in run.observed if not o.get("resumed")}
    second = {o["step"]: o["rows"] for o in run.observed if o.get("resumed")}
    assert sorted(first) == list(range(50)) and sorted(second) == list(range(40, 60))
    # the resumed run trains steps 40-49 again: the plan keeps its batches (the last consumption wins), once
    tokens = _tokens(run)
    by_step = {s: [tokens[i] for i in g["sample_id"]] for s, g in plan.groupby("step")}
    assert all(by_step[s] == second[s] for s in range(40, 60))
    assert all(by_step[s] == first[s] for s in range(40))
    assert read_rewinds(run.out / "plan") == [
        {
            "rank": None,
            "last_step": 49,
            "resumed_at": 40,
            "rows_replaced": 80,
            "sampler": {"epoch": 2, "batch_id": 0, "skipped_data": True},
        }
    ]
    cfg = tomllib.loads((run.out / "run.toml").read_text())
    assert len([m for m in cfg["metrics"] if m.startswith("runs/")]) == 2
    assert len([m for m in cfg["metrics"] if m.startswith("wandb/")]) == 2
    assert len(run.tensorboard_runs) == 2 and len(run.wandb_runs) == 2


@pytest.mark.slow
def test_samples_parquet_holds_the_train_dataset(runs):
    from fixtures.hf_runs import make_samples

    run = runs["static"]
    rows = make_samples()
    samples = load_samples(run.out / "samples.parquet")
    assert samples["sample_id"].tolist() == list(range(160))
    assert samples["n_tokens"].tolist() == [len(r["input_ids"]) for r in rows]
    assert [list(x) for x in samples["input_ids"]] == [r["input_ids"] for r in rows]
    assert samples["text"].tolist() == [r["text"] for r in rows]
    assert samples["source"].value_counts().to_dict()["scrape"] == 6


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "logging_steps", "grad_accum"), [("static", 1, 1), ("accum2", 1, 2), ("logging5", 5, 1)]
)
def test_run_toml_names_the_sources_and_settings(runs, name, logging_steps, grad_accum):
    run = runs[name]
    cfg = tomllib.loads((run.out / "run.toml").read_text())
    assert cfg["metrics"][0] == "trainer_state.json"
    assert [m.split("/")[0] for m in cfg["metrics"]] == ["trainer_state.json", "runs", "wandb"]
    assert all((run.out / m).exists() for m in cfg["metrics"])
    assert (cfg["plan"], cfg["samples"], cfg["step_convention"]) == ("plan", "samples.parquet", "hf-trainer")
    assert (cfg["logging_steps"], cfg["grad_accum"], cfg["world_size"]) == (logging_steps, grad_accum, 1)
    # a model built in code has no folder to name: replay takes it from the checkpoints, which carry their config
    assert "model" not in cfg and cfg["checkpoints"] == "." and cfg["max_grad_norm"] == 1.0
    assert (run.out / "checkpoint-20" / "config.json").exists()
    assert "step_offset" not in cfg and "boundaries" not in cfg  # recognised per source; fitted to the samples


@pytest.mark.slow
def test_corrupted_batch_is_the_spike_at_its_zero_based_step(runs):
    """The recorded step holding the six corrupted rows is, in each epoch, the highest loss once trainer_state.json
    is aligned (HF logs step s+1 for update s)."""
    from forensics.sources.step_conventions import aligned_table

    run = runs["static"]
    plan = _plan(run)
    corrupt_steps = sorted(plan[plan["sample_id"].isin(run.corrupt_ids)]["step"].unique().tolist())
    assert len(corrupt_steps) == 5  # one static batch, once per epoch
    assert (
        plan[plan["step"].isin(corrupt_steps)]
        .groupby("step")["sample_id"]
        .apply(lambda s: int(s.isin(run.corrupt_ids).sum()))
        .tolist()
        == [6] * 5
    )
    table, convention = aligned_table(run.out / "trainer_state.json")
    assert convention.step_offset == 1
    loss = table.set_index("step")["loss"].dropna()
    for epoch, step in enumerate(corrupt_steps):
        if epoch == 0 and step < 8:
            continue  # still learning: everything is high
        in_epoch = loss.loc[epoch * 20 : epoch * 20 + 19]
        assert in_epoch.idxmax() == step
        assert loss[step] > np.median(in_epoch) + 0.5


def _tiny_trainer(out: Path, rows, report_to="none", **args):
    from transformers import Trainer, TrainingArguments

    from fixtures.hf_runs import ListDataset, _model, collate

    targs = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=4,
        max_steps=2,
        report_to=report_to,
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        **args,
    )
    return Trainer(
        model=_model(),
        args=targs,
        train_dataset=rows if not isinstance(rows, list) else ListDataset(rows),
        data_collator=collate,
    )


def test_a_fresh_run_over_an_earlier_plan_is_refused(tmp_path):
    from fixtures.hf_runs import make_samples
    from forensics.integrations.hf import record

    rows = make_samples()[:16]
    trainer = _tiny_trainer(tmp_path, rows)
    record(trainer)
    trainer.train()
    assert len(_plan_rows(tmp_path)) == 8
    again = _tiny_trainer(tmp_path, rows)
    record(again)
    with pytest.raises(ForensicsError, match="already holds the plan of an earlier run"):
        again.train()
    with pytest.raises(ForensicsError, match="already being recorded"):
        record(again)


def _plan_rows(folder: Path) -> pd.DataFrame:
    return load_plan(folder / "plan")


def test_a_dataset_id_column_becomes_the_sample_id(tmp_path):
    from fixtures.hf_runs import make_samples
    from forensics.integrations.hf import record

    rows = [dict(r, sample_id=1000 + 7 * i) for i, r in enumerate(make_samples()[:16])]
    trainer = _tiny_trainer(tmp_path, rows)
    record(trainer)
    trainer.train()
    samples = load_samples(tmp_path / "samples.parquet")
    assert samples["sample_id"].tolist() == [1000 + 7 * i for i in range(16)]
    plan = load_plan(tmp_path / "plan", samples)
    assert plan["sample_id"].isin(samples["sample_id"]).all() and len(plan) == 8


def test_datasets_it_cannot_record_are_refused_before_training(tmp_path):
    from fixtures.hf_runs import make_samples
    from forensics.integrations.hf import record

    class Pairs:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return ([1, 2, 3], [1, 2, 3])

    with pytest.raises(ForensicsError, match="not dicts"):
        record(_tiny_trainer(tmp_path, Pairs()))
    no_ids = [{"labels": r["input_ids"]} for r in make_samples()[:4]]
    with pytest.raises(ForensicsError, match="no 'input_ids'"):
        record(_tiny_trainer(tmp_path, no_ids))
    dup = [dict(r, sample_id=1) for r in make_samples()[:4]]
    with pytest.raises(ForensicsError, match="duplicate ids"):
        record(_tiny_trainer(tmp_path, dup))


def test_import_needs_no_framework():
    import subprocess

    code = (
        "import sys, forensics.integrations, forensics.integrations.hf, forensics.integrations.lightning, "
        "forensics.integrations.torch, forensics.sources.step_conventions; "
        "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hf_datasets_tokenizer_and_prefetching_workers(tmp_path):
    """A run as users write it: a datasets.Dataset tokenized by a tokenizer (built locally), HF's LM collator,
    2 prefetching loader workers, group_by_length, grad accumulation 2 with a partial last group, and the text
    column dropped by remove_unused_columns: the plan is still exactly what compute_loss received."""
    datasets = pytest.importorskip("datasets")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import (
        DataCollatorForLanguageModeling,
        GPT2Config,
        GPT2LMHeadModel,
        PreTrainedTokenizerFast,
        Trainer,
        TrainingArguments,
    )

    from forensics.integrations.hf import record

    rng = np.random.default_rng(0)
    words = "the cat sat on a mat dog ran far away big small red blue green code def return print loop".split()
    texts = [" ".join(rng.choice(words, size=int(rng.integers(3, 30)))) for _ in range(120)]
    core = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")
    ds = datasets.Dataset.from_dict({"text": texts, "source": ["qa" if i % 3 else "code" for i in range(120)]})
    ds = ds.map(lambda b: tok(b["text"]), batched=True)

    class Observing(Trainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            kept = [ids[i][mask[i] == 1].tolist() for i in range(len(ids))]
            self.observed.append((int(self.state.global_step), kept))
            return super().compute_loss(model, inputs, *args, **kwargs)

    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=tok.vocab_size,
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=2,
            pad_token_id=tok.pad_token_id,
            bos_token_id=2,
            eos_token_id=2,
        )
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_train_epochs=2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=3,
        train_sampling_strategy="group_by_length",
        dataloader_num_workers=2,
        gradient_accumulation_steps=2,
    )
    trainer = Observing(
        model=model,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
    )
    trainer.observed = []
    record(trainer)
    trainer.train()
    samples = load_samples(tmp_path / "samples.parquet")
    assert samples["text"].tolist() == texts and samples["source"].tolist() == ds["source"]
    assert samples["n_tokens"].tolist() == [len(t.split()) for t in texts]
    tokens = {int(i): [int(t) for t in ids] for i, ids in zip(samples["sample_id"], samples["input_ids"])}
    plan = load_plan(tmp_path / "plan", samples)
    recorded = [(int(s), [tokens[i] for i in g["sample_id"]]) for (s, _m), g in plan.groupby(["step", "micro"])]
    assert recorded == trainer.observed
    assert plan["step"].nunique() == 16  # 15 batches an epoch: 7 full updates and one of a single micro-batch
    assert plan.groupby("epoch")["batch_id"].nunique().tolist() == [15, 15]


@pytest.mark.slow
def test_two_processes_each_record_what_their_compute_loss_received(tmp_path, repo_root):
    """torchrun with 2 CPU processes (DDP over gloo): accelerate shards the batches; each rank's parts hold exactly
    its own micro-batches, and together the ranks cover every sample once per epoch."""
    import json
    import os
    import subprocess

    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(repo_root), os.environ.get("PYTHONPATH", "")]),
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "fixtures.hf_ddp",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    samples = load_samples(tmp_path / "samples.parquet")
    tokens = {int(i): [int(t) for t in ids] for i, ids in zip(samples["sample_id"], samples["input_ids"])}
    plan = load_plan(tmp_path / "plan", samples)
    assert sorted(plan["rank"].unique().tolist()) == [0, 1]
    for rank in (0, 1):
        observed = json.loads((tmp_path / f"observed-{rank}.json").read_text())
        mine = plan[plan["rank"] == rank]
        recorded = [(int(s), [tokens[i] for i in g["sample_id"]]) for (s, _m), g in mine.groupby(["step", "micro"])]
        assert recorded == [(o["step"], o["rows"]) for o in observed]
    assert plan.groupby("epoch")["sample_id"].agg(["nunique", "size"]).values.tolist() == [[48, 48]] * 2
    cfg = tomllib.loads((tmp_path / "run.toml").read_text())
    assert (cfg["world_size"], cfg["grad_accum"]) == (2, 2)
