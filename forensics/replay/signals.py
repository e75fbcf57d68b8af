"""Per-sample signals that say why a sample's loss is high (plain numpy: no model needed).

- ``repeat_run``: the longest span, in tokens, made of back-to-back repeats of one n-gram (n <= 8, at least two
  copies); the OLMo 2 team traced their spikes to such repeated n-grams.
- ``rare_token_share``: the share of the sample's tokens that fewer than 1% of the run's samples hold (ids the run
  almost never uses, e.g. corrupted bytes or a tokenizer mismatch).
- ``top_token_loss_share``: the share of the sample's loss carried by its top 10% tokens (a few impossible tokens
  vs. a sample that is uniformly hard).
"""

from __future__ import annotations

import numpy as np

RARE_DOC_SHARE = 0.01
TOP_TOKEN_SHARE = 0.10
MAX_NGRAM = 8


def repeat_run(tokens: np.ndarray, max_n: int = MAX_NGRAM) -> int:
    """The longest span covered by consecutive copies (>= 2) of one n-gram, n in 1..``max_n``; 0 when none."""
    t = np.asarray(tokens)
    best = 0
    for n in range(1, min(max_n, len(t) // 2) + 1):
        same = t[n:] == t[:-n]  # position i repeats the token n before it
        if not same.any():
            continue
        # a run of k consecutive matches means the span of k + n tokens is an n-periodic repeat
        padded = np.concatenate([[0], same.astype(np.int8), [0]])
        edges = np.flatnonzero(np.diff(padded))
        longest = int((edges[1::2] - edges[::2]).max())
        if longest >= n:
            best = max(best, longest + n)
    return best


def rare_token_share(tokens: np.ndarray, doc_freq: np.ndarray, n_docs: int, share: float = RARE_DOC_SHARE) -> float:
    """Share of ``tokens`` held by fewer than ``share`` of the run's samples (ids beyond ``doc_freq`` count as rare)."""
    t = np.asarray(tokens, dtype=np.int64)
    if len(t) == 0 or n_docs == 0:
        return 0.0
    freq = np.where(t < len(doc_freq), doc_freq[np.clip(t, 0, max(len(doc_freq) - 1, 0))], 0)
    return float(np.mean(freq < share * n_docs))


def top_token_loss_share(token_losses: np.ndarray, top: float = TOP_TOKEN_SHARE) -> float:
    """Share of the summed loss carried by the ``top`` fraction of tokens with the highest loss."""
    x = np.sort(np.asarray(token_losses, dtype=np.float64))[::-1]
    total = x.sum()
    if len(x) == 0 or total <= 0:
        return 0.0
    k = max(1, int(np.ceil(top * len(x))))
    return float(x[:k].sum() / total)


def signals(tokens: np.ndarray, token_losses: np.ndarray, doc_freq: np.ndarray, n_docs: int) -> dict[str, float]:
    """The three signals of one sample, rounded for the report."""
    return {
        "repeat_run": repeat_run(tokens),
        "rare_token_share": round(rare_token_share(tokens, doc_freq, n_docs), 4),
        "top_token_loss_share": round(top_token_loss_share(token_losses), 4),
    }
