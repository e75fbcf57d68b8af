"""A local stand-in for the W&B server: answers the requests the real ``wandb`` 0.31 client sends for a run's history.

It is a real HTTP server on 127.0.0.1 (the client talks from its own ``wandb-core`` subprocess), serves runs held in
memory, logs every request, and stops itself after ``lifetime`` seconds so that a failing test cannot leave it behind.

Requests the client sends (learned by logging them), and the answers given here:
- ``POST /graphql`` ``query Viewer`` / ``GetDefaultEntity``: the account behind the key (``wandb.Api()`` checks it);
- ``POST /graphql`` ``query Run(...) { project { run { ...RunFragment } } }``: the run's attributes (``state``,
  ``config``, ``summaryMetrics``, ``historyKeys`` with ``lastStep``), or ``run: null`` for an unknown run;
- ``POST /graphql`` ``query RunHistoryKeys``: ``historyKeys`` again (``Run.scan_history`` caps the scan at lastStep);
- ``POST /graphql`` ``query RunParquetHistory(liveKeys: ["_step"])``: ``parquetUrls`` of the history export (rows
  below ``export_upto``) and ``liveData``, the ``_step`` of each row past it (the client pages exactly those steps:
  with an empty ``liveData`` it asks for nothing past the export);
- ``GET /export/<run>.parquet`` with ``Range: bytes=a-b`` headers: the export (the client reads it like object storage);
- ``POST /graphql`` ``query HistoryPage(minStep, maxStep, pageSize)``: rows with minStep <= _step < maxStep, each a
  JSON text (NaN and Infinity written as JavaScript literals, as they pass through the client unparsed);
- ``POST /graphql`` ``mutation NotifyScriptableRunAlert``: a run alert (``wandb.alert``'s request), answered
  ``success``;
- ``POST /sdk/otel/v1/metrics``: the client's telemetry, accepted and ignored.

With ``api_key`` set, a request carrying another key gets 401 ``user is not logged in``, as W&B answers.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

VIEWER = {
    "id": "VXNlcjox",
    "entity": "forensics",
    "username": "forensics",
    "email": "forensics@example.invalid",
    "flags": "{}",
    "teams": {"edges": []},
}


@dataclass
class FakeRun:
    """One run's history rows (dicts with ``_step``), config and summary; ``export_upto`` steps go to parquet."""

    rows: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    export_upto: int = 0
    state: str = "running"

    @property
    def last_step(self) -> int:
        return max((r["_step"] for r in self.rows), default=-1)

    def attrs(self, name: str) -> dict[str, Any]:
        return {
            "id": "UnVuOjE=",
            "projectId": "1",
            "tags": [],
            "name": name,
            "displayName": f"{name}-display",
            "sweepName": None,
            "state": self.state,
            "group": None,
            "jobType": None,
            "commit": None,
            "readOnly": False,
            "createdAt": "2025-01-01T00:00:00",
            "heartbeatAt": "2025-01-01T00:00:00",
            "description": None,
            "notes": None,
            "systemMetrics": "{}",
            "config": json.dumps({k: {"value": v, "desc": None} for k, v in self.config.items()}),
            "summaryMetrics": json.dumps(self.summary),
            "historyLineCount": len(self.rows),
            "user": {"name": "forensics", "username": "forensics"},
            "historyKeys": self.history_keys(),
        }

    def history_keys(self) -> dict[str, Any]:
        keys = sorted({k for r in self.rows for k in r})
        return {
            "lastStep": self.last_step,
            "keys": {k: {"typeCounts": [{"type": "number", "count": len(self.rows)}]} for k in keys},
        }

    def export_parquet(self) -> bytes:
        """The export as W&B writes it: one column per key, null where a row lacks the key, NaN kept as NaN."""
        exported = [r for r in self.rows if r["_step"] < self.export_upto]
        keys = sorted({k for r in exported for k in r})
        table = pa.table({k: pa.array([r.get(k) for r in exported]) for k in keys})
        buf = io.BytesIO()
        pq.write_table(table, buf)
        return buf.getvalue()


