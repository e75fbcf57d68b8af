"""The run at a glance, shared by the dashboard and the top of report.html: the state now, the causes as table rows,
the harmful samples grouped by what the run can tell apart, and the status strip as HTML.

Nothing here imports Streamlit or plotly: the dashboard draws these rows with its widgets, the report writes them as
HTML tables, so the two read alike. Severity is always a word with a shape beside it (never colour alone): the
shapes are chosen so that sorting the labels as text orders them critical, warning, info.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from forensics.report.text import esc, fmt_num, snippet
from forensics.schema import STEP, metric_columns
from forensics.schema.steps import steps_list

#: Severity -> (shape, colour, plotly marker symbol). "■" < "▲" < "●" as text, so a sorted column reads most
#: severe first; the colours are readable on white and the shapes differ for colour-blind readers.
SEVERITY_STYLE = {
    "critical": ("■", "#b91c1c", "square"),
    "warning": ("▲", "#b45309", "triangle-up"),
    "info": ("●", "#1d4ed8", "circle"),
}
OK_STYLE = ("✓", "#15803d")
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}
#: Cause kinds that stay true of the run once found (a dead job, a loss that does not come back).
LASTING_KINDS = ("crash", "divergence")
#: Throughput columns, matched by name (case-insensitive, first match wins).
THROUGHPUT_NAMES = (
    "tokens_per_s",
    "tokens_per_second",
    "tok_per_s",
    "tok/s",
    "throughput",
    "train_samples_per_second",
    "samples_per_second",
    "samples_per_s",
    "it/s",
    "iter_per_s",
)
#: Rows whose median is the throughput "now" (a median, so one slow step does not move it).
THROUGHPUT_ROWS = 20


def severity_label(severity: Any) -> str:
    """``■ critical`` / ``▲ warning`` / ``● info``: the word with its shape."""
    sev = str(severity or "info")
    shape = SEVERITY_STYLE.get(sev, SEVERITY_STYLE["info"])[0]
    return f"{shape} {sev}"


def recent_window(n_steps: int) -> int:
    """The steps that count as "now": the last 5% of the run, at least 50 steps."""
    return max(50, n_steps // 20)


@dataclass(frozen=True)
class RunState:
    """The run's state now: ``level`` (``ok`` | ``warning`` | ``critical``) and why, in words."""

    level: str
    reason: str

    @property
    def shape(self) -> str:
        return OK_STYLE[0] if self.level == "ok" else SEVERITY_STYLE[self.level][0]

    @property
    def color(self) -> str:
        return OK_STYLE[1] if self.level == "ok" else SEVERITY_STYLE[self.level][1]


def run_state(causes: list[dict[str, Any]], last_step: int | None, n_steps: int, stale: bool = False) -> RunState:
    """The state now: the worst cause at warning or above that is still true (a crash or divergence, whenever found)
    or touches the last :func:`recent_window` steps; a run that stopped writing is at least a warning. Causes of the
    run's past (a spike 2,000 steps ago) are counted in the strip, not held against the run now."""
    window = recent_window(n_steps)
    worst: tuple[int, str] | None = None
    for c in causes:
        sev = str(c.get("severity") or "info")
        if SEVERITY_RANK.get(sev, 2) > 1:
            continue
        steps = [int(s) for s in c.get("steps") or []]
        now = c.get("kind") in LASTING_KINDS or not steps or (last_step is not None and max(steps) > last_step - window)
        if now and (worst is None or SEVERITY_RANK[sev] < worst[0]):
            where = f"steps {steps_list(steps)}" if steps else "the whole run"
            worst = (SEVERITY_RANK[sev], f"{c.get('kind')} cause {c.get('id', '')} at {where}".replace("  ", " "))
    if worst is not None and worst[0] == 0:
        return RunState("critical", worst[1])
    if worst is not None:
        return RunState("warning", worst[1] + ("; the run stopped writing" if stale else ""))
    if stale:
        return RunState("warning", "the run stopped writing")
    return RunState("ok", f"no cause at warning or above in the last {window:,} steps")


def cause_counts(causes: list[dict[str, Any]]) -> dict[str, int]:
    """Causes per severity, critical first (every severity present, zeros included)."""
    counts = {s: 0 for s in SEVERITY_STYLE}
    for c in causes:
        sev = str(c.get("severity") or "info")
        counts[sev if sev in counts else "info"] += 1
    return counts


