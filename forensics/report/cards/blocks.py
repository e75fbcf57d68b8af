"""The pieces every card is made of: a grid of numbers, sentences with commands as code, the batch of a step with its
suspects first, where a batch came back, the next step.

Every value that comes from data - sample text, sources, cluster names, metric names - goes through
:func:`~forensics.report.text.esc`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from forensics.report.text import esc, fmt_num, fmt_share, snippet
from forensics.schema import CLUSTER, N_TOKENS, SAMPLE_ID, SOURCE, STEP, TEXT

#: Samples listed per spike card (suspects first); the rest are counted.
MAX_BATCH_ROWS = 24


SNIPPET_CHARS = 140


_BACKTICKS = re.compile(r"`([^`<>]+)`")


FULL_TEXT_CHARS = 4000


class BatchLookup:
    """The plan's samples per step, found by binary search (the plan is sorted by step once)."""

    def __init__(self, plan: pd.DataFrame | None):
        self.ok = plan is not None and STEP in plan.columns and SAMPLE_ID in plan.columns
        if self.ok:
            sorted_plan = plan.sort_values(STEP, kind="stable")
            self.steps = sorted_plan[STEP].to_numpy(np.int64)
            self.ids = sorted_plan[SAMPLE_ID].to_numpy(np.int64)

    def samples_in(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Sample ids (and their steps) of the steps ``start..end``."""
        if not self.ok:
            return np.array([], np.int64), np.array([], np.int64)
        lo = np.searchsorted(self.steps, start, side="left")
        hi = np.searchsorted(self.steps, end, side="right")
        return self.ids[lo:hi], self.steps[lo:hi]


def cluster_names(tags: pd.DataFrame | None) -> dict[int, str]:
    """Cluster id -> name from the tags' ``cluster``/``cluster_name`` columns (unescaped)."""
    if tags is None or CLUSTER not in tags.columns or "cluster_name" not in tags.columns:
        return {}
    pairs = tags[[CLUSTER, "cluster_name"]].dropna().drop_duplicates(CLUSTER)
    return {int(c): str(n) for c, n in zip(pairs[CLUSTER], pairs["cluster_name"])}


def numbers_block(items: Iterable[tuple[str, str]]) -> str:
    cells = "".join(f"<div><dt>{esc(k)}</dt><dd>{v}</dd></div>" for k, v in items if v not in (None, ""))
    return f'<dl class="numbers">{cells}</dl>'


def prose(text: Any) -> str:
    """Escaped sentence text with `backticked` spans shown as code (commands a user may copy)."""
    return _BACKTICKS.sub(r"<code>\1</code>", esc(text))


def evidence_list(title: str, lines: Sequence[Any]) -> str:
    lines = [x for x in lines if x not in (None, "")]
    if not lines:
        return ""
    items = "".join(f"<li>{prose(x)}</li>" for x in lines)
    return f"<section><h4>{esc(title)}</h4><ul>{items}</ul></section>"


def next_step_block(finding: dict) -> str:
    text = finding.get("next_step")
    if isinstance(text, list):
        text = " ".join(str(t) for t in text)
    return f'<p class="next"><span>Next step</span>{prose(text)}</p>' if text else ""


def extra_numbers(finding: dict, shown: set[str]) -> list[tuple[str, str]]:
    """Scalar keys of a finding (and of its ``details``) that no dedicated field shows, so a richer findings
    model still shows up; ``k_text`` keys (how findings.json spells NaN/inf) stand in for their null ``k``."""
    out = []
    details = finding.get("details") if isinstance(finding.get("details"), dict) else {}
    for key, value in list(finding.items()) + [(k, v) for k, v in details.items() if k not in finding]:
        if key in shown or key.endswith("_text") or isinstance(value, (dict, list)):
            continue
        if value is None:
            value = finding.get(f"{key}_text")
            if value is None:
                continue
        out.append((key.replace("_", " "), esc(fmt_num(value) if not isinstance(value, str) else value)))
    return out


def value_text(finding: dict, key: str, digits: int = 4) -> str:
    """A finding's number as text; a null with a ``key_text`` companion (NaN/inf in findings.json) shows that."""
    value = finding.get(key)
    if value is None and finding.get(f"{key}_text") is not None:
        return str(finding[f"{key}_text"])
    return fmt_num(value, digits)


def as_float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def batch_table(
    spike: dict,
    peak: int,
    start: int,
    end: int,
    lookup: pd.DataFrame | None,
    batches: BatchLookup | None,
    names: dict[int, str] | None,
) -> str:
    suspects = [int(i) for i in spike.get("suspect_samples") or []]
    rank = {sid: r for r, sid in enumerate(suspects, start=1)}
    ids, steps = batches.samples_in(peak, peak) if batches is not None else (np.array([], np.int64),) * 2
    if batches is None or not batches.ok:
        if not suspects:
            return (
                '<section><h4>The batch</h4><p class="muted">No plan was given, so the samples behind this step '
                "are unknown: pass the batch plan (<code>--plan</code>) to see them and rank suspects.</p>"
                "</section>"
            )
    step_of = {int(i): int(s) for i, s in zip(ids, steps)}
    rows = list(dict.fromkeys(suspects + [int(i) for i in ids]))
    if not rows:
        return (
            f'<section><h4>The batch at step {peak}</h4><p class="muted">The plan has no samples for step '
            f"{peak}.</p></section>"
        )

    def tokens(sid: int) -> float:
        row = sample_row(lookup, sid)
        return -float(row.get(N_TOKENS, 0) or 0) if row else 0.0

    rows.sort(key=lambda sid: (rank.get(sid, len(rank) + 1), tokens(sid), sid))
    shown, hidden = rows[:MAX_BATCH_ROWS], len(rows) - MAX_BATCH_ROWS
    body = []
    for sid in shown:
        row = sample_row(lookup, sid) or {}
        cl = row.get(CLUSTER)
        cl_text = ""
        if cl is not None and not (isinstance(cl, float) and math.isnan(cl)):
            cl_text = fmt_num(int(cl)) + (f" · {snippet(names[int(cl)], 30)}" if names and int(cl) in names else "")
        text = row.get(TEXT)
        text_cell = esc(snippet(text, SNIPPET_CHARS))
        if text is not None and len(str(text)) > SNIPPET_CHARS:
            full = str(text)[:FULL_TEXT_CHARS] + ("…" if len(str(text)) > FULL_TEXT_CHARS else "")
            text_cell = f"<details><summary>{text_cell}</summary><pre>{esc(full)}</pre></details>"
        suspect = f'<span class="suspect">#{rank[sid]}</span>' if sid in rank else ""
        where = step_of.get(sid)
        tr = '<tr class="is-suspect">' if sid in rank else "<tr>"
        body.append(
            f"{tr}<td>{suspect}</td><td>{sid}</td>"
            f"<td>{'' if where is None else where}</td>"
            f'<td class="num">{esc(fmt_num(row.get(N_TOKENS))) if N_TOKENS in row else ""}</td>'
            f"<td>{esc(cl_text)}</td><td>{esc(row.get(SOURCE) if present(row.get(SOURCE)) else '')}</td>"
            f'<td class="text">{text_cell}</td></tr>'
        )
    more = f'<p class="muted">… and {hidden} more samples.</p>' if hidden > 0 else ""
    n_batch = len(ids)
    caption = (f"The batch at step {peak}: {n_batch} samples" if n_batch else "Suspect samples") + (
        f", {len(suspects)} suspects first" if suspects else ""
    )
    head = (
        "<tr><th>suspect</th><th>sample</th><th>step</th><th>tokens</th><th>cluster</th><th>source</th>"
        "<th>text</th></tr>"
    )
    return (
        f'<section><h4>{esc(caption)}</h4><div class="scroll"><table class="batch"><thead>{head}</thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>{more}</section>"
    )


def slug(text: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-") or "metric"


def present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and str(value) != ""


def sample_row(lookup: pd.DataFrame | None, sid: int) -> dict | None:
    if lookup is None:
        return None
    try:
        return lookup.loc[sid].to_dict()
    except KeyError:
        return None


def recurrence_table(spike: dict, metric: str) -> str:
    """Where the spike's batch (or most of it) was trained again and what the metric did there."""
    rec = [r for r in spike.get("recurrence") or [] if isinstance(r, dict)]
    if not rec:
        return ""
    baseline = as_float(spike.get("baseline"))
    has_overlap = any(r.get("overlap") is not None for r in rec)
    rows = []
    for r in rec:
        value = as_float(r.get("value"))
        ratio = f"{value / baseline:.2f}×" if value is not None and baseline else ""
        overlap = f'<td class="num">{esc(fmt_share(r.get("overlap")))}</td>' if has_overlap else ""
        rows.append(
            f"<tr><td>{esc(fmt_num(r.get('epoch')))}</td><td>{esc(fmt_num(r.get('step')))}</td>"
            f'<td class="num">{esc(fmt_num(r.get("value")))}</td><td class="num">{ratio}</td>'
            f"{overlap}</tr>"
        )
    head = (
        f'<tr><th>epoch</th><th>step</th><th class="num">{esc(metric)}</th>'
        f'<th class="num">× spike baseline</th>' + ('<th class="num">overlap</th>' if has_overlap else "") + "</tr>"
    )
    return (
        f'<section><h4>The same batch in other epochs</h4><div class="scroll"><table class="recurrence">'
        f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div></section>"
    )
