"""Writing a bench's figures into the documentation between its markers.

The accuracy and benchmark tables of docs/ are written by the bench scripts (``--write-docs``), never typed by hand:
each script owns the text between ``<!-- NAME: begin -->`` and ``<!-- NAME: end -->`` of a page, where NAME is the
script's file name without ``.py``. A table always says how it was made (the exact command line, the machine's core
count and the date), so a reader can tell what a figure is worth and rerun it; tests/test_docs.py checks that every
marker names a bench script with ``--write-docs`` and that no table of figures lies outside the markers.
"""

from __future__ import annotations

import datetime
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"
ACCURACY = DOCS / "accuracy.md"
#: The machine's 1-minute load average when the bench started (this module is imported at its start): on a shared
#: machine it says how far the figures may be off.
LOAD_AT_START = os.getloadavg()[0]


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of section ``name``."""
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def provenance(note: str = "") -> str:
    """One line saying how the figures were made: the command as run, the date, the cores, the load average at
    the start and at the end (above half the cores, the machine was loaded by other work), and ``note``."""
    argv = [Path(sys.argv[0]).as_posix()] if sys.argv and sys.argv[0] else []
    script = argv[0] if argv else ""
    if "bench/" in script:
        script = "bench/" + script.rsplit("bench/", 1)[1]
    command = " ".join(["python3", script, *sys.argv[1:]]).strip()
    cores = os.cpu_count() or 1
    day = datetime.date.today().isoformat()
    end = os.getloadavg()[0]
    loaded = "a loaded" if max(LOAD_AT_START, end) > cores / 2 else "an idle"
    tail = f"; {note}" if note else ""
    return (
        f"Written by `{command}` on {day}; measured on {loaded} {cores}-core machine "
        f"(load average {LOAD_AT_START:.1f} at the start, {end:.1f} at the end){tail}."
    )


def write_section(name: str, markdown: str, path: Path = ACCURACY) -> None:
    """Replace what lies between section ``name``'s markers in ``path`` with ``markdown`` (the markers stay; each
    is a line of its own, so a page may quote a marker inside a sentence).

    Fails with one line naming the file and the markers it expected when they are missing or appear more than
    once, so a bench never appends a second copy of its table or writes into the wrong page.
    """
    begin, end = markers(name)
    text = path.read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines()]
    if lines.count(begin) != 1 or lines.count(end) != 1 or lines.index(begin) > lines.index(end):
        raise SystemExit(f"{path}: expected the markers {begin} and {end} once each, in that order, each on a line")
    pattern = "^" + re.escape(begin) + "$.*?^" + re.escape(end) + "$"
    text = re.sub(pattern, lambda _: f"{begin}\n{markdown.strip()}\n{end}", text, flags=re.S | re.M)
    path.write_text(text, encoding="utf-8")
    print(f"wrote {name} into {path}")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table of ``rows`` under ``header``."""
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def rich_markdown(table) -> str:
    """A ``rich.table.Table`` a bench printed, as a markdown table of the same cells."""
    header = [str(c.header) for c in table.columns]
    return markdown_table(header, [list(cells) for cells in zip(*(c._cells for c in table.columns))])
