"""What each step's batch held, token for token: samples per plan step, tokens per sample, padding as the run did it.

Tokens come from the samples table's ``input_ids`` (a ``token_ids`` column is read as ``input_ids``) or from
``--tokens``: a Parquet file with ``sample_id`` and an ``input_ids``/``token_ids`` list column, or a ``.npy`` flat
token array with its offsets beside it (``X.npy`` + ``X.offsets.npy``, memory-mapped; sample i's tokens are
``flat[offsets[i]:offsets[i+1]]`` for the i-th sample id of the samples table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_index
from forensics.schema import BATCH_BY_STEP, N_TOKENS, SAMPLE_ID, STEP

INPUT_IDS = "input_ids"
TOKEN_COLUMNS = (INPUT_IDS, "token_ids")


class TokenStore:
    """sample_id -> token ids (int64 numpy arrays), read once."""

    def __init__(self, tokens: dict[int, np.ndarray], origin: str) -> None:
        self.tokens, self.origin = tokens, origin

    def __getitem__(self, sample_id: int) -> np.ndarray:
        try:
            return self.tokens[int(sample_id)]
        except KeyError as exc:
            raise ForensicsError(
                f"tokens {self.origin}: no tokens for sample_id {sample_id} named by the plan"
            ) from exc

    def document_frequency(self, max_samples: int = 20_000, seed: int = 0) -> tuple[np.ndarray, int]:
        """How many samples hold each token id (over at most ``max_samples`` samples, seeded): rare-token yardstick."""
        ids = np.fromiter(self.tokens.keys(), dtype=np.int64)
        if len(ids) > max_samples:
            ids = np.random.default_rng(seed).choice(ids, size=max_samples, replace=False)
        uniq = [np.unique(self.tokens[int(i)]) for i in ids]
        flat = np.concatenate(uniq) if uniq else np.zeros(0, np.int64)
        return np.bincount(flat.clip(min=0)), len(ids)


def read_tokens(
    samples_path: Path | None, tokens_path: str | Path | None, samples: pd.DataFrame | None = None
) -> TokenStore:
    """The token store from ``--tokens`` when given, else the samples table's token column."""
    if tokens_path is not None:
        path = Path(tokens_path)
        if not path.exists():
            raise ForensicsError(f"tokens file {path} does not exist")
        if path.suffix == ".npy":
            return _read_npy(path, samples)
        return _read_parquet(path)
    if samples_path is None:
        raise ForensicsError("replay needs the tokens of each sample: a samples table with 'input_ids', or --tokens")
    return _read_parquet(Path(samples_path))


def _read_parquet(path: Path) -> TokenStore:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise ForensicsError(f"tokens file {path} is not a readable Parquet file: {exc}") from exc
    col = next((c for c in TOKEN_COLUMNS if c in names), None)
    if col is None or SAMPLE_ID not in names:
        raise ForensicsError(
            f"{path}: replay needs columns 'sample_id' and 'input_ids' (or 'token_ids') holding the "
            f"tokens the model saw; found {', '.join(names)}"
        )
    table = pq.read_table(path, columns=[SAMPLE_ID, col])
    lists = table.column(col).combine_chunks()
    sids = table.column(SAMPLE_ID).to_numpy()
    if lists.null_count:
        raise ForensicsError(f"{path}: column '{col}' has {lists.null_count} empty (null) rows")
    flat = lists.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = lists.offsets.to_numpy()
    return TokenStore({int(s): flat[offsets[i] : offsets[i + 1]] for i, s in enumerate(sids)}, str(path))


def _read_npy(path: Path, samples: pd.DataFrame | None) -> TokenStore:
    off_path = path.with_name(path.stem + ".offsets.npy")
    if not off_path.exists():
        raise ForensicsError(f"tokens {path}: a flat .npy token array needs its offsets in {off_path}")
    if samples is None:
        raise ForensicsError(
            f"tokens {path}: a .npy token array is matched to the samples table's order; the case has no samples table"
        )
    flat = np.load(path, mmap_mode="r")
    offsets = np.load(off_path)
    if flat.ndim != 1 or offsets.ndim != 1 or len(offsets) != len(samples) + 1:
        raise ForensicsError(
            f"tokens {path}: expected a 1-D token array and {len(samples) + 1} offsets (one per "
            f"sample plus the end); got {flat.shape} and {offsets.shape}"
        )
    sids = samples[SAMPLE_ID].to_numpy()
    return TokenStore(
        {int(s): np.asarray(flat[offsets[i] : offsets[i + 1]], dtype=np.int64) for i, s in enumerate(sids)}, str(path)
    )


@dataclass
class StepIndex:
    """The samples of each plan step (in the order the run fed them), and each step's dominant length bucket."""

    samples_of: dict[int, list[int]]
    bucket_of: dict[int, int]

    @classmethod
    def build(cls, plan: pd.DataFrame, samples: pd.DataFrame | None, boundaries: list[int]) -> StepIndex:
        order = [c for c in BATCH_BY_STEP if c in plan.columns]  # batches in the order the trainer fed them
        p = plan.sort_values(order, kind="stable")
        samples_of = {int(s): g[SAMPLE_ID].astype(np.int64).tolist() for s, g in p.groupby(STEP, sort=True)}
        bucket_of: dict[int, int] = {}
        if samples is not None:
            n_tok = dict(zip(samples[SAMPLE_ID].tolist(), samples[N_TOKENS].tolist(), strict=False))
            steps = p[STEP].to_numpy(np.int64)
            lengths = np.array([n_tok.get(int(s), 0) for s in p[SAMPLE_ID].tolist()], dtype=np.int64)
            b = bucket_index(lengths, boundaries)
            frame = pd.DataFrame({"step": steps, "bucket": b})
            counts = (
                frame.value_counts()
                .reset_index(name="n")
                .sort_values(["step", "n", "bucket"], ascending=[True, False, True])
            )
            bucket_of = {
                int(s): int(bk)
                for s, bk in zip(*counts.drop_duplicates("step")[["step", "bucket"]].to_numpy().T, strict=False)
            }
        return cls(samples_of, bucket_of)

    def has(self, step: int) -> bool:
        return step in self.samples_of


def pad_batch(seqs: list[np.ndarray], pad_id: int, pad_side: str) -> tuple[Any, Any]:
    """Input ids and attention mask (int64 tensors) padded to the longest sequence on ``pad_side``."""
    from forensics.replay import _torch

    torch = _torch.torch()
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, s in enumerate(seqs):
        if pad_side == "left":
            ids[i, width - len(s) :], mask[i, width - len(s) :] = s, 1
        else:
            ids[i, : len(s)], mask[i, : len(s)] = s, 1
    return torch.from_numpy(ids), torch.from_numpy(mask)
