"""``forensics check-plan`` on a case folder: the gate's own options, checked once, and the case's settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from forensics.engine import engine_of
from forensics.errors import ForensicsError
from forensics.plan.gate.check import check_plan
from forensics.plan.gate.result import GateResult
from forensics.plan.optimal_boundaries import resolve_boundaries
from forensics.plan.step_mapping import check_mapping
from forensics.schema import DEFAULT_BOUNDARIES, PLAN_INT_COLUMNS, Case, load_plan, load_samples
from forensics.schema.case import check_tables


@dataclass(frozen=True)
class GateOptions:
    """The gate's own limits, when given (each 0-1; ``allow_drop_last`` samples an epoch may miss)."""

    max_pair_retention: float | None = None
    max_identical_batches: float | None = None
    allow_drop_last: int | None = None
    min_padding_efficiency: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_pair_retention", "max_identical_batches", "min_padding_efficiency"):
            v = getattr(self, name)
            if v is not None and not 0 <= v <= 1:
                raise ForensicsError(f"check-plan: {name} must be between 0 and 1; got {v}")
        if self.allow_drop_last is not None and (not isinstance(self.allow_drop_last, int) or self.allow_drop_last < 0):
            raise ForensicsError(f"check-plan: allow_drop_last must be a whole number >= 0; got {self.allow_drop_last}")


def check_case(
    case: Case,
    *,
    builder: str | Callable | None = None,
    epochs: int | None = None,
    seed: int = 0,
    options: GateOptions = GateOptions(),
) -> GateResult:
    """``forensics check-plan``: the case's plan (or ``builder`` called per epoch on its samples) judged with the
    case's run configuration (step mapping, token budget, max_len, boundaries: named, else fitted to the samples)."""
    cfg = case.config
    if builder is None and cfg.plan is None:
        raise ForensicsError("check-plan needs a plan (--plan, or plan.parquet in the case) or --builder")
    check_tables(case.plan_path if builder is None else None, case.samples_path if cfg.samples else None)
    samples = load_samples(case.samples_path) if cfg.samples else None
    plan = None
    engine = engine_of(cfg, case.plan_path) if builder is None else None
    if engine is not None and engine.name != "pandas":  # the engine reads the plan where it lies
        plan = case.plan_path
    elif builder is None:
        # Epochs are compared by batch_id, so the plan is not mapped to steps here (on a 10M-row plan that was half
        # of the command's time); only the cluster mix needs steps, and it maps them itself with the same settings.
        plan = load_plan(case.plan_path, samples, columns=PLAN_INT_COLUMNS)
        check_mapping(plan, cfg.grad_accum, cfg.world_size, cfg.rank_split)
    if cfg.boundaries:
        boundaries = list(cfg.boundaries)
    elif samples is not None and len(samples):
        boundaries = resolve_boundaries(None, samples, cfg.max_len, cfg.n_buckets)
    else:
        boundaries = list(DEFAULT_BOUNDARIES)
    source = f"plan {case.plan_path}" if builder is None else f"builder {builder}"
    try:
        return check_plan(
            plan,
            samples,
            builder=builder,
            epochs=epochs,
            seed=seed,
            token_budget=cfg.token_budget if "token_budget" in cfg.given else None,
            max_len=cfg.max_len,
            boundaries=boundaries,
            max_pair_retention=options.max_pair_retention,
            max_identical_batches=options.max_identical_batches,
            allow_drop_last=options.allow_drop_last,
            min_padding_efficiency=options.min_padding_efficiency,
            grad_accum=cfg.grad_accum,
            world_size=cfg.world_size,
            rank_split=cfg.rank_split,
            source=source,
            engine=engine,
        )
    finally:
        if engine is not None:
            engine.close()
