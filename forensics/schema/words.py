"""How a count is worded: one helper for every plural the summaries, verdicts and evidence say.

Counted phrases are built in many places (the terminal summary, the verdict, cause evidence, the gate, compare);
each once wrote its own ``'s' if n != 1``, and a phrase whose noun is not its last word ("spike without a batch")
came out as "31 spike without a batchs". Here a phrase names its plural when it is not the noun plus s/es.
"""

from __future__ import annotations

_ES = ("s", "x", "z", "ch", "sh")


def plural(noun: str, n: int | None, many: str | None = None) -> str:
    """``noun`` as said of ``n`` things: the singular for exactly one, else ``many`` (default: ``noun`` + s, or + es
    after s, x, z, ch, sh: ``batch`` -> ``batches``). Zero takes the plural, as English does ("0 spikes")."""
    if n == 1:
        return noun
    if many is not None:
        return many
    return noun + ("es" if noun.endswith(_ES) else "s")


def counted(n: int | None, noun: str, many: str | None = None) -> str:
    """``n`` and its noun: ``counted(1, "spike") == "1 spike"``, ``counted(31, "spike without a batch",
    "spikes without a batch") == "31 spikes without a batch"``."""
    return f"{n} {plural(noun, n, many)}"


def ids_text(ids: list[int], limit: int = 6) -> str:
    """Sample ids in a sentence: the first ``limit`` and how many more (``1, 2, 3 +4``)."""
    return ", ".join(map(str, ids[:limit])) + (f" +{len(ids) - limit}" if len(ids) > limit else "")