def throughput_key(metrics: pd.DataFrame) -> str | None:
    """The throughput column, when the run logs one (tokens or samples per second)."""
    cols = metric_columns(metrics)
    lowered = {c.lower(): c for c in cols}
    for name in THROUGHPUT_NAMES:
        for low, col in lowered.items():
            if (
                "eval" not in low
                and not low.startswith("val")
                and (low == name or low.endswith("/" + name) or low.endswith("_" + name))
            ):
                return col
    return None


def throughput_now(metrics: pd.DataFrame, key: str | None) -> float | None:
    """The median of the last :data:`THROUGHPUT_ROWS` finite values of ``key`` (None when there are none)."""
    if key is None or key not in metrics.columns:
        return None
    values = metrics[key].to_numpy(np.float64)
    values = values[np.isfinite(values)][-THROUGHPUT_ROWS:]
    return float(np.median(values)) if len(values) else None


def _si(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def cause_rows(causes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One table row per cause, most severe first then by first step: ``id, severity, kind, steps`` (as logged),
    ``summary`` (its first sentence), ``class`` (the re-run's cause class) and ``replay`` (the replay verdict)."""
    rows = []
    for c in causes:
        steps = c.get("logged_steps") or c.get("steps") or []
        replay = c.get("replay") if isinstance(c.get("replay"), dict) else {}
        rows.append(
            {
                "id": str(c.get("id", "")),
                "severity": severity_label(c.get("severity")),
                "kind": str(c.get("kind", "")),
                "steps": steps_list(sorted({int(s) for s in steps})) if steps else "whole run",
                "summary": one_line(c.get("summary")),
                "class": str(c.get("cause_class") or ""),
                "replay": str(replay.get("verdict") or ""),
                "_rank": SEVERITY_RANK.get(str(c.get("severity")), 2),
                "_first": min((int(s) for s in steps), default=-1),
            }
        )
    rows.sort(key=lambda r: (r["_rank"], r["_first"]))
    return rows


def one_line(text: Any, limit: int = 140) -> str:
    """The first sentence of ``text`` (up to the first ': ', '; ' or '. '), at most ``limit`` characters."""
    flat = snippet(text, 10_000)
    cut = min((i for i in (flat.find(": "), flat.find("; "), flat.find(". ")) if i > 0), default=len(flat))
    return snippet(flat[:cut], limit)


def sample_groups(harmful: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The harmful samples, those consumed at exactly the same steps in one row (the run cannot tell them apart):
    ``ids`` (list), ``samples`` (text), ``appearances``, ``effect`` (share), ``q`` (the group's largest), ``reason``."""
    groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for h in harmful:
        groups.setdefault(tuple(int(s) for s in h.get("steps") or [h.get("sample_id")]), []).append(h)
    rows = []
    for members in groups.values():
        ids = [int(h["sample_id"]) for h in members]
        effect = max((float(h["effect"]) for h in members if h.get("effect") is not None), default=float("nan"))
        q = max((float(h["q"]) for h in members if h.get("q") is not None), default=float("nan"))
        content = list(dict.fromkeys(str(x) for h in members for x in (h.get("content") or [])))
        reason = (
            f"loss {effect:+.0%} vs expected when present"
            if math.isfinite(effect)
            else one_line(members[0].get("reason"))
        )
        if len(ids) > 1:
            reason += f"; always together ({len(ids)} samples)"
        if content:
            reason += "; " + "; ".join(content[:2])
        rows.append(
            {
                "ids": ids,
                "samples": ", ".join(map(str, ids)),
                "appearances": int(members[0].get("appearances") or len(members[0].get("steps") or [])),
                "effect": effect,
                "q": q,
                "reason": reason,
            }
        )
    return rows


@dataclass(frozen=True)
class Strip:
    """What the status strip says; ``age_s`` / ``stale`` / ``last_new`` only for a live run."""

    state: RunState
    last_step: int | None
    n_steps: int
    counts: dict[str, int]
    throughput: tuple[str, float] | None = None
    age_s: float | None = None
    stale: bool = False
    stale_after: str = ""
    last_new: tuple[str, str] | None = None  # (clock time, "C3 crash · critical")
    note: str = ""  # the last cell, e.g. "3,504 steps read · refreshing every 5 s"


def strip_of(causes: list[dict[str, Any]], metrics: pd.DataFrame, stale: bool = False, **live: Any) -> Strip:
    """The strip of a run given its causes and metrics (``live``: ``age_s``, ``stale_after``, ``last_new``)."""
    n = len(metrics)
    last = int(metrics[STEP].iloc[-1]) if n else None
    key = throughput_key(metrics)
    tp = throughput_now(metrics, key)
    return Strip(
        run_state(causes, last, n, stale),
        last,
        n,
        cause_counts(causes),
        (key, tp) if key is not None and tp is not None else None,
        stale=stale,
        **live,
    )


def strip_text(strip: Strip, age_text: str | None = None) -> list[str]:
    """The strip's cells as plain text, in display order (the HTML shows the same words)."""
    cells = [f"{strip.state.shape} {strip.state.level.upper()}: {strip.state.reason}"]
    newest = "no rows yet" if strip.last_step is None else f"newest step {strip.last_step:,}"
    if age_text is not None:
        newest += f" · row age {age_text}"
        if strip.stale:
            newest += f" · STALE (no new row for {strip.stale_after})" if strip.stale_after else " · STALE"
    cells.append(newest)
    if strip.throughput is not None:
        cells.append(f"throughput {_si(strip.throughput[1])} {strip.throughput[0]}")
    cells.append("causes: " + ", ".join(f"{n} {severity_label(s)}" for s, n in strip.counts.items()))
    if strip.last_new is not None:
        cells.append(f"last new cause {strip.last_new[1]} at {strip.last_new[0]}")
    if strip.note:
        cells.append(strip.note)
    return cells


def strip_html(strip: Strip, age_text: str | None = None) -> str:
    """The strip as one HTML block with inline styles (the dashboard's Markdown and the report both take it): the
    state as a coloured pill holding its shape and word, then the other cells. Every text is escaped."""
    cells = strip_text(strip, age_text)
    pill = (
        f'<span style="background:{strip.state.color};color:#fff;border-radius:6px;padding:3px 10px;'
        f'font-weight:700;white-space:nowrap">{esc(strip.state.shape)} {esc(strip.state.level.upper())}</span>'
        f" <span>{esc(strip.state.reason)}</span>"
    )
    rest = []
    for cell in cells[1:]:
        color = SEVERITY_STYLE["warning"][1] if "STALE" in cell else "inherit"
        rest.append(f'<span style="white-space:nowrap;color:{color}">{esc(cell)}</span>')
    sep = '<span style="color:#9aa5b1"> │ </span>'
    border = strip.state.color
    return (
        f'<div class="status-strip" style="border:1px solid #e5e7eb;border-left:6px solid {border};'
        f'border-radius:8px;padding:8px 12px;background:#fff;line-height:1.9;font-size:14px">'
        f"{pill}{sep}{sep.join(rest)}</div>"
    )


def table_html(rows: list[dict[str, Any]], columns: dict[str, str], table_id: str) -> str:
    """Rows as an HTML table whose headers sort it (the report's loader wires ``table.sortable``); text escaped."""
    head = "".join(f'<th data-col="{i}">{esc(label)}</th>' for i, label in enumerate(columns.values()))
    body = []
    for r in rows:
        cells = []
        for key in columns:
            v = r.get(key)
            text = fmt_num(v, 3) if isinstance(v, float) else ("" if v is None else str(v))
            sev = str(v).split(" ")[-1] if key == "severity" else ""
            style = f' style="color:{SEVERITY_STYLE[sev][1]};font-weight:600"' if sev in SEVERITY_STYLE else ""
            cells.append(f"<td{style}>{esc(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="scroll"><table class="sortable overview" id="{esc(table_id)}"><thead><tr>{head}</tr>'
        f"</thead><tbody>{''.join(body)}</tbody></table></div>"
    )


#: The columns of the causes table and the harmful samples table, key -> label.
CAUSE_COLUMNS = {
    "id": "id",
    "severity": "severity",
    "kind": "kind",
    "steps": "steps",
    "summary": "summary",
    "class": "cause class",
    "replay": "replay verdict",
}
SAMPLE_COLUMNS = {"samples": "samples", "appearances": "appearances", "effect": "effect", "q": "q", "reason": "reason"}
