"""Metric names as loggers write them: the one lookup of the loss, grad-norm, learning-rate and throughput keys."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from forensics.errors import ForensicsError

#: Loss keys tried in this order when none is given (DESIGN.md Conventions).
LOSS_KEYS = ("train/loss", "loss", "train_loss", "lm loss", "lm_loss")

#: Spellings of the grad norm, the learning rate and the throughput, tried in order (case and punctuation ignored).
GRAD_NORM_KEYS = ("grad_norm", "grad norm", "train/grad_norm", "gradient_norm", "grad_norm/total", "global_grad_norm")
LR_KEYS = ("lr", "learning rate", "learning_rate", "train/lr", "train/learning_rate", "lr-adamw", "optim/lr")
TPS_KEYS = ("tokens_per_s", "tokens_per_second", "tokens per second", "train/tokens_per_s", "throughput",
            "tok/s", "tokens/s", "samples per second", "samples_per_second")


def _squash(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def find_column(columns: Iterable[str], keys: Sequence[str], contains: Sequence[str] = ()) -> str | None:
    """The first column named as one of ``keys`` (ignoring case and punctuation), else the first whose squashed
    name contains one of ``contains``; None when absent."""
    cols = list(columns)
    by_name = {_squash(c): c for c in cols}
    for k in keys:
        if _squash(k) in by_name:
            return by_name[_squash(k)]
    for part in contains:
        for c in cols:
            if part in _squash(c):
                return c
    return None


def grad_norm_column(columns: Iterable[str]) -> str | None:
    """The grad-norm metric among ``columns`` (``grad_norm``, ``grad norm``, ``global_grad_norm``, ...)."""
    return find_column(columns, GRAD_NORM_KEYS, ("gradnorm",))


def lr_column(columns: Iterable[str]) -> str | None:
    """The learning-rate metric among ``columns``."""
    return find_column(columns, LR_KEYS, ("learningrate",))


def tokens_per_s_column(columns: Iterable[str]) -> str | None:
    """The throughput metric among ``columns``."""
    return find_column(columns, TPS_KEYS, ("tokenspers", "throughput"))


def find_loss_key(columns: Iterable[str], given: str | None = None) -> str:
    """The loss column: ``given`` when set (it must exist), else the first of :data:`LOSS_KEYS` present."""
    cols = list(columns)
    if given:
        if given not in cols:
            raise ForensicsError(f"loss key '{given}' is not among the metrics: {', '.join(map(str, cols[:12]))}")
        return given
    for key in LOSS_KEYS:
        if key in cols:
            return key
    raise ForensicsError(
        f"no loss column found: expected one of {', '.join(LOSS_KEYS)} or --loss-key; "
        f"the metrics are {', '.join(map(str, cols[:12])) or 'none'}"
    )


_TOKEN = re.compile(r"[/_\-. ]+")
_HELD_OUT = {"val", "valid", "validation", "eval", "test"}


def is_training_quantity(name: str, loss_key: str | None = None, grad_norm_key: str | None = None) -> bool:
    """DESIGN.md Conventions, "training quantities": the loss key, the grad-norm key, and other metrics whose names
    hold ``loss`` or ``norm`` and not val/eval/test; everything else (timing, throughput, lr, eval-only) is context."""
    if name in (loss_key, grad_norm_key):
        return True
    tokens = {t for t in _TOKEN.split(str(name).lower()) if t}
    if tokens & _HELD_OUT:
        return False
    squashed = _squash(name)
    return "loss" in squashed or "norm" in squashed
