"""The demo's stand-in model: a tiny real language model trained on the static case's own batches, with
checkpoints, so that the replay the audit's next steps print runs on the demo and proves its cause.

The demo's metrics are simulated (:mod:`forensics.datasets.loss_model`), so no model logged them. The stand-in is
what a replay needs in their place: its token ids are the words of each sample's text (:func:`tokenize`; the
corrupted near-duplicates hold ``<|endoftext|>`` runs and replacement characters that no clean sample uses), it is
trained on the static plan's first :data:`TRAIN_STEPS` steps, batch for batch as the plan gives them (the corrupted
batches at 254 and 258 included), and it logs its own loss per step. The case's run.toml names it (``model`` =
:func:`demo_lm`, ``checkpoints`` = ``replay-model/``) and its log (``[replay] metrics``), so a replay compares
its replayed losses with the loss the stand-in logged, never with the simulation's.

It is built on first use and cached by content (:func:`cache_key`: the trained batches' tokens, this module's source,
the torch version) in the user cache (:mod:`forensics.cache`), then copied into the case; a few seconds on one CPU
core. Without torch the demo has no stand-in, and the next steps say what a replay lacks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.datasets.samples import CORRUPT_FILE, FILLER_WORDS, SOURCES
from forensics.schema import SAMPLE_ID, STEP, TEXT

#: Steps of the static plan the stand-in is trained on (the story's spikes at 254 and 258 inside them).
TRAIN_STEPS = 300
#: A checkpoint every this many steps, from step 0 (checkpoint N: the state after N updates).
CHECKPOINT_EVERY = 50
LR = 3e-3
WARMUP = 20
SEED = 0
#: Folder of the case (and of the cache entry) holding the checkpoints and the stand-in's own loss log.
FOLDER = "replay-model"
LOG = "train_log.jsonl"
LOSS = "train/loss"
PAD_ID, BOS_ID, UNK_ID = 0, 1, 2
#: The model factory run.toml names (``module:function``).
FACTORY = f"{__name__}:demo_lm"


def vocabulary() -> list[str]:
    """The word vocabulary: padding, start and unknown, the sources' words, the filler and the corrupted file's."""
    words = ["<pad>", "<bos>", "<unk>"]
    for s in SOURCES:
        words += [s.opener, *s.vocabulary]
    words += list(FILLER_WORDS) + [w for part in CORRUPT_FILE for w in part.split()]
    return list(dict.fromkeys(words))


VOCAB = vocabulary()
WORD_ID = {w: i for i, w in enumerate(VOCAB)}


def tokenize(texts: pd.Series) -> list[list[int]]:
    """Token ids of each text: the start token, then one id per whitespace-separated word."""
    return [[BOS_ID] + [WORD_ID.get(w, UNK_ID) for w in str(t).split()] for t in texts]


def demo_lm(d: int = 64, layers: int = 2, heads: int = 4, max_len: int = 64):
    """The stand-in (what run.toml's ``model`` builds): forward(ids, attention_mask) -> logits."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    vocab = len(VOCAB)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x, mask):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp(self.ln2(x))

    class DemoLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, ids, attention_mask=None):
            if attention_mask is None:
                attention_mask = torch.ones_like(ids)
            keep = attention_mask.bool()
            pos = (keep.long().cumsum(-1) - 1).clamp(min=0, max=max_len - 1)
            t = ids.shape[1]
            causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
            # a query always sees itself, so a padded row is never fully masked (which would give NaN)
            mask = (causal & keep[:, None, None, :]) | torch.eye(t, dtype=torch.bool, device=ids.device)
            x = self.tok(ids) + self.pos(pos)
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln(x))

    return DemoLM()


def _batches(plan: pd.DataFrame, tokens: dict[int, list[int]]) -> list[list[list[int]]]:
    part = plan.loc[plan[STEP] < TRAIN_STEPS].sort_values(STEP, kind="stable")
    return [[tokens[int(i)] for i in g[SAMPLE_ID]] for _, g in part.groupby(STEP, sort=True)]


def cache_key(batches: list[list[list[int]]]) -> str:
    """What the stand-in's weights depend on: the trained batches' tokens, this module's source, torch's version."""
    import torch

    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(torch.__version__.encode())
    for batch in batches:
        h.update(json.dumps(batch, separators=(",", ":")).encode())
    return h.hexdigest()[:16]


def _train(batches: list[list[list[int]]], out: Path) -> None:
    """Train the stand-in on ``batches`` (one optimizer step each) and write its checkpoints and loss log."""
    import torch

    torch.manual_seed(SEED)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: the same weights on every machine, and no fight with other work
    try:
        model = demo_lm()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
        log = []
        for step, seqs in enumerate(batches):
            if step % CHECKPOINT_EVERY == 0:
                torch.save(
                    {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                    out / f"step_{step:06d}.pt",
                )
            for g in opt.param_groups:
                g["lr"] = LR * min(1.0, (step + 1) / WARMUP)
            width = max(len(s) for s in seqs)
            ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, s in enumerate(seqs):
                ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
            logits = model(ids, mask)
            ok = mask[:, 1:].bool()
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
            loss = (ce * ok).sum() / ok.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            log.append({"step": step, LOSS: float(loss.item())})
        torch.save(
            {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": len(batches)},
            out / f"step_{len(batches):06d}.pt",
        )
    finally:
        torch.set_num_threads(threads)
    with open(out / LOG, "w", encoding="utf-8") as f:
        for row in log:
            f.write(json.dumps(row) + "\n")


def add_stand_in(case_dir: Path, samples: pd.DataFrame, plan: pd.DataFrame) -> dict[str, Any] | None:
    """Give the case its stand-in model: trained (or taken from the cache) and copied into ``case_dir/replay-model``;
    returns the run.toml keys that name it (None without torch: the demo then has no model to replay with)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from forensics.cache import cache_dir

    tokens = dict(zip(samples[SAMPLE_ID].astype(int).tolist(), samples["input_ids"], strict=False))
    batches = _batches(plan, {k: [int(x) for x in v] for k, v in tokens.items()})
    entry = cache_dir() / "demo-model" / cache_key(batches)
    if not (entry / LOG).is_file():
        tmp = entry.with_name(f".building-{entry.name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _train(batches, tmp)
        try:
            os.replace(tmp, entry)
        except OSError:  # another process built it first: keep its entry
            shutil.rmtree(tmp, ignore_errors=True)
    target = case_dir / FOLDER
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(entry, target)
    return {
        "model": FACTORY,
        "checkpoints": FOLDER,
        "pad_id": PAD_ID,
        "pad_side": "right",
        "replay": {"metrics": [f"{FOLDER}/{LOG}"]},
    }


def with_tokens(samples: pd.DataFrame) -> pd.DataFrame:
    """The samples with ``input_ids``: the token ids of their text (what the stand-in was trained on)."""
    return samples.assign(
        input_ids=pd.Series([np.asarray(t, dtype=np.int32) for t in tokenize(samples[TEXT])], index=samples.index)
    )
