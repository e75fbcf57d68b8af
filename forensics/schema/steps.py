"""Steps in words, the one way every output writes them: canonical 0-based steps, with the run's own numbering beside
them where it differs (DESIGN.md Conventions, "logged step": HF's ``global_step`` is the canonical step + 1).

``offset`` is the logged step minus the canonical step (findings.json ``run.logged_offset``); 0 or None shows the
canonical step alone.
"""

from __future__ import annotations

from typing import Any


def step_span(start: Any, end: Any = None, offset: int | None = 0, word: str = "step") -> str:
    """``step 254`` or ``steps 254-260``, with the run's own numbering beside it where it differs: ``step 254
    (logged 255)`` for an HF run (``offset``: logged step minus canonical step, DESIGN.md "logged step")."""
    start = int(start)
    end = start if end is None else int(end)
    text = f"{word} {start}" if end == start else f"{word}s {start}-{end}"
    if offset:
        text += f" (logged {start + offset})" if end == start else f" (logged {start + offset}-{end + offset})"
    return text


def steps_list(steps: list[Any], offset: int | None = 0, limit: int = 6) -> str:
    """``254, 258 and 754`` (+ how many more), with the logged numbers beside them where they differ."""
    steps = [int(x) for x in steps]
    shown = [str(x) for x in steps[:limit]]
    text = ", ".join(shown[:-1]) + (" and " if len(shown) > 1 else "") + (shown[-1] if shown else "")
    text += f" (+{len(steps) - limit} more)" if len(steps) > limit else ""
    if offset and steps:
        logged = [str(x + offset) for x in steps[:limit]]
        text += f" (logged {', '.join(logged)}{' ...' if len(steps) > limit else ''})"
    return text
