"""Alerts about a live run's causes: the body every sink receives, the sinks, and their delivery.

- :func:`alert_body`: one cause as ``{cause, key, severity, steps, logged_steps, summary, evidence, run, dashboard,
  text}`` (``cause`` is the cause's kind, ``text`` the one line Slack-compatible webhooks show);
- :func:`parse_sink`: the ``--alert`` specs ``terminal``, ``webhook=URL``, ``wandb``, ``cmd=CMD``;
- :class:`Delivery`: one worker thread and queue per sink, so that a sink that is down (a webhook refusing
  connections, a command failing) is retried with exponential backoff without ever blocking the tail or the other
  sinks; alerts are kept in order until delivered, and :meth:`Delivery.close` gives pending ones a grace period.

The quiet period is read as a per-sink rate limit that loses nothing: after a sink delivered an alert, the
warnings and infos that come within ``quiet_period_s`` are held and delivered together when it ends; a critical
alert is never held (the person or scheduler behind the sink needs it now). Each key is alerted once at all
(:class:`forensics.live.watch.Watch` de-duplicates), so the quiet period never repeats a cause.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from forensics.detect.findings import CRITICAL, SEVERITIES
from forensics.errors import ForensicsError

#: Seconds one webhook POST or W&B request may take, and one ``cmd=`` command may run, before it counts as failed.
SEND_TIMEOUT_S, COMMAND_TIMEOUT_S = 10.0, 60.0
#: Evidence sentences a body carries (the first ones: the detector's numbers come first).
EVIDENCE_LINES = 6
SINK_KINDS = ("terminal", "webhook=URL", "wandb", "cmd=CMD")


def alert_body(
    cause: dict[str, Any], run: str, dashboard: str | None = None, evidence: list[str] | None = None
) -> dict[str, Any]:
    """The JSON every sink receives for one cause; the same cause gives the same body whatever the sink."""
    steps = [int(s) for s in cause.get("steps") or []]
    logged = [int(s) for s in cause.get("logged_steps") or steps]
    severity = str(cause.get("severity") or "info")
    summary = str(cause.get("summary") or "")
    where = f" at step {_span(logged)}" if logged else ""
    text = (
        f"[{severity}] {cause.get('kind')}{where}: {slack_escape(summary)} (run {slack_escape(run)}; key "
        f"{cause.get('key')})"
    )
    if dashboard:
        text += f" <{dashboard}|dashboard>"
    return {
        "cause": str(cause.get("kind")),
        "key": str(cause.get("key")),
        "severity": severity,
        "steps": steps,
        "logged_steps": logged,
        "summary": summary,
        "evidence": list(evidence or [])[:EVIDENCE_LINES],
        "run": run,
        "dashboard": dashboard,
        "text": text,
    }


def slack_escape(text: str) -> str:
    """Text for a Slack-compatible ``text`` field: its control characters ``&``, ``<`` and ``>`` escaped, so that a
    cluster name or sample text quoted in a summary is shown, not read as a link or a mention."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _span(steps: list[int]) -> str:
    return str(steps[0]) if len(steps) == 1 or steps[0] == steps[-1] else f"{steps[0]}-{steps[-1]}"


def at_least(severity: str, threshold: str) -> bool:
    """Whether ``severity`` is ``threshold`` or more urgent (in the order of :data:`SEVERITIES`)."""
    return SEVERITIES.index(severity) >= SEVERITIES.index(threshold) if severity in SEVERITIES else False


# --- sinks ---------------------------------------------------------------------------------------------------------
class Sink:
    """Somewhere alerts go. :meth:`send` raises on failure (any exception): the delivery retries the same body."""

    name = "sink"

    def send(self, body: dict[str, Any]) -> None:  # pragma: no cover - every sink overrides it
        raise NotImplementedError


class TerminalSink(Sink):
    """The alert's text and evidence on stderr, for the person at the terminal (stdout keeps one line per cause)."""

    name = "terminal"

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def send(self, body: dict[str, Any]) -> None:
        out = self.stream or sys.stderr
        bell = "\a" if getattr(out, "isatty", lambda: False)() else ""
        out.write(f"{bell}ALERT {body['text']}\n" + "".join(f"  - {e}\n" for e in body["evidence"]))
        out.flush()


