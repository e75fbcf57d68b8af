"""The cards of the built-in kinds, one function each, as the registry of finding kinds names them
(:mod:`forensics.detect.kinds`: ``card = "forensics.report.cards.builtin:<function>"``), plus the card of a cause.

Each registered card takes the findings of its kind (or, for a run-level section, the section object) and the
:class:`~forensics.report.cards.CardContext`, and returns HTML cards. Cards render whatever keys a finding has
(the findings model grows over time; a missing optional key is simply not shown).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forensics.detect.rules.composition import plan_words
from forensics.report.cards.blocks import (
    BatchLookup,
    as_float,
    batch_table,
    evidence_list,
    extra_numbers,
    next_step_block,
    numbers_block,
    prose,
    recurrence_table,
    slug,
    value_text,
)
from forensics.report.rerun import rerun_entries, rerun_figure, rerun_sentence
from forensics.report.text import esc, fmt_num, fmt_share, script_safe_json, snippet, step_span, steps_list
from forensics.schema.words import counted

if TYPE_CHECKING:
    import pandas as pd

    from forensics.report.cards import CardContext

#: Non-finite steps listed per card.
MAX_NONFINITE_ROWS = 40


_SPIKE_SHOWN = {
    "kind",
    "step",
    "end_step",
    "peak_step",
    "metric",
    "value",
    "baseline",
    "score",
    "bucket",
    "bucket_range",
    "cluster",
    "cluster_name",
    "suspect_samples",
    "evidence",
    "next_step",
    "recurrence",
    "severity",
    "recovery_step",
    "title",
    "details",
    "ratio",
}


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
    span = step_span(start, end, int(spike.get("logged_step", start)) - start, word="Step")
    value, baseline = as_float(spike.get("value")), as_float(spike.get("baseline"))
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
    numbers = numbers_block(
        [
            ("metric", esc(metric)),
            ("peak step", str(peak)),
            ("peak value", esc(value_text(spike, "value"))),
            ("baseline", esc(value_text(spike, "baseline"))),
            ("peak / baseline", ratio),
            ("score", esc(value_text(spike, "score", 3))),
            ("steps", str(end - start + 1)),
            ("length bucket", esc(where)),
            ("cluster", esc(cluster)),
            ("severity", esc(spike.get("severity") or "")),
            ("recovered at", fmt_num(recovery) if recovery is not None else ""),
        ]
        + extra_numbers(spike, _SPIKE_SHOWN)
    )
    badge = "loss spike" if metric == loss_key or "loss" in str(metric).lower() else f"{metric} spike"
    zoom = f'<button class="zoom" type="button" data-x0="{start}" data-x1="{end}">show on the curves</button>'
    parts = [
        f'<article class="card finding spike" id="spike-{start}-{slug(metric)}" data-kind="spike" '
        f'data-step="{start}" data-peak-step="{peak}">',
        f'<header><span class="badge alert">{esc(badge)}</span><h3>{span}'
        f"<small> · peak at {peak}</small></h3>{zoom}</header>",
        numbers,
        evidence_list("Evidence", spike.get("evidence") or []),
        batch_table(spike, peak, start, end, lookup, batches, names),
        recurrence_table(spike, metric),
        next_step_block(spike),
        "</article>",
    ]
    return "\n".join(p for p in parts if p)


def nonfinite_card(items: list[dict]) -> str:
    """One card for all NaN/inf values (they are usually a run of steps, not independent findings)."""
    metrics = sorted({str(i.get("metric", "")) for i in items})
    steps = sorted(int(i["step"]) for i in items if i.get("step") is not None)
    first, last = (steps[0], steps[-1]) if steps else (None, None)
    rows = "".join(
        f"<tr><td>{int(i['step'])}</td><td>{esc(i.get('metric', ''))}</td><td>{esc(value_text(i, 'value'))}</td></tr>"
        for i in sorted(items, key=lambda i: int(i["step"]))[:MAX_NONFINITE_ROWS]
    )
    more = len(items) - MAX_NONFINITE_ROWS
    return "\n".join(
        [
            f'<article class="card finding nonfinite" data-kind="nonfinite" data-step="{first}">',
            f'<header><span class="badge alert">non-finite</span><h3>{counted(len(items), "NaN/inf value")}'
            f"<small> · steps {first}–{last}</small></h3></header>",
            numbers_block(
                [("metrics", esc(", ".join(metrics))), ("first step", fmt_num(first)), ("last step", fmt_num(last))]
            ),
            f'<div class="scroll"><table><thead><tr><th>step</th><th>metric</th><th>value</th></tr></thead>'
            f"<tbody>{rows}</tbody></table></div>",
            f'<p class="muted">… and {more} more.</p>' if more > 0 else "",
            '<p class="next"><span>Next step</span>Look at the step before the first NaN: a spike, an lr change or a '
            "batch with an outlier sample usually precedes it; replay that step from the checkpoint before it.</p>",
            "</article>",
        ]
    )


#: From this share of the detrended loss variance on, the bucket "explains the jumpiness" (the jumpiness detector's
#: threshold); below it the bucket mix is only a detail.
JUMPINESS_SHARE = 0.2


def oscillation_card(osc: dict) -> str:
    """Oscillation and bucket-explained jumpiness: detected or not, and how much bucket / cluster explain."""
    detected = bool(osc.get("detected"))
    share = osc.get("bucket_variance_share")
    explained = share is not None and share >= JUMPINESS_SHARE
    title = (
        "Oscillation detected" if detected else "Jumpiness explained by the batch mix" if explained else "Oscillation"
    )
    shown = {"detected", "bucket_variance_share", "cluster_variance_share", "evidence", "next_step"}
    numbers = numbers_block(
        [
            ("detected", "yes" if detected else "no"),
            ("variance explained by bucket", fmt_share(share) if share is not None else ""),
            (
                "variance explained by cluster",
                fmt_share(osc.get("cluster_variance_share")) if osc.get("cluster_variance_share") is not None else "",
            ),
        ]
        + extra_numbers(osc, shown)
    )
    return "\n".join(
        p
        for p in [
            '<article class="card finding oscillation" data-kind="oscillation">',
            f'<header><span class="badge {"alert" if detected else "info"}">oscillation</span><h3>{esc(title)}</h3>'
            "</header>",
            numbers,
            evidence_list("Evidence", osc.get("evidence") or []),
            next_step_block(osc),
            "</article>",
        ]
        if p
    )


def plan_card(pf: dict) -> str:
    """The batch plan's composition test: static or not, pair retention and identical batches per epoch pair."""
    static = pf.get("static")
    words = plan_words(pf)
    title = (
        f"Batch plan {words}"
        if words
        else "Batch composition varies across epochs"
        if static is not None
        else "Batch plan"
    )
    retention = [fmt_share(v) for v in pf.get("pair_retention") or []]
    identical = [fmt_share(v) for v in pf.get("identical_batches") or []]
    threshold = pf.get("threshold") if isinstance(pf.get("threshold"), dict) else {}
    shown = {
        "static",
        "pair_retention",
        "identical_batches",
        "threshold",
        "evidence",
        "next_step",
        "order_only",
        "coverage",
        "passed",
        "pair_retention_first_last",
        "identical_batches_first_last",
    }
    numbers = numbers_block(
        [
            ("static", "yes" if static else "no" if static is not None else ""),
            ("pair retention per epoch pair", esc(", ".join(retention))),
            ("identical batches per epoch pair", esc(", ".join(identical))),
            (
                "pair retention, first vs last epoch",
                fmt_share(pf.get("pair_retention_first_last"))
                if pf.get("pair_retention_first_last") is not None
                else "",
            ),
            (
                "identical batches, first vs last epoch",
                fmt_share(pf.get("identical_batches_first_last"))
                if pf.get("identical_batches_first_last") is not None
                else "",
            ),
            (
                "pair retention limit",
                fmt_share(threshold.get("pair_retention")) if threshold.get("pair_retention") is not None else "",
            ),
            ("limit derived", esc(threshold.get("how") or "")),
        ]
        + extra_numbers(pf, shown)
    )
    return "\n".join(
        p
        for p in [
            '<article class="card finding plan" data-kind="plan">',
            f'<header><span class="badge {"alert" if static else "ok"}">batch plan</span>'
            f"<h3>{esc(title)}</h3></header>",
            numbers,
            evidence_list("Evidence", (pf.get("evidence") or []) + list(pf.get("notes") or [])),
            next_step_block(pf),
            "</article>",
        ]
        if p
    )


