"""Per-sample losses of a batch, computed in micro-batches that fit ``max_tokens_per_forward``.

The loss is the run's: next-token cross-entropy over the non-pad label positions, summed per sample; a batch's loss
is its token-weighted mean (sum over samples / tokens, see :data:`LOSS_DENOMINATORS`), as HF Trainer and most
training loops report it. Since
samples do not see each other under the attention mask, the split into micro-batches does not change a sample's
loss, so micro-batches are sized for memory alone and split again (halved) on out-of-memory.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from forensics.errors import ForensicsError
from forensics.replay import _torch
from forensics.replay.batches import pad_batch
from forensics.replay.model import LoadedModel


@dataclass
class SampleLoss:
    """One sample's summed loss over its ``count`` label tokens, and the per-token losses (float32)."""

    total: float
    count: int
    tokens: np.ndarray

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")


#: How the run divided a batch's summed loss: by the predicted tokens (``predicted``: non-pad tokens after the first
#: of each sequence), or by every non-pad label (``labels``: HF Trainer's ``num_items_in_batch`` counts the labels
#: before the shift, so each sequence adds one token that is never predicted).
LOSS_DENOMINATORS = ("predicted", "labels")


def batch_loss(losses: list[SampleLoss], denominator: str = "predicted") -> float:
    """The token-weighted mean loss of a batch (the value a training loop logs), divided as the run divided it."""
    n = sum(s.count for s in losses) + (len(losses) if denominator == "labels" else 0)
    return sum(s.total for s in losses) / n if n else float("nan")


class Forwarder:
    """Runs batches through ``model`` on ``device`` in ``dtype`` (bf16 by autocast), without autograd.

    The model stays in eval mode; :meth:`losses` with a ``seed`` runs one forward in train mode (dropout on) with
    torch's generators seeded by it, so the same seed gives the same dropout masks and a second forward with it is
    a determinism check like any other.
    """

    def __init__(
        self, model: LoadedModel, device: str, dtype: str, max_tokens: int, pad_id: int, pad_side: str
    ) -> None:
        if max_tokens < 1:
            raise ForensicsError(f"--max-tokens-per-forward must be >= 1; got {max_tokens}")
        self.model, self.device, self.dtype = model, device, dtype
        self.max_tokens, self.pad_id, self.pad_side = max_tokens, pad_id, pad_side
        self.forwards = 0
        self.tokens = 0  # padded tokens forwarded (throughput figures)

    def _autocast(self) -> Any:
        torch = _torch.torch()
        if self.dtype == "bfloat16":
            return torch.autocast(device_type=self.device.split(":")[0], dtype=torch.bfloat16)
        return nullcontext()

    def losses(self, seqs: list[np.ndarray], seed: int | None = None) -> list[SampleLoss]:
        """Per-sample losses of ``seqs`` (in order), micro-batched to the token limit; in train mode with dropout
        seeded by ``seed`` when given, else in eval mode."""
        if seed is None:
            return self._losses(seqs)
        torch = _torch.torch()
        module = self.model.module
        torch.manual_seed(int(seed))  # seeds the CPU and every CUDA generator
        module.train(True)
        try:
            return self._losses(seqs)
        finally:
            module.train(False)

    def _losses(self, seqs: list[np.ndarray]) -> list[SampleLoss]:
        out: list[SampleLoss] = []
        for chunk in self._chunks(seqs, self.max_tokens):
            out += self._run(chunk)
        return out

    @staticmethod
    def _chunks(seqs: list[np.ndarray], limit: int) -> list[list[np.ndarray]]:
        chunks, cur, width = [], [], 0
        for s in seqs:
            w = max(width, len(s))
            if cur and w * (len(cur) + 1) > limit:
                chunks.append(cur)
                cur, w = [], len(s)
            cur.append(s)
            width = w
        if cur:
            chunks.append(cur)
        return chunks

    def _run(self, chunk: list[np.ndarray]) -> list[SampleLoss]:
        torch = _torch.torch()
        try:
            return self._forward(chunk)
        except torch.OutOfMemoryError as exc:
            if len(chunk) == 1:
                raise ForensicsError(
                    f"one sample of {len(chunk[0])} tokens does not fit in memory on "
                    f"{self.device}; try --dtype bfloat16 or another device"
                ) from exc
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            half = len(chunk) // 2
            return self._run(chunk[:half]) + self._run(chunk[half:])

    def _forward(self, chunk: list[np.ndarray]) -> list[SampleLoss]:
        torch = _torch.torch()
        ids, mask = pad_batch(chunk, self.pad_id, self.pad_side)
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.no_grad(), self._autocast():
            logits = self.model.logits(ids, mask)
        self.forwards += 1
        self.tokens += int(ids.numel())
        labels_ok = mask[:, 1:].bool()
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
        ce = (ce * labels_ok).cpu().numpy()
        ok = labels_ok.cpu().numpy()
        return [
            SampleLoss(float(ce[i][ok[i]].sum(dtype=np.float64)), int(ok[i].sum()), ce[i][ok[i]].astype(np.float32))
            for i in range(len(chunk))
        ]


def _predicted(seqs: list[np.ndarray], denominator: str) -> int:
    return sum(max(len(s) - 1, 0) for s in seqs) + (len(seqs) if denominator == "labels" else 0)


def accumulate_grad(fwd: Forwarder, seqs: list[np.ndarray], denominator: str = "predicted") -> None:
    """Backward of the batch's mean loss into ``.grad`` (micro-batched, gradients summed as in accumulation)."""
    torch = _torch.torch()
    module = fwd.model.module
    for p in module.parameters():
        p.grad = None
    n = _predicted(seqs, denominator)
    for chunk in fwd._chunks(seqs, fwd.max_tokens):
        ids, mask = pad_batch(chunk, fwd.pad_id, fwd.pad_side)
        ids, mask = ids.to(fwd.device), mask.to(fwd.device)
        with torch.enable_grad(), fwd._autocast():
            logits = fwd.model.logits(ids, mask)
            ok = mask[:, 1:].bool()
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
            ((ce * ok).sum() / max(n, 1)).backward()
        fwd.forwards += 1


def grad_norm(fwd: Forwarder, seqs: list[np.ndarray], denominator: str = "predicted") -> float:
    """The global L2 norm of the gradient of the batch's mean loss (what the run logs as ``grad_norm``)."""
    torch = _torch.torch()
    accumulate_grad(fwd, seqs, denominator)
    grads = [p.grad.detach().float() for p in fwd.model.module.parameters() if p.grad is not None]
    norm = float(torch.sqrt(sum((g * g).sum() for g in grads))) if grads else 0.0
    for p in fwd.model.module.parameters():
        p.grad = None
    return norm
