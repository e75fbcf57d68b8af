"""Crash lines: a run that died says why in the last lines of its logs (docs/reference/findings.md, ``crash``).

One finding per crash kind per file (``details``: ``line``, ``what``, ``path``, ``line_no``); its step is the last
step the file logged before the line (metrics step: logged minus the run's offset), else the run's last step.
Severity comes from :mod:`forensics.detect.causes.severity` (``crash`` is critical by default).
"""

from __future__ import annotations

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.schema import STEP
from forensics.sources.crash_logs import crash_lines

_NEXT = {
    "oom": "Lower the micro-batch size or sequence length, or enable activation checkpointing, then resume.",
    "nccl": "Find the rank that stalled (its own log), check the interconnect, and resume from the last checkpoint.",
    "ecc": "The GPU reported an uncorrectable memory error: drain that node and resume elsewhere.",
    "nonfinite": "Look at the steps before the assertion for NaN/inf in the loss or grad norm.",
    "killed": "The process was killed (OOM killer or scheduler): check host memory and the job's limits.",
    "traceback": "Read the traceback's exception line and fix the error, then resume from the last checkpoint.",
}


class CrashRule(Rule):
    """Reads the crash lines of the run's text logs (``run.log_files``)."""

    name = "crash"
    live_kinds = ("crash",)

    def __init__(self) -> None:
        pass

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        last = int(run.metrics[STEP].max()) if len(run.metrics) else 0
        out = []
        for path in run.log_files:
            for c in crash_lines(path):
                step = last if c.logged_step is None else c.logged_step - run.logged_offset
                out.append(
                    Finding(
                        kind="crash",
                        step=step,
                        confidence=0.9,
                        details={"line": c.line, "what": c.what, "path": c.path, "line_no": c.line_no, "support": {}},
                        evidence=[f"{c.path}: '{c.line}' ({c.what}) after step {step}"],
                        next_step=_NEXT[c.what],
                    )
                )
        return out