class WebhookSink(Sink):
    """A POST of the JSON body (Slack's incoming webhooks read its ``text``); any answer but 2xx is a failure."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = f"webhook={url}"

    def send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.url, data=data, method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=SEND_TIMEOUT_S) as resp:
            if not 200 <= resp.status < 300:
                raise OSError(f"{self.url} answered {resp.status}")


class CommandSink(Sink):
    """A shell command given the JSON body on its stdin; a non-zero exit is a failure (retried)."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.name = f"cmd={command}"

    def send(self, body: dict[str, Any]) -> None:
        done = subprocess.run(
            self.command,
            shell=True,
            input=json.dumps(body) + "\n",
            text=True,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise OSError(f"{self.command!r} exited {done.returncode}: {done.stderr.strip()[-200:]}")


#: The mutation ``wandb.alert`` sends (through wandb-core) for a run: here sent for a run another process writes,
#: straight to the configured server's GraphQL endpoint with the configured key, so that alerting never resumes (and
#: so never disturbs) the training run, and a server that is down is one failure the delivery retries.
WANDB_ALERT = """mutation NotifyScriptableRunAlert($entityName: String!, $projectName: String!, $runName: String!,
  $title: String!, $text: String!, $severity: AlertSeverity = INFO, $waitDuration: Duration) {
  notifyScriptableRunAlert(input: {entityName: $entityName, projectName: $projectName, runName: $runName,
    title: $title, text: $text, severity: $severity, waitDuration: $waitDuration}) { success }
}"""
WANDB_LEVELS = {"info": "INFO", "warning": "WARN", "critical": "ERROR"}


class WandbSink(Sink):
    """A W&B alert on the watched run (W&B shows it on the run page and sends it by e-mail or Slack as the user's
    settings say). Needs a W&B run path source and a key (``WANDB_API_KEY`` or ``wandb login``)."""

    def __init__(self, run_path: str, base_url: str, api_key: str) -> None:
        from forensics.sources.wandb.api_reader import parse_run_path

        self.run_path = parse_run_path(run_path)
        self.base_url, self.api_key = base_url.rstrip("/"), api_key
        self.name = f"wandb ({self.run_path})"

    def send(self, body: dict[str, Any]) -> None:
        rp = self.run_path
        variables = {
            "entityName": rp.entity,
            "projectName": rp.project,
            "runName": rp.run_id,
            "title": f"{body['severity']}: {body['cause']} at step {_span(body['logged_steps'] or [0])}",
            "text": body["text"] + "".join(f"\n- {e}" for e in body["evidence"]),
            "severity": WANDB_LEVELS.get(body["severity"], "INFO"),
        }
        auth = base64.b64encode(f"api:{self.api_key}".encode()).decode()
        req = urllib.request.Request(
            f"{self.base_url}/graphql",
            method="POST",
            data=json.dumps({"query": WANDB_ALERT, "variables": variables}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Basic {auth}"},
        )
        with urllib.request.urlopen(req, timeout=SEND_TIMEOUT_S) as resp:
            answer = json.loads(resp.read() or b"{}")
        if answer.get("errors") or not (answer.get("data") or {}).get("notifyScriptableRunAlert"):
            raise OSError(f"W&B refused the alert: {json.dumps(answer.get('errors') or answer)[:200]}")


def wandb_server() -> tuple[str, str | None]:
    """The W&B server the client is configured for (``WANDB_BASE_URL`` or ``wandb login --host``) and its key, never
    prompting; the key is None when there is none."""
    from wandb import env
    from wandb.sdk import wandb_setup

    base = env.get_base_url(wandb_setup.singleton().settings.base_url).rstrip("/")
    try:
        from wandb.sdk.lib.wbauth import authenticate

        auth = authenticate.authenticate_session(host=base, source="forensics", prompt=False, update_session=False)
    except ImportError:  # pragma: no cover - a wandb other than the pinned one
        return base, os.environ.get("WANDB_API_KEY")
    except Exception:  # noqa: BLE001 - a broken W&B configuration reads as no key: the caller says so in one line
        return base, None
    return base, getattr(auth, "api_key", None) if auth is not None else None


def parse_sink(spec: str, wandb_sources: list[str], warn: Callable[[str], None]) -> Sink | None:
    """One ``--alert`` spec as a sink; bad specs are bad input. ``wandb`` without a W&B run path source or a key is
    one message (``warn``) and no sink: the other sinks still alert."""
    spec = str(spec).strip()
    kind, eq, value = spec.partition("=")
    if spec == "terminal":
        return TerminalSink()
    if spec == "wandb":
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            warn(
                "--alert wandb: the wandb package is not installed (pip install 'loss-spike-forensics[wandb]'); "
                "no W&B alerts"
            )
            return None
        if not wandb_sources:
            warn("--alert wandb: the watched source is not a W&B run (entity/project/run_id); no W&B alerts")
            return None
        base, key = wandb_server()
        if not key:
            warn(f"--alert wandb: no W&B API key for {base} (set WANDB_API_KEY or run `wandb login`); no W&B alerts")
            return None
        return WandbSink(wandb_sources[0], base, key)
    if eq and kind == "webhook":
        if not value.startswith(("http://", "https://")) or len(value.split("://", 1)[1]) == 0:
            raise ForensicsError(f"watch: --alert {spec!r}: expected webhook=URL with an http:// or https:// URL")
        return WebhookSink(value)
    if eq and kind == "cmd":
        if not value.strip():
            raise ForensicsError(
                f"watch: --alert {spec!r}: expected cmd=COMMAND (a shell command; the alert's JSON comes on its stdin)"
            )
        return CommandSink(value)
    raise ForensicsError(f"watch: --alert {spec!r} is not a sink; expected one of {', '.join(SINK_KINDS)}")


# --- delivery ------------------------------------------------------------------------------------------------------
@dataclass
class Backoff:
    """Retry delays: ``initial_s``, doubled after each failure up to ``max_s`` (reset after a success)."""

    initial_s: float = 1.0
    max_s: float = 60.0

    def delay(self, failures: int) -> float:
        return min(self.max_s, self.initial_s * (2.0 ** max(0, failures - 1)))


@dataclass
class SinkState:
    """What one sink's worker has: its queue (oldest first), what it delivered, and its failures."""

    sink: Sink
    pending: deque = field(default_factory=deque)
    delivered: list[dict[str, Any]] = field(default_factory=list)
    failures: int = 0
    last_error: str | None = None
    last_sent: float | None = None
    retry_at: float = 0.0


class Delivery:
    """One worker thread per sink; :meth:`submit` only queues (never blocks the tail).

    A worker sends its queue in order; a failure keeps the body at the head of the queue and waits the backoff
    before the same body is tried again, so nothing is lost or reordered while a sink is down. ``warn`` gets one
    line when a sink starts failing and one when it recovers (not one per retry).
    """

    def __init__(
        self,
        sinks: list[Sink],
        quiet_period_s: float = 300.0,
        backoff: Backoff | None = None,
        warn: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.states = [SinkState(s) for s in sinks]
        self.quiet_period_s = float(quiet_period_s)
        self.backoff = backoff or Backoff()
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.clock = clock
        self._cond = threading.Condition()
        self._closing = False
        self._threads = [
            threading.Thread(target=self._work, args=(st,), name=f"alert {st.sink.name}", daemon=True)
            for st in self.states
        ]
        for t in self._threads:
            t.start()

    def submit(self, body: dict[str, Any]) -> None:
        with self._cond:
            for st in self.states:
                st.pending.append(body)
            self._cond.notify_all()

    def pending(self) -> int:
        """Alerts not yet delivered, over every sink (one alert queued for two sinks counts twice)."""
        with self._cond:
            return sum(len(st.pending) for st in self.states)

    def _due(self, st: SinkState, now: float) -> float:
        """Seconds until the head of the queue may go (0: now); the quiet period holds all but critical alerts."""
        retry = max(0.0, st.retry_at - now)
        if self._closing or st.last_sent is None or any(b.get("severity") == CRITICAL for b in st.pending):
            return retry
        return max(retry, st.last_sent + self.quiet_period_s - now)

    def _work(self, st: SinkState) -> None:
        while True:
            with self._cond:
                while True:
                    if not st.pending and self._closing:
                        return
                    wait = self._due(st, self.clock()) if st.pending else None
                    if wait == 0.0:
                        break
                    self._cond.wait(wait)
                batch = list(st.pending)  # everything held in the quiet period goes together
            for body in batch:
                try:
                    st.sink.send(body)
                except Exception as exc:  # noqa: BLE001 - any failure of a sink is retried, never fatal
                    self._failed(st, exc)
                    break
                self._succeeded(st, body)

    def _failed(self, st: SinkState, exc: BaseException) -> None:
        with self._cond:
            st.failures += 1
            st.last_error = " ".join(str(exc).split()) or type(exc).__name__
            st.retry_at = self.clock() + self.backoff.delay(st.failures)
            first = st.failures == 1
        if first:
            self.warn(f"forensics watch: alert to {st.sink.name} failed ({st.last_error}); retrying with backoff")

    def _succeeded(self, st: SinkState, body: dict[str, Any]) -> None:
        with self._cond:
            st.pending.popleft()
            st.delivered.append(body)
            st.last_sent = self.clock()
            recovered = st.failures > 0
            st.failures, st.retry_at = 0, 0.0
            self._cond.notify_all()
        if recovered:
            self.warn(f"forensics watch: alert to {st.sink.name} delivered again after failures")

    def close(self, grace_s: float = 30.0) -> int:
        """Send what is pending (the quiet period no longer holds it; a failing sink keeps retrying) for up to
        ``grace_s`` seconds; returns the number of alerts still undelivered, each told on ``warn``."""
        deadline = self.clock() + grace_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(max(0.0, deadline - self.clock()))
        left = 0
        with self._cond:
            for st in self.states:
                for body in st.pending:
                    left += 1
                    self.warn(
                        f"forensics watch: alert {body['key']} not delivered to {st.sink.name} "
                        f"({st.last_error or 'time ran out'})"
                    )
        return left