def generic_card(kind: str, finding: dict) -> str:
    """A finding kind the report has no dedicated card for (e.g. ``forgetting``): its scalars and sentences."""
    shown = {"evidence", "next_step"}
    detected = finding.get("detected")
    severity = finding.get("severity") or ("critical" if detected else "info")
    badge = {"critical": "alert", "warning": "warn"}.get(str(severity), "info")
    return "\n".join(
        p
        for p in [
            f'<article class="card finding" data-kind="{esc(kind)}">',
            f'<header><span class="badge {badge}">{esc(kind)}</span>'
            f"<h3>{esc(kind.replace('_', ' ').capitalize())}</h3></header>",
            numbers_block(extra_numbers(finding, shown)),
            evidence_list("Evidence", finding.get("evidence") or []),
            next_step_block(finding),
            "</article>",
        ]
        if p
    )


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
        cells = "".join(
            f"<td>{esc(value_text(i, c) if c not in ('metric', 'cluster_name') else i.get(c) or '')}</td>" for c in cols
        )
        evidence = (i.get("evidence") or [""])[0]
        rows.append(f"<tr>{cells}<td>{prose(evidence)}</td></tr>")
    more = len(items) - MAX_NONFINITE_ROWS
    severe = any(i.get("severity") == "critical" for i in items)
    next_steps = list(dict.fromkeys(str(i["next_step"]) for i in items if i.get("next_step")))[:1]
    return "\n".join(
        p
        for p in [
            f'<article class="card finding" data-kind="{esc(kind)}" data-step="{int(items[0]["step"])}">',
            f'<header><span class="badge {"alert" if severe else "info"}">{esc(kind.replace("_", " "))}</span>'
            f"<h3>{esc(title)}<small> · {len(items)}</small></h3></header>",
            f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>',
            f'<p class="muted">… and {more} more.</p>' if more > 0 else "",
            next_step_block({"next_step": next_steps[0]}) if next_steps else "",
            "</article>",
        ]
        if p
    )


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
        for peak, group in events.items()
    )
    table = (
        (
            f'<table class="events"><thead><tr><th>step</th><th>metrics</th><th>value vs baseline</th>'
            f"<th>bucket</th></tr></thead><tbody>{rows}</tbody></table>"
        )
        if rows
        else ""
    )
    lead = spikes[0] if spikes else None
    batch = ""
    if lead is not None:
        first = min(events) if events else int(lead["step"])
        lead = next((s for s in events.get(first, []) if s.get("metric") == loss_key), events.get(first, [lead])[0])
        start = int(lead["step"])
        end = int(lead["end_step"]) if lead.get("end_step") is not None else start
        batch = batch_table(lead, first, start, end, lookup, batches, names) + recurrence_table(
            lead, str(lead.get("metric"))
        )
    steps = cause.get("events") or cause.get("steps") or []
    logged = cause.get("logged_steps") or []
    offset = int(logged[0]) - int(cause["steps"][0]) if logged and cause.get("steps") else 0
    where = f"steps {steps_list(steps, offset, limit=8)}" if steps else "the whole run"
    x0, x1 = (min(cause["steps"]), max(cause["steps"])) if cause.get("steps") else (None, None)
    zoom = (
        f'<button class="zoom" type="button" data-x0="{x0}" data-x1="{x1}">show on the curves</button>'
        if x0 is not None
        else ""
    )
    parts = [
        f'<article class="card finding cause" id="cause-{esc(cause.get("id"))}" data-kind="cause" '
        f'data-cause="{esc(cause.get("id"))}" data-step="{steps[0] if steps else ""}">',
        f'<header><span class="badge {badge}">{esc(cause.get("id"))} · {esc(cause.get("kind"))}</span>'
        f"<h3>{esc(where)}<small> · {esc(severity)}, confidence {float(cause.get('confidence') or 0):.2f}</small>"
        f"</h3>{zoom}</header>",
        f"<p>{prose(cause.get('summary'))}</p>",
        table,
        evidence_list("Evidence", [e for s in spikes[:1] for e in (s.get("evidence") or [])]),
        batch,
        _replay_rows([replay[s] for s in steps if replay and s in replay]),
        rerun_panel(cause, replay),
        f'<p class="next"><b>Next step:</b> {prose(cause.get("next_step"))}</p>' if cause.get("next_step") else "",
        "</article>",
    ]
    return "\n".join(p for p in parts if p)


