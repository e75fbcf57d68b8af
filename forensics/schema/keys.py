"""Metric names as loggers write them: the one lookup of the loss, grad-norm, learning-rate and throughput keys.

Loggers spell one quantity many ways: ``train/loss`` (HF Trainer on W&B), ``loss`` (HF ``trainer_state.json``),
``train_loss_step`` / ``train_loss_epoch`` (Lightning with ``on_step`` and ``on_epoch``), ``tb/train/loss`` or
``Loss/train`` (TensorBoard subfolders), ``lm loss`` and ``lm-loss-training/lm loss`` (Megatron), ``reduced_train_loss``
(NeMo), ``Loss`` (Keras), ``TRAIN_LOSS`` (CSV exports), ``<run> - train/loss`` (W&B chart exports); the grad norm as
``grad_norm``, ``grad-norm``, ``total_grad_norm``, ``gradient_norm``, ``grad_2.0_norm_total`` (Lightning's
``grad_norm`` utility); the held-out loss as ``eval/loss``, ``eval_loss``, ``val_loss``, ``lm loss validation`` or
Megatron's printed ``lm loss value`` (a name must then hold a val/eval/test word, ``test`` ranking last). A fixed
list of spellings misses most of them, so a name is read as words instead:

1. **tokens**: a W&B chart export's ``<run> - `` prefix is set aside, then the name is split on every character that
   is not a letter or digit (``/ _ - .`` and space among them) and at camelCase humps, and lower-cased; pure numbers
   and norm orders (``2``, ``l2``) are dropped (``grad_2.0_norm`` is ``grad norm``).
2. **match**: a name is a candidate for a role when its tokens hold one of the role's phrases contiguously (``loss``;
   ``grad norm``, ``gradient norm``, ``gradnorm``; ...), and none of the role's excluded words (``loss scale`` is the
   fp16 scaler, not a loss). A token that merely contains the phrase (``trainloss``) is a weaker match.
3. **rank**, best first, each criterion deciding only between names equal on the ones before it: a name without
   ``val``/``eval``/``test`` words; not an aggregate (``min``, ``max``, ``std``: W&B exports' ``__MIN``/``__MAX``);
   not per-epoch (``epoch`` among its words: ``train_loss_step`` over ``train_loss_epoch``); when the caller gives how
   many values each metric holds, not sparse (fewer than half the values of the densest candidate: HF's end-of-run
   ``train_loss`` beside the per-step ``loss``); the stronger match; the fewest other words (``lm loss`` over
   ``lm loss vs samples``, Megatron's same series against consumed samples). Words that only qualify the quantity
   (``train``, ``step``, ``total``, ``global``, ``reduced``, ``lm``, ...) cost nothing.
4. **ties**: two names equal on every criterion are a true ambiguity (two runs in one export, ``loss`` and
   ``train/loss`` from two merged sources): the first in column order is taken and the choice carries a warning
   naming both and the flag that decides.

A given key (``--loss-key``, run.toml ``loss_key``) always wins and must exist. Every choice comes back as a
:class:`KeyChoice` (key, role, reason, candidates), so the audit can say in the summary and in findings.json which
key it analysed and why. The functions of the first version (:func:`find_loss_key`, :func:`grad_norm_column`,
:func:`lr_column`, :func:`tokens_per_s_column`, :func:`find_column`) are thin wrappers over :func:`choose_key`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from typing import Any

from forensics.errors import ForensicsError
from forensics.schema.words import counted

#: Words that mark a held-out split: such a series is context, and a training key only when nothing else qualifies.
EVAL_WORDS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "testing", "heldout", "holdout"})
#: Words that mark a statistic over a window or over ranks, not the series itself.
AGGREGATE_WORDS = frozenset({"min", "max", "std", "stddev", "var", "variance", "median"})
#: Words that mark a per-epoch series.
EPOCH_WORDS = frozenset({"epoch", "epochs"})
#: Words that qualify a quantity without making it another one: they cost nothing in the ranking.
NEUTRAL_WORDS = frozenset(
    {
        "train",
        "training",
        "trn",
        "step",
        "steps",
        "iter",
        "iteration",
        "batch",
        "total",
        "global",
        "overall",
        "reduced",
        "lm",
        "mean",
        "avg",
        "average",
        "value",
        "scalar",
        "scalars",
        "metric",
        "metrics",
        "optim",
        "optimizer",
    }
)
#: A word: an upper-case run not followed by lower case (``TRAIN``, ``L2``), else an optional capital and lower case
#: or digits (``Loss``, ``layer0``); everything else separates (``/ _ - .``, space, ``(``...) and so do humps.
_WORD = re.compile(r"[A-Z]+[0-9]*(?![a-z])|[A-Z]?[a-z0-9]+")
#: Tokens that carry no meaning for the match: numbers and norm orders (``grad_2.0_norm``, ``grad_l2_norm``).
_ORDER = re.compile(r"\d+|l\d+|linf")
#: W&B chart exports name each column ``<run name> - <metric key>`` (and ``... - key__MIN`` / ``__MAX``).
_RUN_SEP = " - "


@dataclass(frozen=True)
class Role:
    """A quantity the audit looks for, and the words that name it.

    ``phrases``: token sequences that name the quantity (a name must hold one contiguously); ``weaker``: phrases
    that name a stand-in (samples per second for throughput), taken only when no phrase matches; ``loose``: strings
    that,
    found inside a single token, name it more weakly (``trainloss``); ``exclude``: words that make it another
    quantity; ``neutral``: words that qualify it for free beside :data:`NEUTRAL_WORDS`; ``flag``: how a user
    chooses the key when the lookup cannot; ``label``: the quantity in messages; ``note``: what the error for a
    missing key adds.
    """

    name: str
    phrases: tuple[tuple[str, ...], ...]
    weaker: tuple[tuple[str, ...], ...] = ()
    loose: tuple[str, ...] = ()
    exclude: frozenset[str] = frozenset()
    neutral: frozenset[str] = frozenset()
    flag: str | None = None
    label: str = ""
    note: str = ""
    #: Words one of which a name must hold (the eval loss: ``val``, ``eval``, ...); empty: none needed.
    require: frozenset[str] = frozenset()
    #: Whole names (as words) that qualify without a required word (Megatron prints its validation loss as
    #: ``lm loss value``).
    also: tuple[tuple[str, ...], ...] = ()
    #: Words that rank a name below the others (the eval loss prefers ``val``/``eval`` over ``test``).
    last: frozenset[str] = frozenset()

    @property
    def what(self) -> str:
        return self.label or self.name.replace("_", " ")

    @cached_property
    def needles(self) -> frozenset[str]:
        """Strings one of which a name's squashed words must hold to match at all (a cheap first test)."""
        return frozenset(["".join(p) for p in self.phrases + self.weaker] + list(self.loose))


