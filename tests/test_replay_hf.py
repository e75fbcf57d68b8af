"""Replay of a real Hugging Face ``Trainer`` run: a tiny random GPT-2 trained on CPU, its ``checkpoint-N/`` folders.

The Trainer runs with a sequential sampler, so the plan is known without the recorder (step k holds samples
kB..kB+B-1); its ``trainer_state.json`` counts ``global_step`` from 1 after the update, which the metrics reader
aligns on its own. The same states re-saved as sharded safetensors with an index must replay to the same losses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fixtures.tiny_lm import make_samples  # noqa: E402
from forensics.cli import main  # noqa: E402
from forensics.replay import ReplayOptions, replay_case  # noqa: E402

BATCH = 8
STEPS = 12


@pytest.fixture(scope="session")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUTPUT_DIR of a 12-step Trainer run (save every 4 steps) with samples.parquet, plan.parquet and run.toml."""
    from torch.utils.data import Dataset, SequentialSampler

    out = tmp_path_factory.mktemp("hf-run")
    samples = make_samples(seed=1, n_qa=60, n_code=40).sample(frac=1.0, random_state=0).reset_index(drop=True)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=128,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)

    class Tokens(Dataset):
        def __len__(self) -> int:
            return len(samples)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": list(samples["input_ids"].iloc[i])}

    def collate(rows: list[dict]) -> dict:
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

    class SequentialTrainer(transformers.Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=BATCH,
        learning_rate=3e-3,
        logging_steps=1,
        save_steps=4,
        save_strategy="steps",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        lr_scheduler_type="constant",
    )
    trainer = SequentialTrainer(model=model, args=args, train_dataset=Tokens(), data_collator=collate)
    trainer.train()
    trainer.save_state()
    samples.to_parquet(out / "samples.parquet", index=False)
    plan = pd.DataFrame({"step": np.arange(len(samples)) // BATCH, "sample_id": samples["sample_id"]})
    plan[plan["step"] < STEPS].astype("int64").to_parquet(out / "plan.parquet", index=False)
    # global_step counts from 1 after the update (docs/concepts.md): step_offset 1, as the HF recorder writes it
    # no 'checkpoints' key: the output folder's own checkpoint-N/ folders are found
    (out / "run.toml").write_text(
        'metrics = ["trainer_state.json"]\nstep_offset = 1\nboundaries = [0, 24, 64]\nmax_len = 64\n'
    )
    return out


def test_hf_trainer_run_reproduces_from_its_checkpoint_folders(hf_run, tmp_path):
    out = tmp_path / "r.json"
    assert main(["replay", str(hf_run), "--steps", "8,10", "--controls", "3", "--json", str(out)]) == 0
    steps = {d["step"]: d for d in json.loads(out.read_text())["steps"]}
    assert steps[8]["checkpoint_step"] == 8 and steps[10]["checkpoint_step"] == 8
    # checkpoint-8 is exactly the state step 8's batch saw: the logged loss comes back to float precision
    assert steps[8]["replayed"] == pytest.approx(steps[8]["logged"], rel=2e-3)
    assert steps[8]["verdict"] == "normal" and steps[8]["earlier"][0]["checkpoint_step"] == 4
    assert abs(steps[10]["replayed"] - steps[10]["logged"]) < 0.1 * steps[10]["logged"]
    # the Trainer's optimizer.pt (two parameter groups: decay and no decay) drives the update probe
    assert set(steps[8]["update_probe"]["per_cluster"]) == {"0", "1"}
    assert steps[8]["gradient"]["suspect"] > 0 and len(steps[8]["gradient"]["controls"]["same_bucket"]) == 3


def test_model_folder_and_sharded_safetensors_replay_the_same(hf_run, tmp_path):
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_run / "checkpoint-8")
    sharded = tmp_path / "ck" / "checkpoint-8"
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").exists()
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    folder = tmp_path / "model"
    transformers.GPT2Config.from_pretrained(hf_run / "checkpoint-8").save_pretrained(folder)
    a = replay_case(hf_run, ReplayOptions(steps=[8], controls=3, earlier=0, control_step=False))
    b = replay_case(
        hf_run,
        ReplayOptions(
            steps=[8], controls=3, earlier=0, control_step=False, checkpoints=str(tmp_path / "ck"), model=str(folder)
        ),
    )
    assert b.steps[0]["replayed"] == pytest.approx(a.steps[0]["replayed"], rel=1e-6)


def test_hf_checkpoint_of_another_architecture_names_the_keys(hf_run, tmp_path, capsys):
    other = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    )
    ck = tmp_path / "ck" / "checkpoint-8"
    other.save_pretrained(ck)
    shutil.copy(hf_run / "checkpoint-8" / "config.json", tmp_path / "config.json")  # the run's own config
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.move(tmp_path / "config.json", folder / "config.json")
    rc = main(["replay", str(hf_run), "--steps", "8", "--checkpoints", str(tmp_path / "ck"), "--model", str(folder)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "missing keys transformer.h.1." in err
