"""The figures of the documentation are written by the bench scripts, never typed by hand.

A bench script owns the text of a page between ``<!-- NAME: begin -->`` and ``<!-- NAME: end -->``, NAME being the
script's file name without ``.py`` (optionally followed by a word naming one of its runs, as ``bench_detection_quality
long``), and writes it with ``--write-docs`` through ``bench/_docs.py``. These tests hold the pages to that: every
marker names a script that has the option, every section says which command writes it, and no table row of a page of
figures carries a measured figure outside a marker pair.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: Pages whose tables are figures: every table row holding a measured figure must lie inside a bench's markers.
FIGURE_PAGES = ("accuracy.md",)
#: A marker is a line of its own (a page may quote one inside a sentence).
MARKER = re.compile(r"^<!-- ([\w ]+): (begin|end) -->$")
#: A measured figure: a number followed by a unit of time, size, a ratio ("1.10x") or a share ("12%"). A count
#: ("2,010 corrupted"), a size in rows ("1M rows x 10 metrics") or a name ("x86", "rolling(64)") is not one.
FIGURE = re.compile(r"\d[\d.,]*\s?(?:x|%|s|ms|us|MB|GB|MiB|GiB|KiB)(?!\w)")


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _sections(text: str, page: str) -> list[tuple[str, int, int]]:
    """``(name, first line, last line)`` of each marker pair of ``text`` (0-based line numbers), checking that the
    pairs are closed, in order and not nested."""
    out, open_ = [], None
    for number, line in enumerate(text.splitlines()):
        m = MARKER.match(line.strip())
        if not m:
            continue
        name, edge = m.groups()
        if edge == "begin":
            assert open_ is None, f"{page}:{number + 1}: {name} begins inside {open_[0]}"
            open_ = (name, number)
        else:
            assert open_ is not None and open_[0] == name, f"{page}:{number + 1}: {name} ends where it did not begin"
            out.append((name, open_[1], number))
            open_ = None
    assert open_ is None, f"{page}: {open_[0]} never ends"
    return out


def _all_sections() -> list[tuple[str, str, str]]:
    """``(page, name, text between the markers)`` over every page of docs/."""
    found = []
    for path in _pages():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for name, begin, end in _sections(text, path.name):
            found.append((str(path.relative_to(DOCS)), name, "\n".join(lines[begin + 1 : end])))
    return found


def _options(script: Path) -> set[str]:
    """The option strings the script's argparse parsers declare (read from its source, not run)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


def _figure_rows_outside_markers(text: str) -> list[str]:
    """The table rows of ``text`` that hold a measured figure and lie outside every marker pair."""
    lines = text.splitlines()
    inside = set()
    for _, begin, end in _sections(text, "page"):
        inside.update(range(begin, end + 1))
    return [
        line
        for number, line in enumerate(lines)
        if number not in inside and line.lstrip().startswith("|") and FIGURE.search(line)
    ]


SECTIONS = _all_sections()
#: How a section opens whose figures were typed before its bench wrote them (to be replaced by its next run).
TYPED = "Figures typed before the bench wrote them here"


def test_the_pages_hold_the_bench_sections():
    names = {name for _, name, _ in SECTIONS}
    assert {
        "bench_detect",
        "bench_detection_quality",
        "bench_triage",
        "bench_composition_family",
        "bench_wandb_reader",
        "bench_scale",
        "bench_audit_process",
        "bench_cold_start",
        "bench_whole_process",
        "bench_recorder",
        "bench_replay",
        "bench_jsonl",
        "bench_report",
        "bench_buckets",
    } <= names


@pytest.mark.parametrize(("page", "name", "body"), SECTIONS, ids=[f"{p}:{n}" for p, n, _ in SECTIONS])
def test_every_marker_names_a_bench_with_write_docs(page: str, name: str, body: str):
    script = ROOT / "bench" / f"{name.split()[0]}.py"
    assert script.is_file(), f"docs/{page}: marker {name!r} names no script bench/{script.name}"
    assert "--write-docs" in _options(script), f"bench/{script.name} has no --write-docs option"
    written = re.search(
        rf"Written by `python3 bench/{re.escape(script.name)} [^`]*--write-docs[^`]*` on \d{{4}}-", body
    )
    typed = body.startswith(TYPED) and f"`python3 bench/{script.name}" in body
    assert written or typed, f"docs/{page}: section {name!r} neither says which run wrote it nor that it was typed"


@pytest.mark.parametrize("page", FIGURE_PAGES)
def test_no_table_of_figures_outside_the_markers(page: str):
    assert _figure_rows_outside_markers((DOCS / page).read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("cell", "is_figure"),
    [
        ("1.10x", True),
        ("0.85x, 1.01x", True),
        ("98.9%", True),
        ("-0.4%", True),
        ("0.73 s", True),
        ("12.75 ms", True),
        ("2.52 GB", True),
        ("397 MiB", True),
        ("1M rows x 10 metrics", False),
        ("10 of 2,010 corrupted", False),
        ("`rolling(64).median()`", False),
        ("x86", False),
        ("3 seeds", False),
        ("0 / 1 / 0", False),
        ("4 of 4", False),
    ],
)
def test_what_counts_as_a_figure(cell: str, is_figure: bool):
    assert bool(FIGURE.search(f"| {cell} |")) is is_figure


