"""Turning values into text for the report: numbers formatted one way everywhere, dataset text always escaped.

Dataset text (sample text, sources, cluster names built from top terms) is untrusted: it is HTML-escaped wherever it
is shown, in the page and inside plotly strings (plotly renders a subset of HTML in titles and hover labels and
decodes entities, so an escaped ``<script>`` shows as the literal text).
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from forensics.schema.steps import step_span, steps_list  # noqa: F401 - the report words steps this way

_SPACE = re.compile(r"\s+")


def esc(value: Any) -> str:
    """HTML-escape any value's text (quotes too, so it is safe inside attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def snippet(text: Any, limit: int = 160) -> str:
    """The first ``limit`` characters of a text with whitespace collapsed, ``…`` when cut; not escaped."""
    if text is None or (isinstance(text, float) and math.isnan(text)):
        return ""
    flat = _SPACE.sub(" ", str(text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def fmt_num(value: Any, digits: int = 4) -> str:
    """A number as the report shows it: integers plainly, floats to ``digits`` significant digits, NaN/inf named."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if f.is_integer() and abs(f) < 1e15 and not isinstance(value, float):
        return str(int(f))
    return f"{f:.{digits}g}"


def fmt_share(value: Any) -> str:
    """A 0-1 fraction as a percentage (``0.423`` -> ``42.3%``)."""
    if value is None:
        return "–"
    try:
        f = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(f):
        return "NaN"
    if 0 < abs(f) < 0.001:
        return f"{100 * f:.3f}%"
    return f"{100 * f:.1f}%"


_JSON_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def script_safe_json(text: str) -> str:
    """JSON text made safe inside ``<script>``: ``<``, ``>``, ``&`` only occur in JSON strings, so escaping them as
    ``\\u`` sequences changes no value. Here, not in the page's module, because a card embeds its own figures."""
    return text.translate(_JSON_SAFE)