#: Words that make a "loss" the fp16 scaler's setting (``loss scale``), not a quantity that goes wrong.
_SCALE_WORDS = frozenset({"scale", "scaler", "scaling"})
#: Words that make a "loss" the auxiliary z loss (OLMo-core's ``train/Z loss`` beside ``train/CE loss``, PaLM's
#: ``z_loss``: the squared log-sum-exp of the output logits), never the loss to analyse.
_Z_WORDS = frozenset({"z", "zloss"})
LOSS = Role(
    "loss",
    (("loss",),),
    loose=("loss",),
    exclude=_SCALE_WORDS | _Z_WORDS,
    flag="--loss-key or run.toml loss_key",
    note=" (a loss scale or a z loss is not the loss)",
)
GRAD_NORM = Role(
    "grad_norm",
    (("grad", "norm"), ("gradient", "norm"), ("gradnorm",), ("grads", "norm")),
    loose=("gradnorm", "gradientnorm"),
    flag="--spike-metric",
    label="grad norm",
)
LR = Role(
    "lr",
    (("lr",), ("learning", "rate"), ("learningrate",)),
    loose=("learningrate",),
    neutral=frozenset({"group", "pg", "adam", "adamw", "sgd", "lion"}),
    label="learning rate",
)
THROUGHPUT = Role(
    "throughput",
    (
        ("tokens", "per", "s"),
        ("tokens", "per", "sec"),
        ("tokens", "per", "second"),
        ("tok", "per", "s"),
        ("tok", "per", "sec"),
        ("tokens", "s"),
        ("tokens", "sec"),
        ("tok", "s"),
        ("tps",),
        ("throughput",),
    ),
    weaker=(("samples", "per", "s"), ("samples", "per", "sec"), ("samples", "per", "second"), ("samples", "s")),
    loose=("tokenspers", "throughput"),
    label="throughput",
)
#: The held-out loss, found as the loss is but among the val/eval/test names (val and eval before test); a
#: perplexity is not a loss.
EVAL_LOSS = Role(
    "eval_loss",
    (("loss",),),
    loose=("loss",),
    exclude=_SCALE_WORDS | _Z_WORDS | {"ppl", "perplexity"},
    require=EVAL_WORDS,
    also=(("lm", "loss", "value"),),
    last=frozenset({"test", "testing"}),
    flag="run.toml eval_loss_key",
    label="eval loss",
)
#: Numerics and optimizer signals logged beside the loss (read as evidence before it, never analysed as the loss):
#: Megatron's ``loss scale`` (the fp16 scaler: it halves when a step overflows), ``number of skipped iterations``
#: and ``number of nan iterations`` (counts over each logging interval); OLMo-core's ``optim/step skipped``;
#: torchtitan's ``global_max_loss`` beside ``global_avg_loss`` (the worst rank's loss against the mean); an update
#: norm (OLMo-core ``optim/*``, a ``*update norm*`` series).
_COUNT_WORDS = frozenset({"number", "of", "num", "count", "n"})
LOSS_SCALE = Role(
    "loss_scale",
    (("loss", "scale"), ("loss", "scaler"), ("lossscale",), ("grad", "scale")),
    loose=("lossscale",),
    neutral=frozenset({"current"}),
    label="loss scale",
)
SKIPPED_ITERATIONS = Role(
    "skipped_iterations",
    (
        ("skipped", "iterations"),
        ("skipped", "iteration"),
        ("skipped", "iters"),
        ("skipped", "steps"),
        ("step", "skipped"),
        ("steps", "skipped"),
    ),
    neutral=_COUNT_WORDS,
    label="skipped iterations",
)
NAN_ITERATIONS = Role(
    "nan_iterations",
    (("nan", "iterations"), ("nan", "iteration"), ("nan", "iters"), ("nan", "steps")),
    neutral=_COUNT_WORDS,
    label="nan iterations",
)
MAX_LOSS = Role("max_loss", (("max", "loss"),), neutral=frozenset({"global", "rank", "ranks"}), label="max loss")
UPDATE_NORM = Role(
    "update_norm",
    (("update", "norm"), ("updates", "norm"), ("param", "update", "norm")),
    loose=("updatenorm",),
    label="update norm",
)
#: Megatron's ``params norm`` (the L2 norm of all the weights, printed when ``--log-params-norm`` is on); an update
#: norm or a grad norm of the parameters is another quantity.
PARAMS_NORM = Role(
    "params_norm",
    (
        ("params", "norm"),
        ("param", "norm"),
        ("parameter", "norm"),
        ("parameters", "norm"),
        ("weight", "norm"),
        ("weights", "norm"),
    ),
    loose=("paramsnorm", "paramnorm", "parameternorm", "weightnorm"),
    exclude=frozenset({"update", "updates", "grad", "grads", "gradient", "gradients"}),
    label="params norm",
)
#: Megatron's ``num zeros`` (``num_zeros_in_grad``: gradient entries that are exactly 0, an fp16 underflow's mark).
NUM_ZEROS = Role(
    "num_zeros",
    (("num", "zeros"), ("number", "of", "zeros"), ("zeros", "in", "grad"), ("numzeros",)),
    loose=("numzeros",),
    neutral=_COUNT_WORDS | {"in", "grad", "grads", "gradient"},
    label="num zeros",
)
#: The z loss (OLMo-core's ``train/Z loss``, ``z_loss``): the squared log-sum-exp of the output logits, so it grows
#: with them.
Z_LOSS = Role("z_loss", (("z", "loss"), ("zloss",)), loose=("zloss",), label="z loss")
#: The roles by name.
ROLES = {
    r.name: r
    for r in (
        LOSS,
        GRAD_NORM,
        LR,
        THROUGHPUT,
        EVAL_LOSS,
        LOSS_SCALE,
        SKIPPED_ITERATIONS,
        NAN_ITERATIONS,
        MAX_LOSS,
        UPDATE_NORM,
        PARAMS_NORM,
        NUM_ZEROS,
        Z_LOSS,
    )
}
# Kept for callers that list the spellings (the CLI help); the lookup itself reads names as words.
LOSS_KEYS = ("train/loss", "loss", "train_loss", "train_loss_step", "lm loss", "reduced_train_loss", "TRAIN_LOSS")
GRAD_NORM_KEYS = ("grad_norm", "train/grad_norm", "grad-norm", "total_grad_norm", "gradient_norm", "grad norm")
LR_KEYS = ("lr", "learning_rate", "train/learning_rate", "learning rate", "lr-AdamW")
TPS_KEYS = ("tokens_per_s", "tokens_per_second", "tokens per second", "tok/s", "throughput", "samples per second")


