"""One HTML card per finding: its numbers, the batch behind it, recurrence, evidence and the suggested next step.

Cards render whatever keys a finding has (the findings model grows over time; a missing optional key is simply not
shown). Every value that comes from data - sample text, sources, cluster names, metric names - goes through
:func:`~forensics.report.text.esc`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from forensics.detect.composition import plan_words
from forensics.report.inputs import sample_lookup
from forensics.report.text import esc, fmt_num, fmt_share, snippet
from forensics.schema import CLUSTER, N_TOKENS, SAMPLE_ID, SOURCE, STEP, TEXT

#: Samples listed per spike card (suspects first); the rest are counted.
MAX_BATCH_ROWS = 24
#: Non-finite steps listed per card.
MAX_NONFINITE_ROWS = 40
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


# --- building blocks --------------------------------------------------------------------------------------------------
def _numbers(items: Iterable[tuple[str, str]]) -> str:
    cells = "".join(f"<div><dt>{esc(k)}</dt><dd>{v}</dd></div>" for k, v in items if v not in (None, ""))
    return f'<dl class="numbers">{cells}</dl>'


def prose(text: Any) -> str:
    """Escaped sentence text with `backticked` spans shown as code (commands a user may copy)."""
    return _BACKTICKS.sub(r"<code>\1</code>", esc(text))


def _list(title: str, lines: Sequence[Any]) -> str:
    lines = [x for x in lines if x not in (None, "")]
    if not lines:
        return ""
    items = "".join(f"<li>{prose(x)}</li>" for x in lines)
    return f"<section><h4>{esc(title)}</h4><ul>{items}</ul></section>"


def _next_step(finding: dict) -> str:
    text = finding.get("next_step")
    if isinstance(text, list):
        text = " ".join(str(t) for t in text)
    return f'<p class="next"><span>Next step</span>{prose(text)}</p>' if text else ""


def _extra_numbers(finding: dict, shown: set[str]) -> list[tuple[str, str]]:
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


def _value(finding: dict, key: str, digits: int = 4) -> str:
    """A finding's number as text; a null with a ``key_text`` companion (NaN/inf in findings.json) shows that."""
    value = finding.get(key)
    if value is None and finding.get(f"{key}_text") is not None:
        return str(finding[f"{key}_text"])
    return fmt_num(value, digits)


def _float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# --- spike ------------------------------------------------------------------------------------------------------------
_SPIKE_SHOWN = {"kind", "step", "end_step", "peak_step", "metric", "value", "baseline", "score", "bucket",
                "bucket_range", "cluster", "cluster_name", "suspect_samples", "evidence", "next_step", "recurrence",
                "severity", "recovery_step", "title", "details", "ratio"}


