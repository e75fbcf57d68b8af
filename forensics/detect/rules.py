"""The rules the audit runs, in order, each built from the run configuration's ``[detect.<rule>]`` table.

A rule is a :class:`~forensics.detect.base.Rule` in a module of its own. The built-in rules are listed by where
they live (imported when an audit builds them); another rule joins with :func:`register_rule` (and its finding kind
with :func:`forensics.detect.kinds.register_kind`): nothing else has to change for its findings to reach
findings.json, the summary, the report and ``--fail-on``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from forensics.detect.base import Rule
from forensics.errors import ForensicsError

#: Built-in rules in the order they run: detectors first, then the rules that read their findings.
BUILTIN_RULES = (
    "forensics.detect.spike_rule:SpikeRule",
    "forensics.detect.alignment:AlignmentRule",
    "forensics.detect.nonfinite:NonfiniteRule",
    "forensics.detect.oscillation:OscillationRule",
    "forensics.detect.composition:CompositionRule",
    "forensics.detect.attribution:AttributionRule",
    "forensics.detect.recurrence:RecurrenceRule",
    "forensics.detect.forgetting:ForgettingRule",
    "forensics.detect.causes:CauseRule",
)
_REGISTERED: dict[str, type[Rule]] = {}


def register_rule(cls: type[Rule]) -> type[Rule]:
    """Add a rule (runs after the built-in ones, in registration order); usable as a class decorator."""
    if not cls.name:
        raise ValueError(f"{cls.__name__}: a rule needs a name (its [detect.<name>] table)")
    _REGISTERED[cls.name] = cls
    return cls


def unregister_rule(name: str) -> None:
    """Remove a registered rule (tests use it to clean up)."""
    _REGISTERED.pop(name, None)


def rule_classes() -> list[type[Rule]]:
    """Every rule, built-in first."""
    out = []
    for spec in BUILTIN_RULES:
        module, cls = spec.split(":")
        out.append(getattr(importlib.import_module(module), cls))
    return out + [c for c in _REGISTERED.values() if c not in out]


def parameters(cls: type[Rule]) -> dict[str, Any]:
    """A rule's parameters and their defaults (its constructor's keyword arguments)."""
    sig = inspect.signature(cls.__init__)
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n: p.default for n, p in sig.parameters.items() if n != "self" and p.kind in kinds}


def build_rules(params: Mapping[str, Mapping[str, Any]] | None = None, *, has_plan: bool = True) -> list[Rule]:
    """The rules of an audit with their parameters from ``params`` (run.toml's ``[detect]`` tables, ``--set``).

    An unknown rule or parameter is bad input naming it and what exists, so a typo never passes silently.
    """
    params = dict(params or {})
    classes = rule_classes()
    by_name = {c.name: c for c in classes}
    unknown = sorted(set(params) - set(by_name))
    if unknown:
        raise ForensicsError(f"detect.{unknown[0]}: no such rule; the rules are {', '.join(sorted(by_name))}")
    rules = []
    for cls in classes:
        given = dict(params.get(cls.name, {}))
        known = parameters(cls)
        bad = sorted(set(given) - set(known))
        if bad:
            raise ForensicsError(f"detect.{cls.name}: unknown parameter '{bad[0]}'; its parameters are "
                                 f"{', '.join(sorted(known)) or 'none'}")
        if cls.needs_plan and not has_plan:
            continue
        rule = cls(**given)
        rule._check()
        rules.append(rule)
    return rules
