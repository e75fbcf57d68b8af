"""Metric names of nested values: one rule for how a value logged under nested keys is named as a metric column.

Trainers log nested structures (``{"opt": {"lr": 1e-3}}`` in a JSONL line, a W&B history row, an Arrow struct
column, W&B's ``nested_key`` path); the metrics table is flat, one column per name, and the loss-key lookup and every
rule match those names. The same value must get the same name whichever source carried it, or a run read from two
sources would split one metric into two columns: the parts are joined with ``/`` (``opt/lr``), outermost first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: What joins the parts of a nested key: ``{"opt": {"lr": x}}`` is the metric ``opt/lr``.
KEY_SEPARATOR = "/"


def nested_key(*parts: str) -> str:
    """The metric name of a value nested under ``parts``, outermost first (``nested_key("opt", "lr") == "opt/lr"``)."""
    return KEY_SEPARATOR.join(str(p) for p in parts)


def flatten_keys(
    obj: Mapping[str, Any],
    prefix: str | None = None,
    *,
    is_leaf: Callable[[Mapping[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """Nested mappings -> one level: each leaf under its :func:`nested_key` name, in first-seen order.

    Every value that is not a mapping is a leaf, kept as it is (numbers, text, lists, ``None``: what a value means is
    the reader's business, not the name's). ``prefix``: the name the mapping itself sits under, if any (``""`` is a
    name too: its children are ``/x``). ``is_leaf(mapping)``: a mapping to keep whole instead of descending into it
    (W&B's media values, dicts with a ``_type``). A name seen twice keeps its last value, as a later key of a JSON
    object does.
    """
    out: dict[str, Any] = {}
    _flatten_into(out, obj, prefix, is_leaf)
    return out


def _flatten_into(
    out: dict[str, Any],
    obj: Mapping[str, Any],
    prefix: str | None,
    is_leaf: Callable[[Mapping[str, Any]], bool] | None,
) -> None:
    for k, v in obj.items():
        name = str(k) if prefix is None else nested_key(prefix, k)
        if isinstance(v, Mapping) and not (is_leaf is not None and is_leaf(v)):
            _flatten_into(out, v, name, is_leaf)
        else:
            out[name] = v