def spike_card(
    spike: dict,
    lookup: pd.DataFrame | None = None,
    batches: BatchLookup | None = None,
    names: dict[int, str] | None = None,
    loss_key: str | None = None,
) -> str:
    """The card of one spike event (``lookup``: samples indexed by id; ``batches``: the plan by step)."""
    start = int(spike["step"])
    end = int(spike["end_step"]) if spike.get("end_step") is not None else start
    peak = int(spike["peak_step"]) if spike.get("peak_step") is not None else start
    metric = spike.get("metric") or loss_key or "loss"
    span = f"Step {start}" if end == start else f"Steps {start}–{end}"
    value, baseline = _float(spike.get("value")), _float(spike.get("baseline"))
    ratio = f"{value / baseline:.2f}×" if value is not None and baseline not in (None, 0.0) else ""
    where = ""
    if spike.get("bucket") is not None:
        where = f"bucket {fmt_num(spike['bucket'])} {spike.get('bucket_range') or ''}".strip()
    cluster = ""
    if spike.get("cluster") is not None:
        name = spike.get("cluster_name") or (names or {}).get(int(spike["cluster"]))
        cluster = f"{fmt_num(spike['cluster'])}" + (f" · {snippet(name, 60)}" if name else "")
    details = spike.get("details") if isinstance(spike.get("details"), dict) else {}
    recovery = spike.get("recovery_step", details.get("recovery_step"))
    numbers = _numbers([
        ("metric", esc(metric)),
        ("peak step", str(peak)),
        ("peak value", esc(_value(spike, "value"))),
        ("baseline", esc(_value(spike, "baseline"))),
        ("peak / baseline", ratio),
        ("score", esc(_value(spike, "score", 3))),
        ("steps", str(end - start + 1)),
        ("length bucket", esc(where)),
        ("cluster", esc(cluster)),
        ("severity", esc(spike.get("severity") or "")),
        ("recovered at", fmt_num(recovery) if recovery is not None else ""),
    ] + _extra_numbers(spike, _SPIKE_SHOWN))
    badge = "loss spike" if metric == loss_key or "loss" in str(metric).lower() else f"{metric} spike"
    zoom = (f'<button class="zoom" type="button" data-x0="{start}" data-x1="{end}">'
            f"show on the curves</button>")
    parts = [
        f'<article class="card finding spike" id="spike-{start}-{_slug(metric)}" data-kind="spike" '
        f'data-step="{start}" data-peak-step="{peak}">',
        f'<header><span class="badge alert">{esc(badge)}</span><h3>{span}'
        f'<small> · peak at {peak}</small></h3>{zoom}</header>',
        numbers,
        _list("Evidence", spike.get("evidence") or []),
        _batch_table(spike, peak, start, end, lookup, batches, names),
        _recurrence_table(spike, metric),
        _next_step(spike),
        "</article>",
    ]
    return "\n".join(p for p in parts if p)


def _batch_table(spike: dict, peak: int, start: int, end: int, lookup: pd.DataFrame | None,
                 batches: BatchLookup | None, names: dict[int, str] | None) -> str:
    suspects = [int(i) for i in spike.get("suspect_samples") or []]
    rank = {sid: r for r, sid in enumerate(suspects, start=1)}
    ids, steps = (batches.samples_in(peak, peak) if batches is not None else (np.array([], np.int64),) * 2)
    if batches is None or not batches.ok:
        if not suspects:
            return ('<section><h4>The batch</h4><p class="muted">No plan was given, so the samples behind this step '
                    "are unknown: pass the batch plan (<code>--plan</code>) to see them and rank suspects.</p>"
                    "</section>")
    step_of = {int(i): int(s) for i, s in zip(ids, steps)}
    rows = list(dict.fromkeys(suspects + [int(i) for i in ids]))
    if not rows:
        return (f'<section><h4>The batch at step {peak}</h4><p class="muted">The plan has no samples for step '
                f"{peak}.</p></section>")

    def tokens(sid: int) -> float:
        row = _row(lookup, sid)
        return -float(row.get(N_TOKENS, 0) or 0) if row else 0.0

    rows.sort(key=lambda sid: (rank.get(sid, len(rank) + 1), tokens(sid), sid))
    shown, hidden = rows[:MAX_BATCH_ROWS], len(rows) - MAX_BATCH_ROWS
    body = []
    for sid in shown:
        row = _row(lookup, sid) or {}
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
            f"<td class=\"num\">{esc(fmt_num(row.get(N_TOKENS))) if N_TOKENS in row else ''}</td>"
            f"<td>{esc(cl_text)}</td><td>{esc(row.get(SOURCE) if _present(row.get(SOURCE)) else '')}</td>"
            f'<td class="text">{text_cell}</td></tr>'
        )
    more = f'<p class="muted">… and {hidden} more samples.</p>' if hidden > 0 else ""
    n_batch = len(ids)
    caption = (f"The batch at step {peak}: {n_batch} samples" if n_batch else "Suspect samples") + (
        f", {len(suspects)} suspects first" if suspects else "")
    head = ("<tr><th>suspect</th><th>sample</th><th>step</th><th>tokens</th><th>cluster</th><th>source</th>"
            "<th>text</th></tr>")
    return (f"<section><h4>{esc(caption)}</h4><div class=\"scroll\"><table class=\"batch\"><thead>{head}</thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>{more}</section>")