def split_run(name: str) -> tuple[str | None, str]:
    """``(run, key)`` of a W&B chart export's ``<run> - <key>`` column; ``(None, name)`` for any other name."""
    text = str(name)
    if _RUN_SEP in text:
        run, key = text.rsplit(_RUN_SEP, 1)
        if run.strip() and key.strip():
            return run.strip(), key.strip()
    return None, text


@lru_cache(maxsize=1 << 16)
def tokens(name: str) -> tuple[str, ...]:
    """The words of a metric name: separators and camelCase humps split, lower-cased, numbers dropped."""
    words = (w.lower() for w in _WORD.findall(split_run(name)[1]))
    return tuple(w for w in words if not _ORDER.fullmatch(w))


@lru_cache(maxsize=1 << 16)
def _squashed(name: str) -> str:
    return "".join(tokens(name))


@dataclass(frozen=True)
class _Match:
    """How well one name fits a role; ``rank`` orders the candidates (lower is better)."""

    name: str
    order: int
    eval_split: bool
    aggregate: bool
    per_epoch: bool
    sparse: bool
    weak: int
    others: tuple[str, ...]
    count: int | None
    #: What ``eval_split`` means for the role: a held-out split (training roles) or the least wanted one (eval).
    split_words: str = "a val/eval/test split"

    @property
    def rank(self) -> tuple:
        return (self.eval_split, self.aggregate, self.per_epoch, self.sparse, self.weak, len(self.others))

    def faults(self, best: _Match) -> str:
        """Why this name ranks below ``best``, in words (the first criterion that separates them)."""
        if self.eval_split and not best.eval_split:
            return self.split_words
        if self.aggregate and not best.aggregate:
            return "an aggregate (min/max/std)"
        if self.per_epoch and not best.per_epoch:
            return "per-epoch"
        if self.sparse and not best.sparse:
            return f"sparse: {_values(self.count)} against {best.count}, per-epoch, eval or end-of-run"
        if self.weak > best.weak:
            return "a looser spelling"
        if len(self.others) > len(best.others):
            return "more words: " + " ".join(self.others)
        return "equally good"