@pytest.mark.parametrize(
    ("text", "outside"),
    [
        ("| a | 1.10x |", ["| a | 1.10x |"]),
        ("<!-- bench_x: begin -->\n| a | 1.10x |\n<!-- bench_x: end -->", []),
        ("<!-- bench_x: begin -->\n<!-- bench_x: end -->\n| a | 12% |", ["| a | 12% |"]),
        ("| script | what |\n| --- | --- |\n| `bench_x.py` | 1M rows |", []),
        ("prose with 1.10x in it", []),
        ("quoting `<!-- bench_x: begin -->`\n| a | 1.10x |", ["| a | 1.10x |"]),
    ],
)
def test_figure_rows_outside_markers(text: str, outside: list[str]):
    assert _figure_rows_outside_markers(text) == outside


@pytest.mark.parametrize(
    "text",
    [
        "<!-- bench_x: begin -->\nno end",
        "<!-- bench_x: end -->",
        "<!-- bench_x: begin -->\n<!-- bench_y: begin -->\n<!-- bench_y: end -->\n<!-- bench_x: end -->",
    ],
)
def test_unbalanced_markers_are_refused(text: str):
    with pytest.raises(AssertionError):
        _sections(text, "page")


@pytest.fixture
def docs_helper():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import _docs
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return _docs


def test_write_section_replaces_only_between_its_markers(docs_helper, tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "before\n<!-- bench_x: begin -->\nold\n<!-- bench_x: end -->\n"
        "<!-- bench_y: begin -->\nkept\n<!-- bench_y: end -->\nafter\n"
    )
    docs_helper.write_section("bench_x", "| a | 1.10x |\n", page)
    assert page.read_text() == (
        "before\n<!-- bench_x: begin -->\n| a | 1.10x |\n<!-- bench_x: end -->\n"
        "<!-- bench_y: begin -->\nkept\n<!-- bench_y: end -->\nafter\n"
    )


def test_write_section_leaves_a_quoted_marker_alone(docs_helper, tmp_path: Path):
    quoted = "A sentence naming `<!-- bench_x: begin -->` as an example.\n"
    page = tmp_path / "page.md"
    page.write_text(quoted + "<!-- bench_x: begin -->\nold\n<!-- bench_x: end -->\n")
    docs_helper.write_section("bench_x", "new", page)
    assert page.read_text() == quoted + "<!-- bench_x: begin -->\nnew\n<!-- bench_x: end -->\n"


@pytest.mark.parametrize(
    "text",
    [
        "no markers at all\n",
        "<!-- bench_x: begin -->\nonly the beginning\n",
        "<!-- bench_x: end -->\n<!-- bench_x: begin -->\n",
        "<!-- bench_x: begin -->\n<!-- bench_x: end -->\n<!-- bench_x: begin -->\n<!-- bench_x: end -->\n",
    ],
)
def test_write_section_fails_clearly_without_its_markers(docs_helper, tmp_path: Path, text: str):
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(SystemExit, match=r"page\.md: expected the markers <!-- bench_x: begin --> and"):
        docs_helper.write_section("bench_x", "new", page)
    assert page.read_text() == text


@pytest.mark.parametrize(
    ("start", "end", "machine"),
    [
        (0.5, 0.5, "an idle 2-core machine (load average 0.5 at the start, 0.5 at the end)"),
        (1.0, 1.0, "an idle 2-core machine (load average 1.0 at the start, 1.0 at the end)"),
        (1.01, 0.2, "a loaded 2-core machine (load average 1.0 at the start, 0.2 at the end)"),
        (0.2, 1.5, "a loaded 2-core machine (load average 0.2 at the start, 1.5 at the end)"),
    ],
)
def test_provenance_names_the_command_machine_and_date(
    docs_helper, monkeypatch: pytest.MonkeyPatch, start: float, end: float, machine: str
):
    """Above half the cores' worth of load, at the start or the end, the machine is called loaded."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "bench" / "bench_x.py"), "--write-docs", "--rows", "10"])
    monkeypatch.setattr(docs_helper.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(docs_helper.os, "getloadavg", lambda: (end, end, end))
    monkeypatch.setattr(docs_helper, "LOAD_AT_START", start)
    monkeypatch.setattr(docs_helper.datetime, "date", type("D", (), {"today": staticmethod(lambda: _Day())}))
    assert docs_helper.provenance() == (
        f"Written by `python3 bench/bench_x.py --write-docs --rows 10` on 2026-01-02; measured on {machine}."
    )


class _Day:
    def isoformat(self) -> str:
        return "2026-01-02"