def _replay_rows(results: list[dict]) -> str:
    """The replay's verdict per step of the cause (``forensics replay``), with its evidence sentences; a checkpoint
    saved after the step (none before it) says so, as the terminal's table does: its verdict weighs less."""
    if not results:
        return ""
    rows = "".join(
        f"<tr><td>{esc(r.get('step'))}</td><td><b>{esc(r.get('verdict'))}</b></td>"
        f"<td>{esc(r.get('checkpoint_step'))}{' (after)' if r.get('checkpoint') == 'after' else ''}</td>"
        f"<td>{esc(fmt_num(r.get('logged')))} / "
        f"{esc(fmt_num(r.get('replayed')))}</td>"
        f"<td>{prose(' '.join(map(str, (r.get('evidence') or [])[:3])))}</td></tr>"
        for r in results
    )
    return (
        f'<section><h4>Replay (forensics replay)</h4><div class="scroll"><table class="replay"><thead><tr>'
        f"<th>step</th><th>verdict</th><th>checkpoint</th><th>logged / replayed</th><th>evidence</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div></section>"
    )


#: Re-run figures per cause card at most (the cause's first replayed steps).
MAX_RERUN_FIGURES = 3


def rerun_panel(cause: dict, replay: dict[int, dict] | None) -> str:
    """The cause's segment re-runs (``forensics replay --rerun``): per step, the class and action sentence and a
    figure of the per-group update/weight ratio and grad norm around the spike, drawn by the page's loader from the
    JSON beside it (the card carries its own figure, so a card is whole wherever it is placed)."""
    entries = rerun_entries(cause, replay)[:MAX_RERUN_FIGURES]
    if not entries:
        return ""
    import plotly.io as pio

    blocks = []
    for e in entries:
        target = f"fig-rerun-{slug(cause.get('id'))}-{int(e['step'])}"
        fig = rerun_figure(e)
        blocks.append(
            f'<p class="rerun-class">{prose(rerun_sentence(e))}</p>'
            f'<div class="plot-frame"><div class="plot rerun" id="{esc(target)}" '
            f'style="height:{int(fig.layout.height or 300)}px"></div></div>'
            f'<script type="application/json" class="card-figure" data-target="{esc(target)}">'
            f"{script_safe_json(pio.to_json(fig, validate=False, pretty=False))}</script>"
        )
    head = "<h4>Re-run from the checkpoint (per parameter group)</h4>"
    return f'<section class="rerun">{head}{"".join(blocks)}</section>'


# --- the registry's cards: (items, context) -> cards -----------------------------------------------------------------
def spike_cards(items: list[dict], ctx: CardContext) -> list[str]:
    """One card per spike no cause card tells."""
    return [
        spike_card(s, ctx.lookup, ctx.batches, ctx.names, ctx.loss_key)
        for s in sorted(items, key=lambda s: (int(s["step"]), str(s.get("metric", ""))))
    ]


def nonfinite_cards(items: list[dict], ctx: CardContext) -> list[str]:
    return [nonfinite_card(items)]


def plan_cards(items: list[dict], ctx: CardContext) -> list[str]:
    return [plan_card(items[0])]


def oscillation_cards(items: list[dict], ctx: CardContext) -> list[str]:
    osc = items[0]
    return [oscillation_card(osc)] if osc.get("detected") or osc.get("bucket_variance_share") is not None else []


def section_cards(items: list[dict], ctx: CardContext, kind: str = "section") -> list[str]:
    """A run-level section without a card of its own: its scalars and sentences."""
    return [generic_card(kind, items[0])]


def listed_cards(items: list[dict], ctx: CardContext, kind: str = "finding") -> list[str]:
    """Findings of a kind without a card of its own: one table of them."""
    return [listed_kind_card(kind, items)]