def _slug(text: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-") or "metric"


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and str(value) != ""


def _row(lookup: pd.DataFrame | None, sid: int) -> dict | None:
    if lookup is None:
        return None
    try:
        return lookup.loc[sid].to_dict()
    except KeyError:
        return None


def _recurrence_table(spike: dict, metric: str) -> str:
    """Where the spike's batch (or most of it) was trained again and what the metric did there."""
    rec = [r for r in spike.get("recurrence") or [] if isinstance(r, dict)]
    if not rec:
        return ""
    baseline = _float(spike.get("baseline"))
    has_overlap = any(r.get("overlap") is not None for r in rec)
    rows = []
    for r in rec:
        value = _float(r.get("value"))
        ratio = f"{value / baseline:.2f}×" if value is not None and baseline else ""
        overlap = f"<td class=\"num\">{esc(fmt_share(r.get('overlap')))}</td>" if has_overlap else ""
        rows.append(f"<tr><td>{esc(fmt_num(r.get('epoch')))}</td><td>{esc(fmt_num(r.get('step')))}</td>"
                    f"<td class=\"num\">{esc(fmt_num(r.get('value')))}</td><td class=\"num\">{ratio}</td>"
                    f"{overlap}</tr>")
    head = (f"<tr><th>epoch</th><th>step</th><th class=\"num\">{esc(metric)}</th>"
            f"<th class=\"num\">× spike baseline</th>" + ("<th class=\"num\">overlap</th>" if has_overlap else "")
            + "</tr>")
    return (f"<section><h4>The same batch in other epochs</h4><div class=\"scroll\"><table class=\"recurrence\">"
            f"<thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div></section>")


# --- other findings -----------------------------------------------------------------------------------------------------
def nonfinite_card(items: list[dict]) -> str:
    """One card for all NaN/inf values (they are usually a run of steps, not independent findings)."""
    metrics = sorted({str(i.get("metric", "")) for i in items})
    steps = sorted(int(i["step"]) for i in items if i.get("step") is not None)
    first, last = (steps[0], steps[-1]) if steps else (None, None)
    rows = "".join(
        f"<tr><td>{int(i['step'])}</td><td>{esc(i.get('metric', ''))}</td><td>{esc(_value(i, 'value'))}</td></tr>"
        for i in sorted(items, key=lambda i: int(i["step"]))[:MAX_NONFINITE_ROWS]
    )
    more = len(items) - MAX_NONFINITE_ROWS
    return "\n".join([
        f'<article class="card finding nonfinite" data-kind="nonfinite" data-step="{first}">',
        f'<header><span class="badge alert">non-finite</span><h3>{len(items)} NaN/inf value'
        f'{"s" if len(items) != 1 else ""}<small> · steps {first}–{last}</small></h3></header>',
        _numbers([("metrics", esc(", ".join(metrics))), ("first step", fmt_num(first)), ("last step", fmt_num(last))]),
        f'<div class="scroll"><table><thead><tr><th>step</th><th>metric</th><th>value</th></tr></thead>'
        f"<tbody>{rows}</tbody></table></div>",
        f'<p class="muted">… and {more} more.</p>' if more > 0 else "",
        '<p class="next"><span>Next step</span>Look at the step before the first NaN: a spike, an lr change or a '
        "batch with an outlier sample usually precedes it; replay that step from the checkpoint before it.</p>",
        "</article>",
    ])


#: From this share of the detrended loss variance on, the bucket "explains the jumpiness" (the jumpiness detector's
#: threshold); below it the bucket mix is only a detail.
JUMPINESS_SHARE = 0.2


def oscillation_card(osc: dict) -> str:
    """Oscillation and bucket-explained jumpiness: detected or not, and how much bucket / cluster explain."""
    detected = bool(osc.get("detected"))
    share = osc.get("bucket_variance_share")
    explained = share is not None and share >= JUMPINESS_SHARE
    title = "Oscillation detected" if detected else "Jumpiness explained by the batch mix" if explained else "Oscillation"
    shown = {"detected", "bucket_variance_share", "cluster_variance_share", "evidence", "next_step"}
    numbers = _numbers([
        ("detected", "yes" if detected else "no"),
        ("variance explained by bucket", fmt_share(share) if share is not None else ""),
        ("variance explained by cluster", fmt_share(osc.get("cluster_variance_share"))
         if osc.get("cluster_variance_share") is not None else ""),
    ] + _extra_numbers(osc, shown))
    return "\n".join(p for p in [
        '<article class="card finding oscillation" data-kind="oscillation">',
        f'<header><span class="badge {"alert" if detected else "info"}">oscillation</span><h3>{esc(title)}</h3>'
        "</header>",
        numbers,
        _list("Evidence", osc.get("evidence") or []),
        _next_step(osc),
        "</article>",
    ] if p)


def plan_card(pf: dict) -> str:
    """The batch plan's composition test: static or not, pair retention and identical batches per epoch pair."""
    static = pf.get("static")
    words = plan_words(pf)
    title = (f"Batch plan {words}" if words else
             "Batch composition varies across epochs" if static is not None else "Batch plan")
    retention = [fmt_share(v) for v in pf.get("pair_retention") or []]
    identical = [fmt_share(v) for v in pf.get("identical_batches") or []]
    threshold = pf.get("threshold") if isinstance(pf.get("threshold"), dict) else {}
    shown = {"static", "pair_retention", "identical_batches", "threshold", "evidence", "next_step", "order_only",
             "coverage", "passed", "pair_retention_first_last", "identical_batches_first_last"}
    numbers = _numbers([
        ("static", "yes" if static else "no" if static is not None else ""),
        ("pair retention per epoch pair", esc(", ".join(retention))),
        ("identical batches per epoch pair", esc(", ".join(identical))),
        ("pair retention, first vs last epoch", fmt_share(pf.get("pair_retention_first_last"))
         if pf.get("pair_retention_first_last") is not None else ""),
        ("identical batches, first vs last epoch", fmt_share(pf.get("identical_batches_first_last"))
         if pf.get("identical_batches_first_last") is not None else ""),
        ("pair retention limit", fmt_share(threshold.get("pair_retention"))
         if threshold.get("pair_retention") is not None else ""),
        ("limit derived", esc(threshold.get("how") or "")),
    ] + _extra_numbers(pf, shown))
    return "\n".join(p for p in [
        '<article class="card finding plan" data-kind="plan">',
        f'<header><span class="badge {"alert" if static else "ok"}">batch plan</span><h3>{esc(title)}</h3></header>',
        numbers,
        _list("Evidence", (pf.get("evidence") or []) + list(pf.get("notes") or [])),
        _next_step(pf),
        "</article>",
    ] if p)


def generic_card(kind: str, finding: dict) -> str:
    """A finding kind the report has no dedicated card for (e.g. ``forgetting``): its scalars and sentences."""
    shown = {"evidence", "next_step"}
    detected = finding.get("detected")
    severity = finding.get("severity") or ("critical" if detected else "info")
    badge = {"critical": "alert", "warning": "warn"}.get(str(severity), "info")
    return "\n".join(p for p in [
        f'<article class="card finding" data-kind="{esc(kind)}">',
        f'<header><span class="badge {badge}">{esc(kind)}</span>'
        f"<h3>{esc(kind.replace('_', ' ').capitalize())}</h3></header>",
        _numbers(_extra_numbers(finding, shown)),
        _list("Evidence", finding.get("evidence") or []),
        _next_step(finding),
        "</article>",
    ] if p)


_ROW_KEYS = ("step", "end_step", "metric", "value", "baseline", "score", "bucket", "cluster_name")


def listed_kind_card(key: str, items: list[dict]) -> str:
    """One card for a list of findings of another kind (``level_shifts``, ``expected_for_bucket``, ...): a table
    of their steps and numbers with each one's first evidence sentence."""
    kind = str(items[0].get("kind") or key)
    title = key.replace("_", " ").capitalize()
    cols = [k for k in _ROW_KEYS if any(i.get(k) is not None or i.get(f"{k}_text") is not None for i in items)]
    head = "".join(f"<th>{esc(c.replace('_', ' '))}</th>" for c in cols) + "<th>evidence</th>"
    rows = []
    for i in sorted(items, key=lambda i: int(i["step"]))[:MAX_NONFINITE_ROWS]:
        cells = "".join(f"<td>{esc(_value(i, c) if c not in ('metric', 'cluster_name') else i.get(c) or '')}</td>"
                        for c in cols)
        evidence = (i.get("evidence") or [""])[0]
        rows.append(f"<tr>{cells}<td>{prose(evidence)}</td></tr>")
    more = len(items) - MAX_NONFINITE_ROWS
    severe = any(i.get("severity") == "critical" for i in items)
    next_steps = list(dict.fromkeys(str(i["next_step"]) for i in items if i.get("next_step")))[:1]
    return "\n".join(p for p in [
        f'<article class="card finding" data-kind="{esc(kind)}" data-step="{int(items[0]["step"])}">',
        f'<header><span class="badge {"alert" if severe else "info"}">{esc(kind.replace("_", " "))}</span>'
        f"<h3>{esc(title)}<small> · {len(items)}</small></h3></header>",
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>',
        f'<p class="muted">… and {more} more.</p>' if more > 0 else "",
        _next_step({"next_step": next_steps[0]}) if next_steps else "",
        "</article>",
    ] if p)


def _values_vs_baselines(group: list[dict]) -> str:
    return "; ".join(f"{fmt_num(x.get('value'))} vs {fmt_num(x.get('baseline'))}" for x in group)


def cause_card(
    cause: dict,
    spikes: list[dict],
    lookup: pd.DataFrame | None = None,
    batches: BatchLookup | None = None,
    names: dict[int, str] | None = None,
    loss_key: str | None = None,
    replay: dict[int, dict] | None = None,
) -> str:
    """One card per cause: its summary, one row per event with every metric that moved, the batch of the first
    event (one table: the events share their samples), where the batch came back, and one next step."""
    severity = str(cause.get("severity") or "info")
    badge = {"critical": "alert", "warning": "warn"}.get(severity, "info")
    events: dict[int, list[dict]] = {}
    for s in sorted(spikes, key=lambda s: (int(s["step"]), s.get("metric") != loss_key)):
        events.setdefault(int(s.get("peak_step", s["step"])), []).append(s)
    rows = "".join(
        f"<tr><td>{peak}</td><td>{esc(', '.join(str(x.get('metric')) for x in group))}</td>"
        f"<td>{esc(_values_vs_baselines(group))}</td>"
        f"<td>{esc(fmt_num(group[0].get('bucket')) if group[0].get('bucket') is not None else '')}</td></tr>"
        for peak, group in events.items())
    table = (f'<table class="events"><thead><tr><th>step</th><th>metrics</th><th>value vs baseline</th>'
             f"<th>bucket</th></tr></thead><tbody>{rows}</tbody></table>") if rows else ""
    lead = spikes[0] if spikes else None
    batch = ""
    if lead is not None:
        first = min(events) if events else int(lead["step"])
        lead = next((s for s in events.get(first, []) if s.get("metric") == loss_key), events.get(first, [lead])[0])
        start = int(lead["step"])
        end = int(lead["end_step"]) if lead.get("end_step") is not None else start
        batch = _batch_table(lead, first, start, end, lookup, batches, names) + _recurrence_table(lead, str(lead.get("metric")))
    steps = cause.get("events") or cause.get("steps") or []
    where = f"steps {', '.join(map(str, steps[:8]))}" if steps else "the whole run"
    x0, x1 = (min(cause["steps"]), max(cause["steps"])) if cause.get("steps") else (None, None)
    zoom = (f'<button class="zoom" type="button" data-x0="{x0}" data-x1="{x1}">show on the curves</button>'
            if x0 is not None else "")
    parts = [
        f'<article class="card finding cause" id="cause-{esc(cause.get("id"))}" data-kind="cause" '
        f'data-cause="{esc(cause.get("id"))}" data-step="{steps[0] if steps else ""}">',
        f'<header><span class="badge {badge}">{esc(cause.get("id"))} · {esc(cause.get("kind"))}</span>'
        f"<h3>{esc(where)}<small> · {esc(severity)}, confidence {float(cause.get('confidence') or 0):.2f}</small>"
        f"</h3>{zoom}</header>",
        f"<p>{prose(cause.get('summary'))}</p>",
        table,
        _list("Evidence", [e for s in spikes[:1] for e in (s.get("evidence") or [])]),
        batch,
        _replay_rows([replay[s] for s in steps if replay and s in replay]),
        f'<p class="next"><b>Next step:</b> {prose(cause.get("next_step"))}</p>' if cause.get("next_step") else "",
        "</article>",
    ]
    return "\n".join(p for p in parts if p)


def _replay_rows(results: list[dict]) -> str:
    """The replay's verdict per step of the cause (``forensics replay``), with its evidence sentences."""
    if not results:
        return ""
    rows = "".join(
        f"<tr><td>{esc(r.get('step'))}</td><td><b>{esc(r.get('verdict'))}</b></td>"
        f"<td>{esc(r.get('checkpoint_step'))}</td><td>{esc(fmt_num(r.get('logged')))} / "
        f"{esc(fmt_num(r.get('replayed')))}</td><td>{prose(' '.join(map(str, (r.get('evidence') or [])[:3])))}</td></tr>"
        for r in results)
    return (f'<section><h4>Replay (forensics replay)</h4><div class="scroll"><table class="replay"><thead><tr>'
            f"<th>step</th><th>verdict</th><th>checkpoint</th><th>logged / replayed</th><th>evidence</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div></section>")


def finding_cards(
    findings: dict,
    samples: pd.DataFrame | None = None,
    plan: pd.DataFrame | None = None,
    tags: pd.DataFrame | None = None,
    loss_key: str | None = None,
    replay: dict | None = None,
) -> list[str]:
    """All cards in reading order: spikes (by step), non-finite values, the plan, oscillation, then other kinds."""
    lookup = sample_lookup(samples)
    batches = BatchLookup(plan)
    names = cluster_names(tags)
    spikes = [s for s in findings.get("spikes") or [] if isinstance(s, dict) and "step" in s]
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    by_step = {int(r["step"]): r for r in (replay or {}).get("steps") or [] if isinstance(r, dict) and "step" in r}
    cards = [cause_card(c, [s for s in spikes if s.get("cause") == c.get("id")], lookup, batches, names, loss_key,
                        by_step)
             for c in causes if c.get("kind") in ("batch", "event")]
    told = {s.get("cause") for s in spikes} & {c.get("id") for c in causes}
    cards += [spike_card(s, lookup, batches, names, loss_key)
              for s in sorted((s for s in spikes if s.get("cause") not in told),
                              key=lambda s: (int(s["step"]), str(s.get("metric", ""))))]
    nonfinite = [n for n in findings.get("nonfinite") or [] if isinstance(n, dict) and n.get("step") is not None]
    if nonfinite:
        cards.append(nonfinite_card(nonfinite))
    if isinstance(findings.get("plan"), dict):
        cards.append(plan_card(findings["plan"]))
    osc = findings.get("oscillation")
    if isinstance(osc, dict) and (osc.get("detected") or osc.get("bucket_variance_share") is not None):
        cards.append(oscillation_card(osc))
    for key, value in findings.items():
        if key in ("spikes", "nonfinite", "warnings", "causes", "findings", "verdict_facts") or not isinstance(value, list):
            continue
        items = [i for i in value if isinstance(i, dict) and i.get("step") is not None]
        if items:
            cards.append(listed_kind_card(key, items))
    from forensics.detect.kinds import kind_of

    listed: dict[str, list[dict]] = {}
    for f in findings.get("findings") or []:
        k = kind_of(str(f.get("kind")))
        if isinstance(f, dict) and k.section is None and k.told_by is None:
            listed.setdefault(k.kind, []).append(f)
    for kind, items in listed.items():
        card = kind_of(kind).card
        cards.append(card(items) if card else listed_kind_card(kind, items))
    for kind in ("forgetting",):
        if isinstance(findings.get(kind), dict) and findings[kind]:
            cards.append(generic_card(kind, findings[kind]))
    return cards
