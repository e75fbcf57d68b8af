"""Text for the page: numbers formatted as in the report, dataset text escaped so that it always shows as text.

Streamlit renders Markdown (and a little HTML) in ``st.markdown``; a sample or cluster name could hold ``<script>``,
``**`` or ``[link](...)``. :func:`md` escapes every Markdown and HTML character, so such text is shown literally.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from forensics.report.text import fmt_num, snippet, step_span

#: Characters that start Markdown syntax (emphasis, links, code, headings, tables, strike, LaTeX, quotes).
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#|~>$])")


def md(value: Any) -> str:
    """``value`` as Markdown that shows it literally (Markdown characters backslash-escaped, ``<``/``&`` as
    entities, newlines folded)."""
    text = "" if value is None else str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return " ".join(text.split())


def steps_text(steps: Iterable[Any], limit: int = 12) -> str:
    """``254, 258, 754 (+3 more)``."""
    steps = [int(s) for s in steps]
    head = ", ".join(str(s) for s in steps[:limit])
    return head + (f" (+{len(steps) - limit} more)" if len(steps) > limit else "")


def spike_line(s: dict[str, Any]) -> str:
    """One spike event in a sentence: where, how high, bucket and cluster, suspects (dataset text not escaped)."""
    start, end = int(s["step"]), int(s.get("end_step") if s.get("end_step") is not None else s["step"])
    span = step_span(start, end, int(s.get("logged_step", start)) - start)
    parts = [
        f"{s.get('kind', 'spike')} at {span}: {s.get('metric', '')} {fmt_num(s.get('value'))} vs baseline "
        f"{fmt_num(s.get('baseline'))}"
    ]
    if s.get("severity"):
        parts.append(str(s["severity"]))
    if s.get("bucket") is not None:
        parts.append(f"bucket {fmt_num(s['bucket'])} {s.get('bucket_range') or ''}".strip())
    if s.get("cluster") is not None:
        name = s.get("cluster_name")
        parts.append(f"cluster {fmt_num(s['cluster'])}" + (f" '{snippet(name, 40)}'" if name else ""))
    suspects = list(s.get("suspect_samples") or [])
    if suspects:
        parts.append("suspects " + ", ".join(str(int(i)) for i in suspects[:5]) + (" …" if len(suspects) > 5 else ""))
    return " · ".join(parts)


def clock(ts: float) -> str:
    """A wall-clock time as ``HH:MM:SS`` UTC."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%H:%M:%S UTC")


def age(seconds: float | None) -> str:
    """``3 s``, ``4 min``, ``2.5 h``, ``3.0 days``."""
    if seconds is None:
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def events(findings: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Spikes grouped by event (same start and end on several metrics), the loss's first."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for s in findings.get("spikes") or []:
        end = s.get("end_step") if s.get("end_step") is not None else s["step"]
        groups.setdefault((int(s["step"]), int(end)), []).append(s)
    loss = (findings.get("run") or {}).get("loss_key")
    out = []
    for key in sorted(groups):
        items = sorted(groups[key], key=lambda s: (s.get("metric") != loss, str(s.get("metric"))))
        out.append((items[0], items[1:]))
    return out
