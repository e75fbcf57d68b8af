"""Crash lines in a run's text logs, and the sources' rewinds as metrics steps: what the run-health rules read.

A run that dies says why in its last lines (a CUDA out-of-memory traceback, an NCCL watchdog timeout, an ECC error,
a NaN assertion, the OOM killer), and those lines sit in files that are not metrics: the scheduler's
``slurm-*.out`` / ``*.err`` beside the case, the logs run.toml names under ``logs``, and the text metrics sources
themselves. Only the tail of each file is read (:data:`TAIL_BYTES`), so a long log costs nothing.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError

#: Bytes read from the end of each file: a crash says itself in the last lines.
TAIL_BYTES = 64 * 1024
#: Crash kinds, most specific first: a traceback is only the wrapper of the others.
CRASH_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "oom",
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"
            r"|HIP out of memory",
            re.I,
        ),
    ),
    (
        "nccl",
        re.compile(
            r"NCCL[^\n]*(timeout|timed out|watchdog|error)|Watchdog caught collective operation timeout"
            r"|nccl(Internal|System|Unhandled(Cuda)?|Remote)Error",
            re.I,
        ),
    ),
    ("ecc", re.compile(r"cudaErrorECCUncorrectable|uncorrectable ECC|ECC error", re.I)),
    (
        "nonfinite",
        re.compile(
            r"(AssertionError|RuntimeError|ValueError|FloatingPointError)[^\n]*\b(nan|inf|non-?finite)"
            r"\b|\bloss (is|became|was) (nan|inf)\b|returned nan values",
            re.I,
        ),
    ),
    (
        "killed",
        re.compile(
            r"oom[-_ ]kill|Out of memory: Killed process|\bSIGKILL\b|signal 9\b|exitcode\s*:\s*-9\b"
            r"|^\s*Killed\s*$",
            re.I,
        ),
    ),
    ("traceback", re.compile(r"^Traceback \(most recent call last\):")),
)
#: A step number as training logs print it (``step:120/5000``, ``iteration   31214/``, ``global_step=7``).
STEP_IN_LINE = re.compile(r"\b(?:global[_ ]step|step|iteration|iter)\b\s*[:=]?\s*(\d+)", re.I)


@dataclass(frozen=True)
class CrashLine:
    """One crash: its kind (``what``), the line that says it, its file and line number (None when only the file's
    tail was read), and the last step the file logged before it."""

    what: str
    line: str
    path: str
    line_no: int | None
    logged_step: int | None


def crash_log_files(case: Any, report: Any) -> list[str]:
    """The files read for crash lines: the text metrics sources, run.toml ``logs`` (a missing one is bad input), and
    ``slurm-*.out`` / ``*.err`` in the case folder; each once, in that order."""
    out = [a.source for a in report.alignments if a.format == "text"]
    for name in case.config.logs:
        path = case.config.resolve(name)
        if path is None or not path.is_file():
            raise ForensicsError(f"run.toml logs: {path} is not a file (expected a text log read for crash lines)")
        out.append(str(path))
    if case.root is not None and Path(case.root).is_dir():
        root = Path(case.root)
        out += [str(p) for p in sorted(root.glob("slurm-*.out")) + sorted(root.glob("*.err")) if p.is_file()]
    seen: set[str] = set()
    unique = []
    for p in out:
        key = str(Path(p).resolve())
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def shifted_rewinds(report: Any) -> list[Any]:
    """Every source's rewinds with their steps as metrics steps (logged step minus the source's offset)."""
    offsets = {a.source: int(a.step_offset) for a in report.alignments}
    out = []
    for r in report.rewinds:
        n = offsets.get(r.source, 0)
        overlap = {k: [(s - n, a, b) for s, a, b in v] for k, v in r.overlap.items()}
        out.append(
            dataclasses.replace(
                r,
                from_step=r.from_step - n,
                last_step=None if r.last_step is None else r.last_step - n,
                overlap=overlap,
            )
        )
    return out


def _tail(path: str) -> tuple[list[str], int | None]:
    """The last lines of a file and the line number of the first one (None when only the tail was read)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as f:
            if size > TAIL_BYTES:
                f.seek(size - TAIL_BYTES)
            raw = f.read()
    except OSError as e:
        raise ForensicsError(f"{path}: cannot read it for crash lines ({e.strerror})") from None
    text = raw.decode("utf-8", errors="replace").splitlines()
    if size > TAIL_BYTES and text:
        return text[1:], None  # the first line is cut
    return text, 1


def crash_lines(path: str) -> list[CrashLine]:
    """The crashes the end of ``path`` tells, one per kind, most specific first; a traceback counts only when no
    other kind is found (it wraps them). ``line`` is the matched line (for a traceback, the exception line)."""
    lines, first = _tail(path)
    step: int | None = None
    found: dict[str, CrashLine] = {}
    in_traceback = False
    for i, text in enumerate(lines):
        no = first + i if first else None
        m = STEP_IN_LINE.search(text)
        if m and not in_traceback:
            step = int(m.group(1))
        for what, pattern in CRASH_PATTERNS:
            if what in found or not pattern.search(text):
                continue
            if what == "traceback":
                in_traceback = True
                line = next((t for t in lines[i + 1 :] if t and not t[0].isspace()), text)
            else:
                line = text
            found[what] = CrashLine(what, line.strip()[:500], path, no, step)
            break
    order = [w for w, _ in CRASH_PATTERNS]
    items = sorted(found.values(), key=lambda c: order.index(c.what))
    if len(items) > 1:
        items = [c for c in items if c.what != "traceback"]
    return items
