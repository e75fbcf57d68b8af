"""What each batching strategy of the story would cost, measured by running the reference builders for real.

For static sorted, bucketed (given and optimal boundaries, same K), shuffle-then-sort and random, the builders of
:mod:`forensics.plan.builders` pack the samples under the same token budget; from their batches come the batches and
steps per epoch, the padding efficiency (real / padded tokens, a batch padded to ``size x longest``), and the spread
of real and padded tokens per optimizer step.

Throughput is not measured here, it is scaled, under one stated assumption: **the GPU processes padded tokens at a
constant rate**, whatever the batch composition. Then real tokens/s is proportional to padding efficiency, and a
real-token throughput ``X`` measured on the static sorted plan gives ``X * eff_strategy / eff_sorted`` for another
strategy. The story measured about 30,000 tok/s on its sorted plan, hence the default. Attention's cost grows faster
than linearly with length and small batches use the GPU less well, so treat the figures as first-order estimates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.builders import bucketed_shuffle, random_shuffle, shuffle_then_sort, static_sorted
from forensics.plan.optimal_boundaries import batch_tokens, conform_boundaries, optimal_boundaries
from forensics.schema import DEFAULT_BOUNDARIES, MAX_BATCH_SIZE, MAX_LEN, N_TOKENS, SAMPLE_ID, TOKEN_BUDGET, Case

#: Real-token throughput the story measured on its static sorted plan (tok/s).
STORY_TOKENS_PER_S = 30_000.0

#: The strategies compared, in the order the story meets them.
STRATEGIES = ("static_sorted", "bucketed_given", "bucketed_optimal", "shuffle_then_sort", "random_shuffle")

ASSUMPTION = (
    "the GPU processes padded tokens at a constant rate, so real tok/s = X * eff_strategy / eff_sorted, where X is "
    "the real-token throughput measured on the static sorted plan"
)


@dataclass
class Spread:
    """How much a per-step quantity varies: mean, standard deviation, 5th/95th percentile, coefficient of variation."""

    mean: float
    std: float
    p5: float
    p95: float
    cv: float

    @classmethod
    def of(cls, values: np.ndarray) -> Spread:
        v = np.asarray(values, dtype=np.float64)
        if not len(v):
            return cls(0.0, 0.0, 0.0, 0.0, 0.0)
        mean, std = float(v.mean()), float(v.std())
        p5, p95 = (float(x) for x in np.percentile(v, [5, 95]))
        return cls(mean, std, p5, p95, std / mean if mean else 0.0)


@dataclass
class StrategyOutcome:
    """One strategy's figures over the simulated epochs."""

    name: str
    builder: str
    boundaries: list[int] | None
    batches_per_epoch: float
    steps_per_epoch: float
    padding_efficiency: float
    real_tokens: int
    padded_tokens: int
    real_tokens_per_step: Spread
    padded_tokens_per_step: Spread
    tokens_per_s: float = 0.0
    throughput_vs_sorted: float = 0.0
    epoch_seconds: float = 0.0


@dataclass
class WhatIf:
    """Every strategy's outcome and the settings they were built under."""

    strategies: list[StrategyOutcome]
    token_budget: int
    max_len: int
    max_batch_size: int
    grad_accum: int
    world_size: int
    epochs: int
    seed: int
    tokens_per_s_measured: float
    n_samples: int = 0
    assumption: str = ASSUMPTION
    warnings: list[str] = field(default_factory=list)

    def by_name(self, name: str) -> StrategyOutcome:
        for s in self.strategies:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def random_over_sorted(self) -> float:
        """Random shuffle's throughput as a share of the static sorted one (the story: about 0.4)."""
        return self.by_name("random_shuffle").throughput_vs_sorted

    def to_dict(self) -> dict:
        out = asdict(self)
        out["random_over_sorted"] = self.random_over_sorted
        return out

    to_json = to_dict


def step_tokens(per_batch: np.ndarray, batches_per_step: int) -> np.ndarray:
    """Tokens per optimizer step of one epoch: consecutive groups of ``G x W`` batches (round robin, docs/concepts.md);
    a partial group at the epoch's end is a step of its own."""
    per_batch = np.asarray(per_batch, dtype=np.int64)
    if not len(per_batch):
        return per_batch
    starts = np.arange(0, len(per_batch), batches_per_step)
    return np.add.reduceat(per_batch, starts)


def strategy_builders(
    given: Sequence[int], optimal: Sequence[int]
) -> list[tuple[str, str, list[int] | None, Callable[..., list[list[int]]]]]:
    """(name, builder name, boundaries, builder) of each strategy, in the order the story meets them."""
    given, optimal = list(given), list(optimal)
    return [
        ("static_sorted", "static_sorted", None, static_sorted),
        ("bucketed_given", "bucketed_shuffle", given, _with_boundaries(given)),
        ("bucketed_optimal", "bucketed_shuffle", optimal, _with_boundaries(optimal)),
        ("shuffle_then_sort", "shuffle_then_sort", None, shuffle_then_sort),
        ("random_shuffle", "random_shuffle", None, random_shuffle),
    ]


def _with_boundaries(boundaries: list[int]) -> Callable[..., list[list[int]]]:
    def build(samples: pd.DataFrame, epoch: int, seed: int = 0, **kw) -> list[list[int]]:
        return bucketed_shuffle(samples, epoch, seed, boundaries=boundaries, **kw)

    return build


