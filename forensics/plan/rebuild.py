"""Rebuild a plan by calling a builder once per epoch (``--builder``).

A builder is ``builder(samples, epoch, seed) -> list[list[sample_id]]``, a pure function of its arguments. It is
named as the name of a reference builder (``static_sorted``, ...), ``module:function`` (the current folder is
importable) or ``path/to/file.py:function``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from functools import partial
from pathlib import Path

import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.builders import REFERENCE_BUILDERS, Builder
from forensics.plan.step_mapping import batches_to_plan


def resolve_builder(spec: str, **params: object) -> Builder:
    """The builder named by ``spec``; ``params`` (token_budget, max_len, boundaries, ...) are passed on to it
    when its signature accepts them, so a user's builder need not take them."""
    if spec in REFERENCE_BUILDERS:
        fn = REFERENCE_BUILDERS[spec]
    elif ":" in spec:
        target, _, name = spec.rpartition(":")
        module = _import_target(target, spec)
        fn = getattr(module, name, None)
        if fn is None or not callable(fn):
            raise ForensicsError(f"--builder {spec}: '{target}' has no function '{name}'")
    else:
        raise ForensicsError(
            f"--builder {spec}: expected a reference builder ({', '.join(REFERENCE_BUILDERS)}), "
            "module:function or path/to/file.py:function"
        )
    accepted = _accepted(fn, params)
    return partial(fn, **accepted) if accepted else fn


def _import_target(target: str, spec: str):
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target)
        if not path.exists():
            raise ForensicsError(f"--builder {spec}: file {path} does not exist")
        mod_name = f"_forensics_builder_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ForensicsError(f"--builder {spec}: {path} is not an importable Python file")
        module = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            raise ForensicsError(f"--builder {spec}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise ForensicsError(f"--builder {spec}: cannot import module '{target}': {exc}") from exc
    except Exception as exc:  # the user's module raised while importing
        raise ForensicsError(f"--builder {spec}: importing '{target}' failed: {type(exc).__name__}: {exc}") from exc


def _accepted(fn, params: dict) -> dict:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return {k: v for k, v in params.items() if v is not None}
    return {k: v for k, v in params.items() if k in sig.parameters and v is not None}


def rebuild_plan(samples: pd.DataFrame, builder: Builder, epochs: int, seed: int = 0) -> pd.DataFrame:
    """Call ``builder`` for epochs ``0..epochs-1``: a plan in (``epoch``, ``batch_id``, ``sample_id``) form."""
    per_epoch = []
    for epoch in range(epochs):
        try:
            batches = builder(samples, epoch, seed)
            per_epoch.append([[int(s) for s in b] for b in batches])
        except ForensicsError:
            raise
        except Exception as exc:
            raise ForensicsError(
                f"the builder failed on epoch {epoch} (it must return a list of batches of "
                f"sample ids): {type(exc).__name__}: {exc}"
            ) from exc
    return batches_to_plan(per_epoch)
