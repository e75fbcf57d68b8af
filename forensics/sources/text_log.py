"""Plain-text training logs: the common line forms by default, or a regex with named groups.

Default forms (one parser covers them; the step word and its number anchor a metrics line):

- ``step 254 | loss 4.21 | lr 3e-4``: fields separated by ``|``, each ``key value``, ``key: value`` or ``key=value``;
- ``step=254 loss=4.21 lr=3e-4`` and ``step: 254, loss: 4.21``: ``key=value`` / ``key: value`` pairs;
- ``step:254/20344 train_loss:4.2 train_time:81991ms`` (modded-nanogpt): a ``N/M`` step, units after numbers;
- Megatron-LM: ``iteration   31219/  115311 | consumed samples: ... | lm loss: 5.098124E+00 | grad norm: 960.351 |``
  (keys with spaces are kept as logged: ``lm loss``, ``grad norm``).

The step word is one of ``step``, ``global_step``, ``iteration``, ``iter`` (whole word, any case; ``step_key``
names another); the total after
``/`` is dropped. A value may carry a unit (``81991ms``, ``12%``), which is dropped too. Lines without a step word
(banners, warnings) are skipped silently, and so are lines with a step word but no ``key value`` field ("saving
checkpoint at iteration 500"). A line that has a step word and fields but whose step or a value is not a number is
counted as malformed, with its line number.

``pattern``: a regex searched in each line, with a named group ``step`` and one named group per metric; ``__`` in a
group name stands for ``/`` (``(?P<train__loss>...)`` is ``train/loss``). Lines it does not match are skipped.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from forensics.errors import ForensicsError
from forensics.sources.reader.base import MetricsReader
from forensics.sources.reader.records import Records, sparse_columns
from forensics.sources.reader.tail import TailedFile

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)"
_VALUE = re.compile(rf"(?P<num>{_NUMBER})(?P<unit>[A-Za-z%µ]*)", re.IGNORECASE)
_STEP_WORDS = ("global_step", "iteration", "step", "iter")


def _step_regex(words: tuple[str, ...]) -> re.Pattern:
    alternatives = "|".join(re.escape(w) for w in words)
    return re.compile(
        rf"(?<![\w.])(?P<word>{alternatives})(?![\w])\s*[:=]?\s*(?P<step>[^\s|,;/:]+)(?:\s*/\s*(?P<total>\d+))?",
        re.IGNORECASE,
    )


#: A field of a ``|``-separated line: a key (spaces and parentheses allowed) then the value.
_FIELD = re.compile(r"^\s*(?P<key>[A-Za-z_][\w .()/\-\[\]]*?)\s*(?:[:=]\s*|\s+)(?P<val>\S+)\s*$")
#: ``key=value`` or ``key: value`` anywhere in a line (keys without spaces). The value is maximal and not followed
#: by ``=``/``:`` (written without a possessive quantifier, which Python 3.10 lacks).
_PAIR = re.compile(r"(?<![\w.])(?P<key>[A-Za-z_][\w./\-\[\]]*)\s*(?:=|:(?!//))\s*(?P<val>[^\s,;|=:]+)(?![^\s,;|])")
#: ``key value`` pairs, for lines with neither ``|`` nor ``:``/``=`` fields (``step 5 loss 4.2``).
_SPACED = re.compile(
    r"(?<![\w.])(?P<key>[A-Za-z_][\w./\-]*)\s+(?P<val>[-+.\d][^\s,;|]*|nan|inf)(?=[\s,;|]|$)", re.IGNORECASE
)


#: Clock times and dates (``0:01:02``, ``12:00:00.5``, ``2024-05-01``) are fields, not malformed numbers.
_TIME_OR_DATE = re.compile(r"^\d+(?::\d+)+(?:\.\d+)?,?$|^\d{4}-\d{2}-\d{2}")


def parse_value(token: str) -> float | None:
    """A logged value as a float (units dropped, nan/inf kept), or None when it is not a number."""
    m = _VALUE.fullmatch(token.rstrip(",;"))
    if not m:
        return None
    return float(m.group("num"))


def _looks_numeric(token: str) -> bool:
    """Does a token try to be a number (and so is an error when it does not parse)?"""
    return bool(token) and (token[0].isdigit() or (token[0] in "+-." and len(token) > 1))


class LineParser:
    """Parses one line of the default forms: ``(step, {key: value})``, None (not a metrics line) or an error.

    ``step_word`` replaces the default step words (``--step-key`` for text logs, e.g. ``it`` or ``batch``).
    """

    def __init__(self, step_word: str | None = None) -> None:
        self._step = _step_regex((step_word,) if step_word else _STEP_WORDS)

    def parse(self, line: str) -> tuple[int, dict[str, float]] | None | str:
        m = self._step.search(line)
        if not m:
            return None
        fields = self._fields(line, m)
        if not fields:
            return None
        step = parse_value(m.group("step"))
        if step is None or not math.isfinite(step) or step != int(step) or m.group("step")[0] in "+.":
            return f"{m.group('word')} is not a whole number ({m.group('step')!r})"
        values: dict[str, float] = {}
        for key, token in fields:
            x = parse_value(token)
            if x is None:
                if _looks_numeric(token) and not _TIME_OR_DATE.match(token):
                    return f"value of '{key}' is not a number ({token!r})"
                continue  # text, or a clock time / date field (``eta 0:01:02``): not a metric
            values[key] = x
        if not values:
            return None
        return int(step), values

    def _fields(self, line: str, m: re.Match) -> list[tuple[str, str]]:
        """(key, value-token) pairs of the line, the step field left out."""
        if "|" in line:
            out = []
            for seg in line.split("|"):
                if m.group(0).strip() in seg:
                    continue
                f = _FIELD.match(seg)
                if f:
                    out.append((f.group("key").strip(), f.group("val")))
            return out
        rest = line[: m.start()] + " " + line[m.end() :]
        if "," in rest and not _PAIR.search(rest):
            # comma-separated ``key value`` fields whose keys may hold spaces (nanoGPT: ``iter 10: loss 4.2,
            # time 120.1ms`` and ``step 0: train loss 10.98, val loss 10.99``)
            segs = [_FIELD.match(seg.strip(" :")) for seg in rest.split(",")]
            pairs = [(f.group("key").strip(), f.group("val")) for f in segs if f]
            if pairs:
                return pairs
        pairs = [(p.group("key"), p.group("val")) for p in _PAIR.finditer(rest)]
        if not pairs:
            pairs = [(p.group("key"), p.group("val")) for p in _SPACED.finditer(rest)]
        return pairs


class PatternParser:
    """Parses lines with a user regex: group ``step`` plus one group per metric (``__`` in a name means ``/``)."""

    def __init__(self, pattern: str) -> None:
        try:
            self.regex = re.compile(pattern)
        except re.error as exc:
            raise ForensicsError(f"--pattern {pattern!r} is not a valid regular expression: {exc}") from exc
        groups = list(self.regex.groupindex)
        if "step" not in groups:
            raise ForensicsError(f"--pattern {pattern!r} needs a named group 'step', e.g. (?P<step>\\d+)")
        self.metrics = {g: g.replace("__", "/") for g in groups if g != "step"}
        if not self.metrics:
            raise ForensicsError(f"--pattern {pattern!r} needs a named group per metric, e.g. (?P<loss>[-\\d.e]+)")

    def parse(self, line: str) -> tuple[int, dict[str, float]] | None | str:
        m = self.regex.search(line)
        if not m:
            return None
        step = parse_value(m.group("step") or "")
        if step is None or not math.isfinite(step) or step != int(step):
            return f"step is not a whole number ({m.group('step')!r})"
        values = {}
        for group, name in self.metrics.items():
            token = m.group(group)
            if token is None:
                continue
            x = parse_value(token.strip())
            if x is None:
                return f"value of '{name}' is not a number ({token!r})"
            values[name] = x
        return int(step), values


class TextLogReader(MetricsReader):
    """Reads a plain-text log, live or finished, with the default forms or ``pattern``."""

    format_name = "text"
    _records_step_key = "step"

    def __init__(self, source: str | Path, *, pattern: str | None = None, **opts) -> None:
        self.parser = PatternParser(pattern) if pattern else LineParser(opts.get("step_key"))
        super().__init__(source, **opts)

    def _reset_position(self) -> None:
        self._file = TailedFile(Path(self.source))
        #: The first non-blank line no pattern matched (line number, text): said when the log yields no rows.
        self.first_unmatched: tuple[int, str] | None = None

    def empty_reason(self) -> str:
        """Why the log gave no rows: its first unmatched line, and how to read it."""
        if self.first_unmatched is None:
            return "the file holds no text lines"
        line, text = self.first_unmatched
        hint = "the --pattern given" if isinstance(self.parser, PatternParser) else "the known log forms"
        return (
            f"no line matches {hint}; the first line, {line}, reads {text!r}: give --pattern REGEX with a group "
            "'step' and one named group per metric (e.g. --pattern 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+)')"
        )

    def _read_records(self) -> Records | None:
        if self._file.check_restarted():
            self.report.warn("the file was truncated or replaced; read again from the start")
        steps: list[int] = []
        where: list[int] = []
        cols: dict[str, dict[int, float]] = {}
        for block, first, _ in self._file.chunks():
            self._parse_lines(block.decode("utf-8", errors="replace").split("\n")[:-1], first, steps, where, cols)
        if self.finished:
            rest = self._file.remainder()
            if rest.strip():
                self._file.consume_remainder(len(rest))
                self._parse_lines([rest.decode("utf-8", errors="replace")], self._file.lines, steps, where, cols)
        if not steps:
            return None
        n = len(steps)
        table = {"step": pa.array(steps, pa.int64()), **sparse_columns(n, cols)}
        return Records(pa.table(table), np.asarray(where, dtype=np.int64))

    def _parse_lines(
        self, lines: list[str], first: int, steps: list[int], where: list[int], cols: dict[str, dict[int, float]]
    ) -> None:
        parse = self.parser.parse
        for i, line in enumerate(lines):
            got = parse(line)
            if got is None:
                if self.first_unmatched is None and line.strip():
                    self.first_unmatched = (first + i, line.strip()[:120])
                continue
            if isinstance(got, str):
                self._malformed(first + i, got)
                continue
            step, values = got
            row = len(steps)
            steps.append(step)
            where.append(first + i)
            for key, x in values.items():
                if key == "step":
                    key = "step_"
                cols.setdefault(key, {})[row] = x