def _match(role: Role, name: str) -> tuple[int, tuple[str, ...]] | None:
    """``(weakness, remaining words)`` of ``name`` for ``role``, None when it does not name the quantity."""
    squashed = _squashed(name)
    if not any(needle in squashed for needle in role.needles):
        return None
    words = tokens(name)
    if role.exclude.intersection(words):
        return None
    for weak, phrases in enumerate((role.phrases, role.weaker)):
        for phrase in phrases:
            n = len(phrase)
            for start in range(len(words) - n + 1):
                if words[start : start + n] == phrase:
                    return weak, words[:start] + words[start + n :]
    for part in role.loose:
        for j, word in enumerate(words):
            if part in word:
                return 2, words[:j] + words[j + 1 :]
    return None


def _candidates(role: Role, names: Sequence[str], counts: Mapping[str, int] | None) -> list[_Match]:
    found = []
    # the phrase's own words are free too: Megatron's ``lm-loss-training/lm loss`` says "loss" twice
    free = NEUTRAL_WORDS | role.neutral | {w for p in role.phrases + role.weaker for w in p}
    for order, name in enumerate(names):
        m = _match(role, name)
        if m is None:
            continue
        weak, rest = m
        if role.require and not role.require.intersection(rest) and tokens(name) not in role.also:
            continue
        others = tuple(
            w
            for w in rest
            if w not in free and w not in EVAL_WORDS and w not in AGGREGATE_WORDS and w not in EPOCH_WORDS
        )
        # the first criterion: a held-out split for a training quantity; for a held-out role, its least wanted words
        split = role.last.intersection(rest) if role.require else EVAL_WORDS.intersection(rest)
        found.append(
            _Match(
                name=name,
                order=order,
                eval_split=bool(split),
                aggregate=bool(AGGREGATE_WORDS.intersection(rest)),
                per_epoch=bool(EPOCH_WORDS.intersection(rest)),
                sparse=False,
                weak=weak,
                others=others,
                count=None if counts is None else int(counts.get(name, 0)),
                split_words=f"a {'/'.join(sorted(role.last))} split" if role.require else "a val/eval/test split",
            )
        )
    if counts is not None and found:
        densest = max(m.count or 0 for m in found)
        found = [m if 2 * (m.count or 0) >= densest else replace(m, sparse=True) for m in found]
    return sorted(found, key=lambda m: (m.rank, m.order))