class FakeWandbServer:
    """``with FakeWandbServer({"ent/proj/id": FakeRun(...)}) as server:`` then point ``WANDB_BASE_URL`` at
    ``server.url``. ``server.queries`` lists (operation, variables) of every GraphQL request in arrival order."""

    def __init__(self, runs: dict[str, FakeRun], lifetime: float = 60.0, api_key: str | None = None) -> None:
        self.runs = runs
        self.api_key = api_key  # when set, any other key is refused with 401 as W&B does
        self.queries: list[tuple[str, dict[str, Any]]] = []
        self.other_requests: list[str] = []
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> FakeWandbServer:
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeWandbServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def operations(self) -> list[str]:
        with self.lock:
            return [op for op, _ in self.queries]

    # --- answers ------------------------------------------------------------------------------------------------
    def _run(self, variables: dict[str, Any]) -> tuple[str, FakeRun | None]:
        name = variables.get("name") or variables.get("runName") or variables.get("run")
        path = f"{variables.get('entity')}/{variables.get('project')}/{name}"
        return name, self.runs.get(path)

    def answer_graphql(self, query: str, variables: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(operation name, JSON answer) for one GraphQL request."""
        if re.search(r"query (Viewer|GetDefaultEntity)\b", query):
            return "Viewer", {"data": {"viewer": VIEWER}}
        if "NotifyScriptableRunAlert" in query:  # what wandb.alert sends; recorded in ``queries``
            return "NotifyScriptableRunAlert", {"data": {"notifyScriptableRunAlert": {"success": True}}}
        name, run = self._run(variables)
        if "RunHistoryKeys" in query:
            return "RunHistoryKeys", {"data": {"project": {"run": run and {"historyKeys": run.history_keys()}}}}
        if "query Run(" in query:
            return "Run", {"data": {"project": {"run": run and run.attrs(name)}}}
        if "RunParquetHistory" in query:
            urls = [f"{self.url}/export/{name}.parquet"] if run and run.export_upto > 0 else []
            live_keys = variables.get("liveKeys") or ["_step"]
            live = [
                {k: r[k] for k in live_keys if k in r}
                for r in (run.rows if run else [])
                if r["_step"] >= run.export_upto
            ]
            return "RunParquetHistory", {
                "data": {"project": {"run": run and {"parquetHistory": {"parquetUrls": urls, "liveData": live}}}}
            }
        if "HistoryPage" in query and "SampledHistoryPage" not in query:
            lo, hi = variables["minStep"], variables["maxStep"]
            rows = [json.dumps(r) for r in (run.rows if run else []) if lo <= r["_step"] < hi]
            return "HistoryPage", {"data": {"project": {"run": run and {"history": rows}}}}
        return "unknown", {"errors": [{"message": "query not served by the test server"}]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.startswith("/graphql"):
                    with server.lock:
                        server.other_requests.append(f"POST {self.path}")
                    self._send(200, b"{}")
                    return
                if server.api_key is not None and not self._key_ok():
                    self._send(401, json.dumps({"errors": [{"message": "user is not logged in"}]}).encode())
                    return
                request = json.loads(body)
                variables = request.get("variables") or {}
                op, answer = server.answer_graphql(request.get("query", ""), variables)
                with server.lock:
                    server.queries.append((op, variables))
                self._send(200, json.dumps(answer).encode())

            def _key_ok(self) -> bool:
                auth = self.headers.get("Authorization", "")
                try:
                    user_key = base64.b64decode(auth.removeprefix("Basic ")).decode()
                except ValueError:
                    return False
                return user_key == f"api:{server.api_key}"

            def do_GET(self) -> None:  # noqa: N802
                with server.lock:
                    server.other_requests.append(f"GET {self.path} {self.headers.get('Range', '')}".strip())
                name = self.path.rsplit("/", 1)[-1].removesuffix(".parquet")
                run = next((r for p, r in server.runs.items() if p.endswith(f"/{name}")), None)
                if not self.path.startswith("/export/") or run is None:
                    self._send(404, b"")
                    return
                data = run.export_parquet()
                rng = self.headers.get("Range")
                if not rng:
                    self._send(200, data, {"Content-Type": "application/octet-stream"})
                    return
                first, _, last = rng.split("=", 1)[1].partition("-")
                a = int(first)
                z = min(int(last) if last else len(data) - 1, len(data) - 1)
                self._send(
                    206,
                    data[a : z + 1],
                    {"Content-Type": "application/octet-stream", "Content-Range": f"bytes {a}-{z}/{len(data)}"},
                )

        return Handler
