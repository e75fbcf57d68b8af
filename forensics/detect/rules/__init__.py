"""The rules the audit runs, one module each, in order, each built from run.toml's ``[detect.<rule>]`` table.

A rule is a :class:`~forensics.detect.base.Rule`. The built-in rules are listed by where they live (imported when
an audit builds them): the spike rule (:mod:`forensics.detect.spikes`), then this package's rules, then the cause
grouping (:mod:`forensics.detect.causes`), which reads every finding. Another rule joins with :func:`register_rule`
(and its finding kind with :func:`forensics.detect.kinds.register_kind`): nothing else has to change for its findings
to reach findings.json, the summary, the report and ``--fail-on``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.errors import ForensicsError

#: Built-in rules in the order they run: detectors first, then the rules that read their findings.
BUILTIN_RULES = (
    "forensics.detect.spikes.rule:SpikeRule",
    "forensics.detect.rules.grad_norm:GradNormRule",
    "forensics.detect.rules.alignment:AlignmentRule",
    "forensics.detect.rules.nonfinite:NonfiniteRule",
    "forensics.detect.rules.oscillation:OscillationRule",
    "forensics.detect.rules.composition:CompositionRule",
    "forensics.detect.rules.attribution:AttributionRule",
    "forensics.detect.rules.recurrence:RecurrenceRule",
    "forensics.detect.rules.harmful_samples:HarmfulSamplesRule",
    "forensics.detect.rules.forgetting:ForgettingRule",
    "forensics.detect.rules.divergence:DivergenceRule",
    "forensics.detect.rules.overfitting:OverfittingRule",
    "forensics.detect.rules.plateau:PlateauRule",
    "forensics.detect.rules.lr_schedule:LrScheduleRule",
    "forensics.detect.rules.restart:RestartRule",
    "forensics.detect.rules.crash:CrashRule",
    "forensics.detect.rules.throughput:ThroughputRule",
    "forensics.detect.rules.memory:MemoryRule",
    "forensics.detect.rules.epoch_boundary:EpochBoundaryRule",
    "forensics.detect.rules.resume_data:ResumeDataRule",
    "forensics.detect.rules.rank_drift:RankDriftRule",
    "forensics.detect.causes.grouping:CauseRule",
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
    """A rule's parameters and their defaults."""
    return cls.parameter_defaults()


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
            raise ForensicsError(
                f"detect.{cls.name}: unknown parameter '{bad[0]}'; its parameters are "
                f"{', '.join(sorted(known)) or 'none'}"
            )
        if cls.needs_plan and not has_plan:
            continue
        rule = cls(**given)
        rule.validate()
        rules.append(rule)
    return rules


@dataclass
class Judged:
    """What the rules found: every finding, the findings.json sections the rules filled, and their warnings."""

    found: list[Finding] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def run_rules(
    rules: Sequence[Rule],
    run: RunTables,
    *,
    found: Sequence[Finding] = (),
    given: Mapping[str, list[Finding]] | None = None,
    stage: Callable[[str], Any] | None = None,
) -> Judged:
    """Each rule in order on ``run``, each seeing the findings of the ones before it: the audit's loop, and the live
    loop's (which passes ``given``: a rule's findings already computed online, used instead of running it, and
    ``found``: findings of earlier rules it keeps from the audit).

    ``stage(name)`` is a context manager factory showing progress: one stage for all the rules, whose line names
    the slowest ones (:func:`slowest_rules`), not a line per rule."""
    out = Judged(found=list(found))
    given = dict(given or {})
    seconds: dict[str, float] = {}
    with stage("rules") if stage is not None else nullcontext() as note:
        for rule in rules:
            t0 = time.perf_counter()
            if rule.name in given:
                new, rule.section_, rule.warnings_ = list(given[rule.name]), None, []
            else:
                new = rule.detect(run, out.found)
            seconds[rule.name] = time.perf_counter() - t0
            if rule.replaces:
                out.found = [f for f in out.found if f.kind != rule.replaces] + new
            else:
                out.found += new
            if rule.section_name and rule.section_ is not None:
                out.sections[rule.section_name] = run.sections[rule.section_name] = rule.section_
            out.warnings += list(getattr(rule, "warnings_", None) or [])
        if note is not None and hasattr(note, "detail"):
            note.detail = slowest_rules(seconds)
    return out


def slowest_rules(seconds: Mapping[str, float], top: int = 4, floor: float = 0.05) -> str:
    """The rules that took the most time, most first, at most ``top`` and each at least ``floor`` seconds (a line
    a person reads: ``samples 1.6 s, spikes 1.2 s``); empty when none took that long."""
    ranked = sorted(((t, name) for name, t in seconds.items() if t >= floor), key=lambda x: (-x[0], x[1]))[:top]
    return ", ".join(f"{name} {t:.1f} s" for t, name in ranked)
