"""Steps in words, the one way every output writes them: canonical 0-based steps, with the run's own numbering beside
them where it differs (docs/concepts.md, "logged step": HF's ``global_step`` is the canonical step + 1).

``offset`` is the logged step minus the canonical step (findings.json ``run.logged_offset``); 0 or None shows the
canonical step alone.
"""

from __future__ import annotations

from typing import Any


def step_span(start: Any, end: Any = None, offset: int | None = 0, word: str = "step") -> str:
    """``step 254`` or ``steps 254-260``, with the run's own numbering beside it where it differs: ``step 254
    (logged 255)`` for an HF run (``offset``: logged step minus canonical step, docs/concepts.md "logged step")."""
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


STEPS_AS = ("canonical", "logged")


def case_logged_offset(case: Any) -> int:
    """A case's logged step minus its canonical step: findings.json ``run.logged_offset`` when an audit wrote one,
    else 1 for a run whose recorder saw HF Trainer numbering (``step_convention = "hf-trainer"``), else 0."""
    import json

    path = getattr(case, "findings_path", None)
    if path is not None and path.exists():
        try:
            run = json.loads(path.read_text()).get("run") or {}
        except (OSError, ValueError):
            run = {}
        if run.get("logged_offset") is not None:
            return int(run["logged_offset"])
    convention = getattr(getattr(case, "config", None), "step_convention", None)
    return 1 if convention == "hf-trainer" else 0


def to_canonical(steps: list[int], steps_as: str, offset: int) -> list[int]:
    """Steps a user typed, as canonical 0-based steps: ``--steps-as logged`` subtracts the run's offset."""
    if steps_as not in STEPS_AS:
        raise ValueError(f"steps_as must be one of {STEPS_AS}, not {steps_as!r}")
    return [int(s) - (offset if steps_as == "logged" else 0) for s in steps]


def as_shown(steps: list[int], steps_as: str, offset: int) -> list[int]:
    """Canonical steps in the numbering a printed command uses (the inverse of :func:`to_canonical`)."""
    return [int(s) + (offset if steps_as == "logged" else 0) for s in steps]
