"""Engines: where the computations that grow with the plan run (docs/architecture.md, docs/scale.md).

``pandas`` holds the plan in memory; ``duckdb`` (a core dependency) reads its Parquet parts out of core under a
memory limit, spilling to disk; ``dask`` (the ``[dask]`` extra) runs them on a ``distributed`` cluster. ``auto`` is
pandas while the plan's Arrow size is under a quarter of the memory limit, DuckDB beyond. Every engine answers the
interface of :mod:`forensics.engine.base` with the same integer counts, from which one shared piece of numpy makes
every figure, so they give the same numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

from forensics.engine.base import Engine, PlanInput
from forensics.engine.pandas_engine import PandasEngine
from forensics.engine.source import arrow_size, memory_limit, parse_size
from forensics.errors import ForensicsError

ENGINES = ("auto", "pandas", "duckdb", "dask")


def choose_engine(name: str, plan: PlanInput | None, limit: str | int | None = None) -> str:
    """The engine ``auto`` means for this plan (other names stand): pandas while the plan's Arrow size is under a
    quarter of the memory limit (default half the available memory), else DuckDB."""
    if name not in ENGINES:
        raise ForensicsError(f"--engine must be one of {', '.join(ENGINES)}; got {name!r}")
    if name != "auto":
        return name
    if plan is None or not isinstance(plan, (str, Path)):
        return "pandas"
    return "pandas" if arrow_size(plan) < memory_limit(limit) / 4 else "duckdb"


def get_engine(
    name: str = "auto",
    plan: PlanInput | None = None,
    memory_limit: str | int | None = None,
    scheduler: str | None = None,
    say: bool = False,
) -> Engine:
    """The engine to run a plan's computations on (``say``: name it on stderr when ``auto`` chose)."""
    chosen = choose_engine(name, plan, memory_limit)
    if say and name == "auto" and chosen != "pandas":
        print(f"engine: {chosen} (the plan passes a quarter of the memory limit)", file=sys.stderr)
    if chosen == "pandas":
        return PandasEngine()
    if chosen == "duckdb":
        from forensics.engine.duckdb_engine import DuckDBEngine

        return DuckDBEngine(memory_limit)
    from forensics.engine.dask_engine import DaskEngine

    return DaskEngine(scheduler, memory_limit)


def engine_of(config, plan: PlanInput | None = None) -> Engine:
    """The engine a case's run configuration names (``engine``, ``memory_limit``, ``scheduler``) for ``plan``."""
    return get_engine(config.engine, plan, config.memory_limit, config.scheduler, say=True)


__all__ = ["ENGINES", "Engine", "PandasEngine", "choose_engine", "engine_of", "get_engine", "parse_size"]
