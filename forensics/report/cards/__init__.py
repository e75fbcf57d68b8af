"""The report's cards: one per cause, then one per kind of finding, in the order the kinds were registered.

The report names no kind. A cause whose findings are events (spikes) gets the cause card; every other finding is
drawn by the card its kind registered (:class:`forensics.detect.kinds.FindingKind`: ``card``, a function or a
``"module:function"`` path, called as ``card(items, context)``; a run-level section's card gets the section
object), else by a table of its findings. A rule from outside the package that registers a kind with a card of its
own therefore reaches the report with no edit here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from forensics.report.cards.blocks import BatchLookup, cluster_names, prose
from forensics.report.cards.builtin import cause_card, listed_cards, section_cards
from forensics.report.inputs import sample_lookup

__all__ = ["BatchLookup", "CardContext", "card_function", "cluster_names", "finding_cards", "prose"]


@dataclass
class CardContext:
    """What a card may read besides its findings: the whole findings, the samples by id, the plan by step,
    cluster names, the loss key and the replay verdicts by step."""

    findings: dict[str, Any]
    lookup: pd.DataFrame | None = None
    batches: BatchLookup | None = None
    names: dict[int, str] = field(default_factory=dict)
    loss_key: str | None = None
    replay: dict[int, dict] = field(default_factory=dict)


def card_function(card: Any) -> Callable[..., Any] | None:
    """A registered card: a callable, or a ``"module:function"`` path imported now."""
    if card is None or callable(card):
        return card
    module, _, name = str(card).partition(":")
    return getattr(importlib.import_module(module), name)


def finding_cards(
    findings: dict,
    samples: pd.DataFrame | None = None,
    plan: pd.DataFrame | None = None,
    tags: pd.DataFrame | None = None,
    loss_key: str | None = None,
    replay: dict | None = None,
) -> list[str]:
    """All cards in reading order: the causes told by their events, then each registered kind's findings (run-level
    sections included), then kinds nobody registered."""
    from forensics.detect.kinds import KINDS, kind_of

    ctx = CardContext(
        findings=findings,
        lookup=sample_lookup(samples),
        batches=BatchLookup(plan),
        names=cluster_names(tags),
        loss_key=loss_key,
        replay={int(r["step"]): r for r in (replay or {}).get("steps") or [] if isinstance(r, dict) and "step" in r},
    )
    every = [f for f in findings.get("findings") or [] if isinstance(f, dict)]
    listed = {}
    for kind in KINDS.values():
        if kind.section and not kind.object_section and isinstance(findings.get(kind.section), list):
            listed[kind.kind] = [f for f in findings[kind.section] if isinstance(f, dict) and f.get("step") is not None]
    events = [f for items in listed.values() for f in items if f.get("cause") is not None]
    cards: list[str] = []
    told: set[str] = set()
    for c in findings.get("causes") or []:
        members = [f for f in events if isinstance(c, dict) and f.get("cause") == c.get("id")]
        if members:
            cards.append(cause_card(c, members, ctx.lookup, ctx.batches, ctx.names, loss_key, ctx.replay))
            told.add(str(c.get("id")))
    seen_sections: set[str] = set()
    for kind in KINDS.values():
        if kind.object_section:
            section = findings.get(kind.section or kind.kind)
            if isinstance(section, dict) and section and kind.section not in seen_sections:
                seen_sections.add(str(kind.section))
                cards += _draw(kind.card, [section], ctx, kind.kind, section_cards)
            continue
        if kind.told_by:
            continue
        items = listed.get(kind.kind) if kind.kind in listed else [f for f in every if f.get("kind") == kind.kind]
        items = [f for f in items if str(f.get("cause")) not in told]
        if items:
            cards += _draw(kind.card, items, ctx, kind.kind, listed_cards)
    registered = set(KINDS)
    for name in dict.fromkeys(str(f.get("kind")) for f in every if str(f.get("kind")) not in registered):
        items = [f for f in every if f.get("kind") == name and f.get("step") is not None]
        if items and not kind_of(name).told_by:
            cards += listed_cards(items, ctx, name)
    return cards


def _draw(card: Any, items: list[dict], ctx: CardContext, kind: str, fallback: Callable[..., list[str]]) -> list[str]:
    fn = card_function(card)
    out = fn(items, ctx) if fn is not None else fallback(items, ctx, kind)
    return [out] if isinstance(out, str) else list(out)
