"""``forensics watch``: the dashboard's live loop without the dashboard, telling each new cause once to the sinks.

:class:`Watch` opens the run with :class:`forensics.live.LiveRun` (the same loop the dashboard runs), refreshes it
every ``interval_s``, and for each cause key it has not told yet (the audit's grouping decides what one cause is:
the same cause growing with more steps keeps its key and is not told again) at ``min_severity`` or above (a cause
first seen below it is told when it reaches it) prints one line and queues one alert body
(:func:`forensics.live.alerts.alert_body`) to every sink (:class:`forensics.live.alerts.Delivery`: a sink that is
down is retried in the background; the tail never waits).

A source whose steps go back (the writer restarted from a checkpoint) and a crash line in the run's logs are causes
of the live loop like any other (``restart``, ``crash``: the audit's rules on the run the audit assembles), told
once; the watch derives no finding of its own. Exit rules: 1 on the first cause at or above ``exit_on``; 0 when
the source has not grown for ``until_idle_s`` seconds; 0 on SIGTERM / SIGINT, after pending alerts were given
``grace_s`` seconds to go out.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.detect.findings import SEVERITIES, WARNING
from forensics.errors import ForensicsError
from forensics.live.alerts import Backoff, Delivery, Sink, alert_body, at_least
from forensics.live.run import LiveRun
from forensics.live.target import Target

#: Exit codes: the source went idle (or SIGTERM), and a cause at ``exit_on`` severity was found.
EXIT_CLEAN, EXIT_FOUND = 0, 1


@dataclass
class WatchOptions:
    """What ``forensics watch`` was asked (defaults as the command's)."""

    interval_s: float = 10.0
    min_severity: str = WARNING
    quiet_period_s: float = 300.0
    exit_on: str | None = None
    until_idle_s: float | None = None
    dashboard_url: str | None = None
    backoff: Backoff = field(default_factory=Backoff)
    grace_s: float = 30.0
    #: Causes the run already had when the watch opened it: also alerted (else only printed as known).
    alert_existing: bool = False

    def __post_init__(self) -> None:
        for name in ("min_severity", "exit_on"):
            value = getattr(self, name)
            if value is not None and value not in SEVERITIES:
                raise ForensicsError(
                    f"watch: --{name.replace('_', '-')} {value!r}: expected one of {', '.join(SEVERITIES)}"
                )
        for name in ("interval_s", "quiet_period_s", "until_idle_s", "grace_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ForensicsError(f"watch: {name} must be a number of seconds >= 0; got {value!r}")
        if self.interval_s <= 0:
            raise ForensicsError(f"watch: --interval must be more than 0 seconds; got {self.interval_s!r}")


class Watch:
    """One watched run and its sinks; :meth:`run` is the loop (returns the exit code).

    ``out`` receives the one line per cause (stdout in the command), ``warn`` the messages (stderr).
    """

    def __init__(
        self,
        target: Target,
        sinks: list[Sink],
        options: WatchOptions | None = None,
        out: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.options = options or WatchOptions()
        self.out = out or (lambda line: print(line, flush=True))
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.clock = clock
        self.sinks = sinks
        self.told: set[str] = set()
        self.sent: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.stop_reason: str | None = None
        self.live: LiveRun | None = None
        self._delivery: Delivery | None = None
        self._failing: str | None = None

    # --- the loop -------------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Open the run, then refresh every interval until an exit rule says stop."""
        opt = self.options
        self._delivery = Delivery(self.sinks, opt.quiet_period_s, opt.backoff, warn=self.warn)
        restore = self._on_signals()
        try:
            return self._loop()
        finally:
            for sig, old in restore.items():
                signal.signal(sig, old)
            left = self._delivery.close(opt.grace_s)
            if left:
                self.warn(f"forensics watch: {left} alert(s) not delivered")

    def _loop(self) -> int:
        opt = self.options
        live = self.live = LiveRun(self.target).start()
        last_rows, grown_at = len(live.metrics), self.clock()
        known = live.causes if live.started else []
        self.out(
            f"watching {self.target.label}: {len(live.metrics)} rows"
            + (f", steps {live.metrics['step'].iloc[0]}-{live.last_step}" if len(live.metrics) else "")
            + f", {len(known)} causes so far; every {opt.interval_s:g}s"
        )
        for c in known:
            self._tell(c, existing=not opt.alert_existing)
        if (code := self._exit_code()) is not None:
            return code
        while not self.stop.wait(opt.interval_s):
            if not self._refresh(live):
                continue
            if len(live.metrics) != last_rows:
                last_rows, grown_at = len(live.metrics), self.clock()
            # every current cause, not only the new keys: a cause first seen below --min-severity is told when its
            # evidence makes it reach it (a batch coming back turns a warning critical)
            for c in sorted(live.causes, key=lambda c: (c.get("steps") or [-1])[0]):
                self._tell(c)
            if (code := self._exit_code()) is not None:
                return code
            if opt.until_idle_s is not None and self.clock() - grown_at >= opt.until_idle_s:
                self.out(f"idle: no new rows for {opt.until_idle_s:g}s; {len(self.told)} causes told")
                return EXIT_CLEAN
        self.out(f"stopped ({self.stop_reason or 'asked to'}); {len(self.told)} causes told")
        return EXIT_CLEAN

    def _refresh(self, live: LiveRun) -> bool:
        """One poll; a source that is gone for a while (a writer restarting replaces its log) is one message, and
        the watch keeps polling until it is back (or ``until_idle_s`` ends the watch)."""
        try:
            live.refresh()
        except (ForensicsError, OSError) as exc:
            text = str(exc)
            if text != self._failing:
                self.warn(f"forensics watch: {text}; polling on")
                self._failing = text
            return False
        if self._failing is not None:
            self.warn("forensics watch: the source is readable again")
            self._failing = None
        return True

    def _exit_code(self) -> int | None:
        exit_on = self.options.exit_on
        if exit_on is None:
            return None
        hit = next((b for b in self.sent if at_least(b["severity"], exit_on)), None)
        if hit is None:
            return None
        self.out(f"exit: {hit['severity']} cause {hit['key']} (--exit-on {exit_on})")
        return EXIT_FOUND

    def _tell(self, cause: dict[str, Any], existing: bool = False) -> None:
        """One line and one alert per key, at ``min_severity`` or above (``existing``: printed, not sent)."""
        key = str(cause.get("key"))
        severity = str(cause.get("severity") or "info")
        if key in self.told or not at_least(severity, self.options.min_severity):
            return
        self.told.add(key)
        body = alert_body(cause, self.target.label, self.options.dashboard_url, self._evidence(cause))
        self.sent.append(body)
        self.out(("known " if existing else "") + body["text"])
        if not existing:
            assert self._delivery is not None
            self._delivery.submit(body)

    def _evidence(self, cause: dict[str, Any]) -> list[str]:
        """The evidence of the findings the cause covers (its steps and metrics), in the order they were found."""
        live = self.live
        if live is None:
            return []
        steps, metrics = set(cause.get("steps") or []), set(cause.get("metrics") or [])
        kind = cause.get("kind")
        found = [n.finding for n in live.new_findings] + list(live.findings.get("findings") or [])
        lines: list[str] = []
        for f in found:
            if not isinstance(f, dict):
                continue
            same_step = f.get("step") in steps and (not metrics or f.get("metric") in metrics)
            if same_step or (f.get("kind") == kind and not steps):
                lines += [str(e) for e in f.get("evidence") or [] if str(e) not in lines]
        return lines or [str(cause.get("summary") or "")]

    # --- signals --------------------------------------------------------------------------------------------------
    def _on_signals(self) -> dict[int, Any]:
        """SIGTERM and SIGINT stop the loop (then pending alerts are flushed); only the main thread can set them."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, frame: Any) -> None:
            self.stop_reason = signal.Signals(signum).name
            self.stop.set()

        old = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, handler)
        return old


def not_yet_written(targets: list[str]) -> list[str]:
    """Local sources a run has not created yet: missing, in a folder that exists (a watch started with the job
    waits for them; a path in no folder at all is a typo, left to the target check's one-line error)."""
    from forensics.live.target import REMOTE_PREFIXES

    return [
        t
        for t in targets
        if not t.startswith(REMOTE_PREFIXES)
        and not Path(t).exists()
        and Path(t).parent.is_dir()
        and Path(t).parent != Path(t)
    ]


def wait_for(
    paths: list[str],
    interval_s: float,
    until_s: float | None,
    warn: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Poll until every path exists (True), or ``until_s`` seconds pass first (False); says once that it waits."""
    if not paths:
        return True
    warn(f"forensics watch: waiting for {', '.join(paths)} to appear (polling every {interval_s:g}s)")
    start = clock()
    while any(not Path(p).exists() for p in paths):
        if until_s is not None and clock() - start >= until_s:
            return False
        sleep(interval_s)
    return True