def whatif(
    lengths: np.ndarray,
    *,
    token_budget: int = TOKEN_BUDGET,
    boundaries: Sequence[int] = DEFAULT_BOUNDARIES,
    tokens_per_s: float = STORY_TOKENS_PER_S,
    max_len: int = MAX_LEN,
    max_batch_size: int = MAX_BATCH_SIZE,
    grad_accum: int = 1,
    world_size: int = 1,
    epochs: int = 1,
    seed: int = 0,
    on_strategy: Callable[[str], None] | None = None,
) -> WhatIf:
    """Build ``epochs`` epochs with every strategy on these sample lengths and measure what each costs.

    ``boundaries`` are fitted to ``max_len`` (see :func:`conform_boundaries`); the optimal boundaries have the same
    number of buckets. ``on_strategy(name)`` is called before each strategy is built (for a progress bar).
    """
    for key, value in (
        ("token_budget", token_budget),
        ("max_len", max_len),
        ("max_batch_size", max_batch_size),
        ("grad_accum", grad_accum),
        ("world_size", world_size),
        ("epochs", epochs),
    ):
        if int(value) < 1:
            raise ForensicsError(f"whatif: {key} must be >= 1; got {value}")
    if not tokens_per_s > 0:
        raise ForensicsError(f"whatif: tokens_per_s must be > 0; got {tokens_per_s}")
    capped = np.minimum(np.asarray(lengths, dtype=np.int64).ravel(), max_len)
    if not len(capped):
        raise ForensicsError("whatif: no samples")
    given = conform_boundaries(boundaries, max_len)
    warnings = []
    if given != [int(b) for b in boundaries]:
        warnings.append(f"boundaries {list(boundaries)} fitted to max_len {max_len}: {given}")
    optimal = optimal_boundaries(capped, len(given) - 1, max_len)
    frame = pd.DataFrame({SAMPLE_ID: np.arange(len(capped), dtype=np.int64), N_TOKENS: capped})
    per_step = grad_accum * world_size
    outcomes = []
    for name, builder_name, bounds, build in strategy_builders(given, optimal):
        if on_strategy:
            on_strategy(name)
        real_steps, padded_steps, n_batches, n_steps = [], [], [], []
        for epoch in range(epochs):
            batches = build(
                frame, epoch, seed, token_budget=token_budget, max_len=max_len, max_batch_size=max_batch_size
            )
            real, padded = batch_tokens(batches, capped)
            real_steps.append(step_tokens(real, per_step))
            padded_steps.append(step_tokens(padded, per_step))
            n_batches.append(len(batches))
            n_steps.append(len(real_steps[-1]))
        real_all, padded_all = np.concatenate(real_steps), np.concatenate(padded_steps)
        outcomes.append(
            StrategyOutcome(
                name=name,
                builder=builder_name,
                boundaries=bounds,
                batches_per_epoch=float(np.mean(n_batches)),
                steps_per_epoch=float(np.mean(n_steps)),
                padding_efficiency=float(real_all.sum() / padded_all.sum()),
                real_tokens=int(real_all.sum()),
                padded_tokens=int(padded_all.sum()),
                real_tokens_per_step=Spread.of(real_all),
                padded_tokens_per_step=Spread.of(padded_all),
            )
        )
    sorted_eff = outcomes[0].padding_efficiency
    for o in outcomes:
        o.throughput_vs_sorted = o.padding_efficiency / sorted_eff
        o.tokens_per_s = float(tokens_per_s) * o.throughput_vs_sorted
        o.epoch_seconds = o.real_tokens / epochs / o.tokens_per_s
    return WhatIf(
        strategies=outcomes,
        token_budget=int(token_budget),
        max_len=int(max_len),
        max_batch_size=int(max_batch_size),
        grad_accum=int(grad_accum),
        world_size=int(world_size),
        epochs=int(epochs),
        seed=int(seed),
        tokens_per_s_measured=float(tokens_per_s),
        n_samples=int(len(capped)),
        warnings=warnings,
    )


def whatif_case(
    case: Case,
    *,
    tokens_per_s: float = STORY_TOKENS_PER_S,
    epochs: int = 1,
    seed: int = 0,
    on_strategy: Callable[[str], None] | None = None,
) -> WhatIf:
    """``forensics whatif``: the strategies on the case's samples, under its run configuration (token budget,
    max_len, max batch size, step mapping; its boundaries, else the story's for the "given" strategy)."""
    from forensics.schema import load_samples

    cfg = case.config
    if cfg.samples is None:
        raise ForensicsError("whatif needs the samples: give a case folder or --samples")
    samples = load_samples(case.samples_path)
    if samples.empty:
        raise ForensicsError(f"samples {case.samples_path}: the table has no rows")
    return whatif(
        samples[N_TOKENS].to_numpy(),
        token_budget=cfg.token_budget,
        boundaries=list(cfg.boundaries) if cfg.boundaries else DEFAULT_BOUNDARIES,
        tokens_per_s=tokens_per_s,
        max_len=cfg.max_len,
        max_batch_size=cfg.max_batch_size,
        grad_accum=cfg.grad_accum,
        world_size=cfg.world_size,
        epochs=epochs,
        seed=seed,
        on_strategy=on_strategy,
    )