@dataclass(frozen=True)
class KeyChoice:
    """The key chosen for one role and why: what the summary and findings.json ``run.key_choice`` say.

    ``key`` is None when no name qualified; ``candidates`` lists every name that did, best first; ``tied`` the
    names as good as ``key`` (a true ambiguity: ``warning`` then names them and the flag that decides).
    """

    role: str
    key: str | None
    reason: str
    candidates: tuple[str, ...] = ()
    tied: tuple[str, ...] = ()
    given: bool = False
    warning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (findings.json ``run.key_choice[role]``)."""
        return {
            "key": self.key,
            "reason": self.reason,
            "candidates": list(self.candidates),
            "tied": list(self.tied),
            "given": self.given,
        }


def choose_key(
    columns: Iterable[str],
    role: str | Role,
    *,
    given: str | None = None,
    counts: Mapping[str, int] | None = None,
    required: bool = False,
    left_out: Mapping[str, str] | None = None,
) -> KeyChoice:
    """Choose the metric for ``role`` (``loss``, ``grad_norm``, ``lr``, ``throughput``) among ``columns``.

    ``given`` wins and must be one of ``columns`` (ForensicsError otherwise). ``counts`` (values written per metric)
    lets a sparse series lose to a dense one of the same name quality. ``required``: no candidate is a
    ForensicsError rather than a choice with ``key=None``. Deterministic: the same names give the same choice.
    ``left_out``: fields the sources logged with no numeric value (``{name: why}``, a metrics table's
    ``attrs[LEFT_OUT]``), so that a loss column of text is named as such rather than reported missing.
    """
    r = ROLES[role] if isinstance(role, str) else role
    names = [str(c) for c in columns]
    matches = _candidates(r, names, counts)
    cands = tuple(m.name for m in matches)
    left_out = dict(left_out or {})
    if given:
        if given not in names and given in left_out:
            raise ForensicsError(
                f"{r.what} key '{given}' holds no number: {left_out[given]}; expected a column of numbers"
            )
        if given not in names:
            close = [n for n in names if n.lower() == given.lower()] or [m.name for m in matches[:3]]
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            raise ForensicsError(
                f"{r.what} key '{given}' is not among the metrics{hint}; the metrics are {_listing(names)}"
            )
        return KeyChoice(r.name, given, f"given ({r.flag or 'by the caller'})", cands, given=True)
    if not matches:
        unusable = [m.name for m in _candidates(r, list(left_out), None)]
        if required and unusable:
            raise ForensicsError(
                f"no {r.what} column found: {left_out[unusable[0]]}; expected a column of numbers "
                f"(or give {r.flag or 'the key'})"
            )
        if required:
            raise ForensicsError(
                f"no {r.what} column found: no metric name holds "
                f"{' or '.join(repr(' '.join(p)) for p in r.phrases[:3])}{r.note}; "
                f"give {r.flag or 'it'}; "
                f"the metrics are {_listing(names) or 'none'}"
            )
        article = "an" if r.what[:1] in "aeiou" else "a"
        return KeyChoice(r.name, None, f"no metric name holds {article} {r.what}", ())
    best = matches[0]
    tied = [m for m in matches if m.rank == best.rank]
    reason = _reason(r, best, matches)
    warning = None
    if len(tied) > 1:
        others = ", ".join(f"'{m.name}'" for m in tied[1:4]) + (f" (+{len(tied) - 4})" if len(tied) > 4 else "")
        warning = (
            f"{r.what} key: '{best.name}' and {others} are equally good names; analysed '{best.name}' "
            f"(the first); give {r.flag or 'the key explicitly'} to choose"
        )
        reason += "; tied with " + others
    elif best.eval_split and r is LOSS:
        warning = (
            f"loss key: only val/eval/test losses are logged; analysed '{best.name}'; "
            f"give {r.flag} to choose another metric"
        )
    return KeyChoice(r.name, best.name, reason, cands, tuple(m.name for m in tied), warning=warning)


def _reason(role: Role, best: _Match, matches: list[_Match]) -> str:
    what = f"names the {role.what}"
    words = tokens(best.name)
    marks = [mark for mark, on in (("per-step", "step" in words), ("train split", "train" in words)) if on]
    if best.count is not None:
        marks.append(_values(best.count))
    head = what + (f" ({', '.join(marks)})" if marks else "")
    beaten = [(m, m.faults(best)) for m in matches[1:] if m.rank != best.rank]
    if not matches[1:]:
        return head + "; the only candidate"
    if beaten:
        head += "; preferred over " + ", ".join(f"'{m.name}' ({why})" for m, why in beaten[:3])
        if len(beaten) > 3:
            head += f" and {len(beaten) - 3} more"
    return head


def _values(n: int | None) -> str:
    return counted(n, "value")


def _listing(names: Sequence[str], n: int = 12) -> str:
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


# --- the first version's functions, now thin wrappers ---------------------------------------------------------------
def find_column(columns: Iterable[str], keys: Sequence[str], contains: Sequence[str] = ()) -> str | None:
    """The column that best names one of ``keys`` (read as words: case and punctuation ignored), else one holding
    one of ``contains`` inside a word; None when absent. The same ranking as :func:`choose_key`."""
    role = Role("column", tuple(tokens(k) for k in keys if tokens(k)), loose=tuple(contains))
    return choose_key(columns, role).key


def find_loss_key(columns: Iterable[str], given: str | None = None, left_out: Mapping[str, str] | None = None) -> str:
    """The loss column: ``given`` when set (it must exist), else the best-named loss (ForensicsError when none);
    ``left_out`` as in :func:`choose_key`."""
    return choose_key(
        columns,
        LOSS,
        given=given,
        required=True,  # type: ignore[return-value]
        left_out=left_out,
    ).key


def grad_norm_column(columns: Iterable[str]) -> str | None:
    """The grad-norm metric among ``columns`` (``grad_norm``, ``grad-norm``, ``total_grad_norm``, ...)."""
    return choose_key(columns, GRAD_NORM).key


def lr_column(columns: Iterable[str]) -> str | None:
    """The learning-rate metric among ``columns`` (``lr``, ``learning_rate``, ``lr-AdamW``, ...)."""
    return choose_key(columns, LR).key


def eval_loss_column(columns: Iterable[str], loss_key: str | None = None) -> str | None:
    """The held-out loss among ``columns`` (``eval/loss``, ``val_loss``, ``lm loss validation``, Megatron's ``lm loss
    value``), never the training loss key itself; None when absent."""
    key = choose_key(columns, EVAL_LOSS).key
    return None if key == loss_key else key


def tokens_per_s_column(columns: Iterable[str]) -> str | None:
    """The throughput metric among ``columns`` (tokens per second before samples per second)."""
    return choose_key(columns, THROUGHPUT).key


def loss_scale_column(columns: Iterable[str]) -> str | None:
    """The fp16 loss scale among ``columns`` (Megatron's ``loss scale``, ``loss_scale``, ``grad_scale``)."""
    return choose_key(columns, LOSS_SCALE).key


def skipped_iterations_column(columns: Iterable[str]) -> str | None:
    """The count of skipped updates (Megatron's ``number of skipped iterations``, OLMo-core's ``optim/step
    skipped``)."""
    return choose_key(columns, SKIPPED_ITERATIONS).key


def nan_iterations_column(columns: Iterable[str]) -> str | None:
    """The count of NaN steps (Megatron's ``number of nan iterations``)."""
    return choose_key(columns, NAN_ITERATIONS).key


def max_loss_column(columns: Iterable[str]) -> str | None:
    """The worst rank's loss (torchtitan's ``global_max_loss``, beside ``global_avg_loss``, the loss key)."""
    return choose_key(columns, MAX_LOSS).key


def update_norm_column(columns: Iterable[str]) -> str | None:
    """An update norm (``optim/update norm``, ``update_norm``)."""
    return choose_key(columns, UPDATE_NORM).key


def params_norm_column(columns: Iterable[str]) -> str | None:
    """The norm of the weights (Megatron's ``params norm``, ``param_norm``, ``weight norm``)."""
    return choose_key(columns, PARAMS_NORM).key


def num_zeros_column(columns: Iterable[str]) -> str | None:
    """The count of zero gradient entries (Megatron's ``num zeros``, ``num_zeros_in_grad``)."""
    return choose_key(columns, NUM_ZEROS).key


def z_loss_column(columns: Iterable[str]) -> str | None:
    """The z loss (OLMo-core's ``train/Z loss``, ``z_loss``)."""
    return choose_key(columns, Z_LOSS).key


def key_choices_section(*choices: KeyChoice) -> dict[str, Any]:
    """findings.json ``run`` fields for the chosen keys: ``loss_key``, ``grad_norm_key`` and ``key_choice``."""
    out: dict[str, Any] = {}
    for c in choices:
        out[f"{c.role}_key"] = c.key
    out["key_choice"] = {c.role: c.to_dict() for c in choices}
    return out


def key_line(run: dict[str, Any]) -> str:
    """The summary's line on the chosen keys, from findings.json ``run`` (empty for a file without ``key_choice``):
    ``loss = train_loss_step: names the loss (per-step, ...); preferred over ... | grad norm = grad_norm``."""
    choice = run.get("key_choice") or {}
    parts = []
    loss = choice.get("loss")
    if loss and loss.get("key"):
        parts.append(f"loss = {loss['key']}: {loss.get('reason', '')}")
    grad = choice.get("grad_norm")
    if grad and grad.get("key"):
        tied = [t for t in grad.get("tied") or [] if t != grad["key"]]
        parts.append(f"grad norm = {grad['key']}" + (f" (tied with {', '.join(tied)})" if tied else ""))
    return " | ".join(parts)


def is_training_quantity(name: str, loss_key: str | None, grad_norm_key: str | None = None) -> bool:
    """Whether ``name`` is a training quantity (docs/concepts.md) rather than context.

    The loss key and the grad-norm key are; so is any other metric with ``loss`` or ``norm`` among its words (or
    ending a word: ``totalloss``, ``layernorm``) and no ``val``/``eval``/``test`` word. The fp16 loss scale
    (``loss_scale``, ``loss-scale``) is a mixed-precision setting, not a quantity that goes wrong, so it is context.
    Timing, throughput, lr and eval-only fields are context.
    """
    if name in (loss_key, grad_norm_key):
        return True
    words = tokens(name)
    if EVAL_WORDS.intersection(words) or _SCALE_WORDS.intersection(words):
        return False
    return any(w.endswith(("loss", "norm", "losses", "norms")) for w in words)
