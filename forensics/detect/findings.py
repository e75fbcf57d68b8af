"""The one findings model: what every detector emits and what ``findings.json``, the report and the dashboard read.

A :class:`Finding` is one verdict (a spike, a non-finite step, a level shift, ...) with the numbers behind it and
sentences a user can check against the loss curve. :class:`Findings` holds them together with the sections other
stages own (``oscillation``, ``plan``, ...) and writes the JSON of docs/findings-json.md.

JSON layout (``version`` = :data:`FINDINGS_VERSION`)::

    {"version": 1,
     "spikes":    [{"kind": "spike", "step": 254, "end_step": 254, "peak_step": 254, "metric": "train/loss",
                    "value": 4.8, "baseline": 0.91, "score": 41.2, "severity": "critical",
                    "bucket": 5, "bucket_range": "(3296, 8192]", "cluster": 3, "cluster_name": "code", "epoch": 0,
                    "suspect_samples": [812, 813], "evidence": ["..."], "next_step": "...", "details": {...}}],
     "nonfinite": [{"kind": "nonfinite", "step": 900, "metric": "train/loss", "value": null, "value_text": "nan",
                    ...}],
     "level_shifts": [...], "expected_for_bucket": [...],
     "oscillation": {"detected": false, "bucket_variance_share": 0.42, ...},
     "plan": null,
     "warnings": []}

A finding's ``tags`` (where the step sits: ``bucket``, ``bucket_range``, ``cluster``, ``cluster_name``, ``epoch``,
...) are written as flat keys beside the fixed ones, as the Contracts ask; ``details`` (the detector's own numbers:
``recovery_step``, ``n_steps``, ``ratio``, ``noise_scale``, ...) stays one nested object.

**Non-finite numbers.** JSON has no NaN or infinity (``json.dumps(..., allow_nan=False)`` must work). A non-finite
float under key ``k`` of an object is written as ``"k": null`` plus ``"k_text": "nan"`` (or ``"inf"``, ``"-inf"``);
reading restores the float. Inside a list a non-finite float becomes ``null`` (lists have no place for the text).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from forensics.errors import ForensicsError

#: Bumped whenever a key changes meaning or disappears; readers refuse files newer than they know.
FINDINGS_VERSION = 2

#: Severities, least to most urgent.
INFO, WARNING, CRITICAL = "info", "warning", "critical"
SEVERITIES = (INFO, WARNING, CRITICAL)

#: Lists that are always present in the JSON, even when empty (docs/findings-json.md Contracts).
REQUIRED_LISTS = ("spikes", "nonfinite")

_TEXT_SUFFIX = "_text"


@dataclass
class Finding:
    """One verdict with its numbers.

    - ``kind``: ``spike``, ``level_shift``, ``nonfinite``, ``expected_for_bucket``, ``jumpiness``, ... (other stages
      add their own).
    - ``step``: where it starts (an event's first step); ``end_step`` its last step; ``peak_step`` its highest step.
    - ``metric``, ``value`` (the value at the peak; for ``nonfinite`` the NaN/inf itself), ``baseline`` (what the
      value was judged against), ``score`` (robust z: value minus baseline over the local noise scale).
    - ``severity``: one of :data:`SEVERITIES`.
    - ``tags``: where the step sits (bucket, bucket_range, cluster, cluster_name, epoch, ...), flat in the JSON.
    - ``evidence``: sentences with the numbers behind the verdict, checkable against the curve.
    - ``suspect_samples``: sample ids, most suspect first (empty without a plan).
    - ``next_step``: what to do next, in words.
    - ``details``: the detector's own numbers (nested in the JSON).
    """

    kind: str
    step: int
    metric: str | None = None
    end_step: int | None = None
    peak_step: int | None = None
    value: float | None = None
    baseline: float | None = None
    score: float | None = None
    severity: str = INFO
    tags: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    suspect_samples: list[int] = field(default_factory=list)
    next_step: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    confidence: float | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}; got {self.severity!r}")
        clash = set(self.tags) & _FIXED_KEYS
        if clash:
            raise ValueError(f"tag names {sorted(clash)} clash with the fixed keys of a finding")

    def to_dict(self) -> dict[str, Any]:
        """The flat, JSON-safe dict written to ``findings.json`` (see the module docstring)."""
        out: dict[str, Any] = {}
        for key in ("kind", "step", "end_step", "peak_step", "metric", "value", "baseline", "score", "severity"):
            _put(out, key, getattr(self, key))
        _put(out, "confidence", self.confidence_value())
        for key, value in self.tags.items():
            _put(out, key, value)
        out["suspect_samples"] = [int(s) for s in self.suspect_samples]
        out["evidence"] = [str(s) for s in self.evidence]
        out["next_step"] = self.next_step
        out["details"] = json_safe(self.details)
        return out

    def confidence_value(self) -> float:
        """How sure the finding is, 0-1: the rule's own figure when it gave one; for a scored event
        ``score / (score + 6)`` (0.5 at the spike rule's default threshold, towards 1 as the score grows); a
        non-finite value is certain."""
        if self.confidence is not None:
            return float(self.confidence)
        if isinstance(self.details.get("confidence"), (int, float)):
            return float(self.details["confidence"])
        if self.kind == "nonfinite":
            return 1.0
        if self.score is not None and math.isfinite(self.score) and self.score > 0:
            return float(self.score / (self.score + 6.0))
        return 0.5

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Finding:
        """Read back what :meth:`to_dict` wrote (unknown flat keys become tags)."""
        data = restore_nonfinite(dict(data))
        kwargs: dict[str, Any] = {}
        tags: dict[str, Any] = {}
        for key, value in data.items():
            if key in _FIELD_NAMES and key != "tags":
                kwargs[key] = value
            else:
                tags[key] = value
        if "kind" not in kwargs or "step" not in kwargs:
            raise ForensicsError(f"findings: an item lacks 'kind' or 'step': {dict(list(data.items())[:4])}")
        kwargs["tags"] = tags
        kwargs.setdefault("evidence", [])
        kwargs.setdefault("suspect_samples", [])
        kwargs["details"] = kwargs.get("details") or {}
        return cls(**kwargs)


_FIELD_NAMES = {f.name for f in fields(Finding)}
#: Keys a tag may not use: the fixed keys and their ``_text`` companions.
_FIXED_KEYS = (_FIELD_NAMES - {"tags"}) | {k + _TEXT_SUFFIX for k in _FIELD_NAMES}


@dataclass
class Findings:
    """All findings of one run plus the sections other stages own (``oscillation``, ``plan``, ``run``, ...).

    ``to_dict`` always writes ``version``, ``spikes``, ``nonfinite``, ``oscillation`` (default
    ``{"detected": false, "bucket_variance_share": null}``), ``plan`` (default null) and ``warnings``.
    """

    items: list[Finding] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    version: int = FINDINGS_VERSION
    #: Logged step minus canonical step (HF's global_step: 1); each finding then carries its ``logged_step``.
    logged_offset: int | None = None

    def extend(self, findings: Iterable[Finding]) -> Findings:
        self.items.extend(findings)
        return self

    def of_kind(self, kind: str) -> list[Finding]:
        """The findings of one kind, in step order."""
        return sorted((f for f in self.items if f.kind == kind), key=_order)

    @property
    def spikes(self) -> list[Finding]:
        return self.of_kind("spike")

    @property
    def nonfinite(self) -> list[Finding]:
        return self.of_kind("nonfinite")

    def to_dict(self) -> dict[str, Any]:
        from forensics.detect.kinds import kind_of

        out: dict[str, Any] = {"version": self.version}
        for key in REQUIRED_LISTS:
            out[key] = []
        every = []
        for f in sorted(self.items, key=_order):
            d = f.to_dict()
            if self.logged_offset is not None and isinstance(d.get("step"), int):
                d["logged_step"] = d["step"] + int(self.logged_offset)
            every.append(d)
            kind = kind_of(f.kind)
            if kind.section and not kind.object_section:
                out.setdefault(kind.section, []).append(d)
        out["oscillation"] = {"detected": False, "bucket_variance_share": None}
        out["plan"] = None
        for key, value in self.sections.items():
            out[key] = json_safe(value)
        out["findings"] = sorted(every, key=_rank)
        out["warnings"] = [str(w) for w in self.warnings]
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON (no NaN/inf tokens: ``allow_nan=False``)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Findings:
        version = data.get("version")
        if not isinstance(version, int) or version > FINDINGS_VERSION:
            raise ForensicsError(
                f"findings: version {version!r} is not one this tool reads (it knows up to {FINDINGS_VERSION})"
            )
        items: list[Finding] = []
        sections: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("version", "warnings", "findings"):
                continue
            if (
                isinstance(value, list)
                and value
                and all(isinstance(v, dict) and "kind" in v and "step" in v for v in value)
            ):
                items.extend(Finding.from_dict(v) for v in value)
            elif key in REQUIRED_LISTS or (isinstance(value, list) and value == []):
                continue
            else:
                sections[key] = restore_nonfinite(value)
        from forensics.detect.kinds import kind_of

        for value in data.get("findings") or []:  # kinds filed in no list of their own
            kind = kind_of(str(value.get("kind"))) if isinstance(value, dict) else None
            if kind is not None and (kind.section is None or kind.object_section):
                items.append(Finding.from_dict(value))
        return cls(items=items, sections=sections, warnings=list(data.get("warnings", [])), version=version)

    @classmethod
    def from_json(cls, text: str) -> Findings:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ForensicsError(f"findings: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        if not isinstance(data, dict):
            raise ForensicsError("findings: expected a JSON object at the top level")
        return cls.from_dict(data)

    @classmethod
    def read(cls, path: str | Path) -> Findings:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ForensicsError(f"findings file {path} could not be read: {exc.strerror or exc}") from exc
        return cls.from_json(text)


def _order(f: Finding) -> tuple:
    return (f.step, f.metric or "", f.kind)


#: Confidences equal to this many decimals rank as one: two critical spikes at 0.9995 and 0.9996 carry the same
#: evidence, and a third decimal would order them by float noise (a changed baseline elsewhere in the run).
CONFIDENCE_DECIMALS = 2


def urgency(severity: str, confidence: float | None, steps: Sequence[int] | None) -> tuple:
    """The sort key that ranks causes and findings, most urgent first (docs/concepts.md, ``severity``): severity,
    then confidence to :data:`CONFIDENCE_DECIMALS` decimals, then those with steps, the earliest first."""
    return (
        -SEVERITIES.index(severity),
        -round(float(confidence or 0.0), CONFIDENCE_DECIMALS),
        not steps,
        list(steps or [])[:1],
    )


def _rank(d: Mapping[str, Any]) -> tuple:
    return urgency(d.get("severity", INFO), d.get("confidence"), [d.get("step") or 0])


# --- JSON safety ---------------------------------------------------------------------------------------------------
def _nonfinite_text(x: float) -> str:
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _put(out: dict[str, Any], key: str, value: Any) -> None:
    """Set ``out[key]``; a non-finite float becomes null plus ``key_text``."""
    value = _plain(value)
    if isinstance(value, float) and not math.isfinite(value):
        out[key] = None
        out[key + _TEXT_SUFFIX] = _nonfinite_text(value)
    else:
        out[key] = json_safe(value)


def _plain(value: Any) -> Any:
    """numpy scalars and arrays to Python values."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


def json_safe(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps(allow_nan=False)`` accepts (rules in the module docstring)."""
    value = _plain(value)
    if isinstance(value, Finding):
        return value.to_dict()
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            _put(out, str(k), v)
        return out
    if isinstance(value, (list, tuple, set)):
        items = sorted(value) if isinstance(value, set) else value
        return [None if isinstance(v, float) and not math.isfinite(v) else json_safe(v) for v in map(_plain, items)]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


_TEXT_VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def restore_nonfinite(value: Any) -> Any:
    """Undo :func:`json_safe` for objects: ``{"k": null, "k_text": "inf"}`` -> ``{"k": inf}``."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k.endswith(_TEXT_SUFFIX) and k[: -len(_TEXT_SUFFIX)] in value and v in _TEXT_VALUES:
                continue
            text = value.get(k + _TEXT_SUFFIX)
            if v is None and text in _TEXT_VALUES:
                out[k] = _TEXT_VALUES[text]
            else:
                out[k] = restore_nonfinite(v)
        return out
    if isinstance(value, list):
        return [restore_nonfinite(v) for v in value]
    return value


#: A spike as a finding, or as a findings.json / labels.json dict.
SpikeLike = Finding | Mapping[str, Any]


def spike_span(spike: SpikeLike) -> tuple[int, int, int]:
    """``(start, end, peak)`` of a spike finding or of a ``{"step", "end_step", "peak_step"}`` dict (labels.json)."""
    if isinstance(spike, Finding):
        start, end, peak = spike.step, spike.end_step, spike.peak_step
    else:
        if "step" not in spike:
            raise ForensicsError(f"spike: an item lacks 'step': {dict(list(spike.items())[:4])}")
        start, end, peak = spike["step"], spike.get("end_step"), spike.get("peak_step")
    start = int(start)
    end = int(end) if end is not None else start
    peak = int(peak) if peak is not None else start
    return start, end, peak
