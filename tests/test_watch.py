"""``forensics watch`` on runs that are still writing: a JSONL log appended to and a real W&B offline run logging in
a subprocess, alerts POSTed to a real local webhook server, the command run as users run it (a subprocess).

Each new cause reaches the webhook once, within two polling intervals of the rows that show it; the same cause
growing (a second NaN joins the first NaN's cause) is not alerted again; a rewind is one restart alert, not a storm
of spikes; a webhook that is down for a few seconds loses nothing; SIGTERM flushes what is held; ``--exit-on``
and ``--until-idle`` give exact exit codes; bad input is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from tests.wandb_writers import isolated_env

REPO = Path(__file__).resolve().parents[1]
INTERVAL = 0.5


# --- a webhook that records what it was sent -----------------------------------------------------------------------
class Webhook:
    """A real HTTP server on 127.0.0.1 answering 200 to POSTs and keeping each JSON body with its arrival time."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.received: list[tuple[float, dict]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Webhook:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.received.append((time.time(), body))
                self.send_response(200)
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def keys(self) -> list[str]:
        return [b["key"] for _, b in self.received]

    def wait_for(self, n: int, timeout: float = 10.0) -> None:
        deadline = time.time() + timeout
        while len(self.received) < n and time.time() < deadline:
            time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def webhook():
    hook = Webhook().start()
    yield hook
    hook.stop()


# --- the watched run and the command -------------------------------------------------------------------------------
def loss(step: int, rng: np.random.Generator) -> float:
    """A loss that is learning (so the run raises no plateau), with noise."""
    return 3.0 - step / 400 + 0.02 * float(rng.standard_normal())


def append(path: Path, steps: range, rng: np.random.Generator, spike: dict[int, float] | None = None) -> float:
    """Append ``steps`` (``spike``: step -> value written instead); returns the time the rows were written."""
    spike = spike or {}
    with path.open("a") as fh:
        fh.write("".join(json.dumps({"step": s, "loss": spike.get(s, loss(s, rng))}) + "\n" for s in steps))
    return time.time()


class Watcher:
    """``python -m forensics watch ...`` in a subprocess, its stdout lines collected as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        run_env = dict(env or os.environ)
        run_env["PYTHONPATH"] = str(REPO)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forensics", "watch", *args],
            cwd=REPO,
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.time() + 60
        while not any(line.startswith("watching ") for line in self.lines) and time.time() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()
            time.sleep(0.02)
        assert any(line.startswith("watching ") for line in self.lines)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()

    def alerts(self) -> list[str]:
        return [line for line in self.lines if line.startswith("[")]


@pytest.fixture
def run_log(tmp_path):
    """A JSONL log with 300 clean steps, and the generator that continues it."""
    path = tmp_path / "metrics.jsonl"
    rng = np.random.default_rng(7)
    path.write_text("")
    append(path, range(300), rng)
    return path, rng


def hook_args(hook: Webhook, *extra: str) -> list[str]:
    return ["--interval", str(INTERVAL), "--quiet-period", "0", "--alert", f"webhook={hook.url}", *extra]


# --- a live JSONL run ----------------------------------------------------------------------------------------------
def test_jsonl_each_new_cause_is_alerted_once_within_two_intervals_and_growth_is_not_realerted(run_log, webhook):
    path, rng = run_log
    w = Watcher(str(path), *hook_args(webhook, "--until-idle", "3"))
    t_spike = append(path, range(300, 330), rng, spike={310: 9.0})
    webhook.wait_for(1)
    t_nan = append(path, range(330, 350), rng, spike={335: float("nan")})
    webhook.wait_for(2)
    append(path, range(350, 370), rng, spike={355: float("nan")})  # the NaN cause grows: no new alert
    assert w.wait() == 0
    assert webhook.keys() == ["event:310:-", "nonfinite:335:-"]
    (t1, spike), (t2, nan) = webhook.received
    assert t1 - t_spike < 2 * INTERVAL and t2 - t_nan < 2 * INTERVAL
    assert spike["cause"] == "event" and spike["severity"] == "warning" and spike["steps"] == [310]
    assert set(spike) == {
        "cause",
        "key",
        "severity",
        "steps",
        "logged_steps",
        "summary",
        "evidence",
        "run",
        "dashboard",
        "text",
    }
    assert spike["run"] == str(path) and spike["text"].startswith("[warning] event at step 310")
    assert "9" in spike["evidence"][0] and nan["severity"] == "critical" and nan["steps"] == [335]
    assert len(w.alerts()) == 2


@pytest.mark.parametrize("mode", ["a", "w", "gone"])
def test_a_rewind_is_one_restart_alert_not_a_storm_of_spikes(run_log, webhook, mode):
    """The writer restarts from an earlier checkpoint: steps 260-339 are written again, from a higher loss, appended
    to the log (``a``), in a log the restarted writer began anew (``w``), or after the log was gone for a while."""
    path, rng = run_log
    w = Watcher(str(path), *hook_args(webhook, "--until-idle", "2.5", "--min-severity", "info"))
    append(path, range(300, 340), rng)
    time.sleep(2 * INTERVAL)
    gone = mode == "gone"
    if gone:
        path.unlink()
        time.sleep(3 * INTERVAL)
        mode = "w"
    with path.open(mode) as fh:  # the restarted writer resumes at step 260 with the loss of step 160
        fh.write("".join(json.dumps({"step": s, "loss": loss(s - 100, rng)}) + "\n" for s in range(260, 340)))
    assert w.wait() == 0
    assert webhook.keys() == ["restart:260:-"]
    assert "went back from step 339 to 260" in webhook.received[0][1]["evidence"][0]
    err = w.proc.stderr.read()
    assert (err.count("no longer exists; polling on"), err.count("readable again")) == ((1, 1) if gone else (0, 0))


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_cuda_oom_in_the_slurm_log_is_one_crash_alert(run_log, webhook, when):
    """The job dies of CUDA out-of-memory: its ``slurm-123.out`` beside the log says so, before the watch opens the
    run or while it watches (no row comes with it); the watch tells the audit's ``crash`` cause once, critical."""
    path, rng = run_log
    case = path.parent
    (case / "run.toml").write_text('metrics = ["metrics.jsonl"]\n')
    slurm = case / "slurm-123.out"
    oom = "step 299 loss 2.3\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    if when == "before":
        slurm.write_text(oom)
    extra = ["--until-idle", "2.5"] + (["--alert-existing"] if when == "before" else [])
    w = Watcher(str(case), *hook_args(webhook, *extra))
    if when == "while":
        time.sleep(2 * INTERVAL)
        slurm.write_text(oom)
    assert w.wait() == 0
    assert webhook.keys() == ["crash:299:-"]
    body = webhook.received[0][1]
    assert body["severity"] == "critical" and "CUDA out of memory" in body["evidence"][0]


def test_a_webhook_down_for_seconds_loses_no_alert(run_log):
    """Nothing listens on the port while two causes appear; the server comes up 3 s later: both arrive, once."""
    path, rng = run_log
    hook = Webhook(free_port())
    w = Watcher(str(path), *hook_args(hook, "--backoff", "0.2", "--backoff-max", "0.4"))
    append(path, range(300, 330), rng, spike={310: 9.0})
    time.sleep(2 * INTERVAL)
    append(path, range(330, 350), rng, spike={335: float("nan")})
    time.sleep(3)
    assert hook.received == []
    hook.start()
    try:
        hook.wait_for(2)
        w.proc.send_signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        hook.stop()
    assert hook.keys() == ["event:310:-", "nonfinite:335:-"]
    assert "retrying with backoff" in w.proc.stderr.read()


def test_sigterm_flushes_alerts_the_quiet_period_holds(run_log, webhook):
    """With a 60 s quiet period the second warning is held; SIGTERM sends it before the process exits 0."""
    path, rng = run_log
    w = Watcher(str(path), "--interval", str(INTERVAL), "--quiet-period", "60", "--alert", f"webhook={webhook.url}")
    append(path, range(300, 330), rng, spike={310: 9.0})
    webhook.wait_for(1)
    append(path, range(330, 360), rng, spike={345: 9.0})
    deadline = time.time() + 10
    while len(w.alerts()) < 2 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(INTERVAL)
    assert webhook.keys() == ["event:310:-"]  # held by the quiet period
    w.proc.send_signal(signal.SIGTERM)
    assert w.wait() == 0
    assert webhook.keys() == ["event:310:-", "event:345:-"]
    assert w.lines[-1].startswith("stopped (SIGTERM)")


# --- exit codes and bad input --------------------------------------------------------------------------------------
def test_exit_on_critical_exits_1_on_the_first_critical_cause(run_log, webhook):
    path, rng = run_log
    w = Watcher(str(path), *hook_args(webhook, "--exit-on", "critical", "--until-idle", "10"))
    append(path, range(300, 330), rng, spike={310: 9.0})  # a warning: the watch goes on
    webhook.wait_for(1)
    assert w.proc.poll() is None
    append(path, range(330, 350), rng, spike={335: float("nan")})
    assert w.wait(timeout=10) == 1
    assert webhook.keys() == ["event:310:-", "nonfinite:335:-"]  # the critical alert went out before the exit
    assert w.lines[-1] == "exit: critical cause nonfinite:335:- (--exit-on critical)"


def test_exit_on_critical_exits_0_when_the_source_ends_clean(run_log, webhook):
    path, rng = run_log
    w = Watcher(str(path), *hook_args(webhook, "--exit-on", "critical", "--until-idle", "2", "--alert", "terminal"))
    append(path, range(300, 330), rng, spike={310: 9.0})
    assert w.wait() == 0
    assert webhook.keys() == ["event:310:-"]
    assert w.lines[-1] == "idle: no new rows for 2s; 1 causes told"
    alerts = [line for line in w.proc.stderr.read().splitlines() if line.startswith("ALERT ")]
    assert alerts == [f"ALERT {webhook.received[0][1]['text']}"]  # the terminal sink, on stderr


def test_cmd_sink_gets_the_body_on_stdin(run_log, tmp_path):
    path, rng = run_log
    out = tmp_path / "bodies.jsonl"
    w = Watcher(
        str(path),
        "--interval",
        str(INTERVAL),
        "--quiet-period",
        "0",
        "--until-idle",
        "2",
        "--alert",
        f"cmd={sys.executable} -c \"import sys; open({str(out)!r}, 'a').write(sys.stdin.read())\"",
        "--dashboard-url",
        "http://127.0.0.1:8501",
    )
    append(path, range(300, 330), rng, spike={310: 9.0})
    assert w.wait() == 0
    bodies = [json.loads(line) for line in out.read_text().splitlines()]
    assert [b["key"] for b in bodies] == ["event:310:-"]
    assert bodies[0]["dashboard"] == "http://127.0.0.1:8501"
    assert bodies[0]["text"].endswith("<http://127.0.0.1:8501|dashboard>")


@pytest.mark.parametrize(
    "args, message",
    [
        (["{missing}"], "does not exist"),
        (["{log}", "--alert", "webhook="], "--alert 'webhook='"),
        (["{log}", "--alert", "foo"], "--alert 'foo' is not a sink"),
        (["{log}", "--interval", "soon"], "invalid float value"),
        (["{log}", "--interval", "0"], "--interval must be more than 0"),
        (["{log}", "--exit-on", "fatal"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run_log, tmp_path, args, message):
    path, _ = run_log
    args = [a.format(missing=tmp_path / "no-such-folder" / "nope.jsonl", log=path) for a in args]
    done = subprocess.run(
        [sys.executable, "-m", "forensics", "watch", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr
    assert done.stdout == ""


def test_wandb_alert_without_a_wandb_source_is_one_message_and_the_watch_goes_on(run_log):
    path, _ = run_log
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "watch",
            str(path),
            "--alert",
            "wandb",
            "--interval",
            "0.2",
            "--until-idle",
            "0.5",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0
    assert done.stderr.strip().splitlines() == [
        "forensics watch: --alert wandb: the watched source is not a W&B run (entity/project/run_id); no W&B alerts"
    ]


def test_help_has_an_example():
    done = subprocess.run(
        [sys.executable, "-m", "forensics", "watch", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0
    assert "example:\n  forensics watch " in done.stdout and "--alert webhook=" in done.stdout


# --- a live W&B offline run ----------------------------------------------------------------------------------------
WANDB_WRITER = textwrap.dedent("""
    import json, math, os, sys, time
    import numpy as np
    import wandb

    out = sys.argv[1]
    rng = np.random.default_rng(7)
    run = wandb.init(dir=out, project="p", id="watched1", settings=wandb.Settings(
        console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True, disable_git=True,
        save_code=False, x_save_requirements=False, disable_job_creation=True,
        x_transaction_log_flush_interval=0.05))
    rounds = [(range(0, 300), {}), (range(300, 330), {310: 9.0}), (range(330, 350), {335: float("nan")}),
              (range(350, 370), {355: float("nan")})]
    for r, (steps, spike) in enumerate(rounds):
        for s in steps:
            # no step=: each call commits its row at once (W&B's _step counts the calls: 0, 1, 2, ...)
            run.log({"loss": spike.get(s, 3.0 - s / 400 + 0.02 * float(rng.standard_normal()))})
        # written whole, then renamed: the test reads the time as soon as the name exists
        with open(os.path.join(out, f"logged-{r}.tmp"), "w") as fh:
            fh.write(repr(time.time()))
        os.replace(os.path.join(out, f"logged-{r}.tmp"), os.path.join(out, f"logged-{r}"))
        deadline = time.time() + 300  # the test says when to log the next round (a bound: never hang a failing test)
        while not os.path.exists(os.path.join(out, f"go-{r}")) and time.time() < deadline:
            time.sleep(0.01)
    run.finish()
""")


def test_wandb_offline_run_each_new_cause_is_alerted_once_within_two_intervals(tmp_path, webhook):
    pytest.importorskip("wandb")
    from forensics.sources.wandb.run_reader import WandbRunReader

    script = tmp_path / "writer.py"
    script.write_text(WANDB_WRITER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        env=isolated_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        folder = tmp_path / "wandb"
        deadline = time.time() + 60
        read = 0
        while read < 300 and time.time() < deadline:  # start watching once the first round is on disk
            if any(folder.glob("offline-run-*/run-watched1.wandb")):
                read = len(WandbRunReader(folder).read_all())
            time.sleep(0.05)
        assert read == 300
        w = Watcher(str(folder), *hook_args(webhook))
        times = []
        for r, want in ((1, 1), (2, 2), (3, 2)):
            (tmp_path / f"go-{r - 1}").touch()
            deadline = time.time() + 20
            while not (tmp_path / f"logged-{r}").exists() and time.time() < deadline:
                time.sleep(0.01)
            times.append(float((tmp_path / f"logged-{r}").read_text()))
            webhook.wait_for(want)
            time.sleep(2 * INTERVAL)
        (tmp_path / "go-3").touch()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-2000:]
        time.sleep(2 * INTERVAL)
        w.proc.send_signal(signal.SIGTERM)
        assert w.wait() == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert webhook.keys() == ["event:310:-", "nonfinite:335:-"]
    (t1, spike), (t2, nan) = webhook.received
    assert t1 - times[0] < 2 * INTERVAL and t2 - times[1] < 2 * INTERVAL
    assert spike["run"] == str(folder) and nan["severity"] == "critical"


def test_wandb_alert_goes_to_the_watched_wandb_run(tmp_path):
    """A W&B run read through the API (a local stand-in for the server): the alert is W&B's own run alert."""
    wandb = pytest.importorskip("wandb")
    if wandb.__version__ != "0.31.0":
        pytest.skip(f"the stand-in server answers wandb 0.31.0's requests; installed {wandb.__version__}")
    from tests.wandb_server import FakeRun, FakeWandbServer

    rng = np.random.default_rng(7)
    rows = [{"_step": s, "loss": loss(s, rng)} for s in range(300)]
    run = FakeRun(rows)
    with FakeWandbServer({"acme/drafter/w1": run}) as server:
        env = {
            **isolated_env(tmp_path),
            "WANDB_MODE": "online",
            "WANDB_BASE_URL": server.url,
            "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
        }
        w = Watcher(
            "wandb://acme/drafter/w1",
            "--interval",
            str(INTERVAL),
            "--quiet-period",
            "0",
            "--alert",
            "wandb",
            "--grace",
            "2",
            env=env,
        )
        run.rows += [{"_step": s, "loss": 9.0 if s == 310 else loss(s, rng)} for s in range(300, 330)]
        deadline = time.time() + 20
        while "NotifyScriptableRunAlert" not in server.operations() and time.time() < deadline:
            time.sleep(0.05)
        w.proc.send_signal(signal.SIGTERM)
        assert w.wait() == 0, w.proc.stderr.read()
        alerts = [v for op, v in server.queries if op == "NotifyScriptableRunAlert"]
    assert len(alerts) == 1
    a = alerts[0]
    assert (a["entityName"], a["projectName"], a["runName"], a["severity"]) == ("acme", "drafter", "w1", "WARN")
    assert a["title"] == "warning: event at step 310" and "loss spiked at step 310" in a["text"]


def test_a_batch_coming_back_joins_its_cause_and_is_not_alerted_again(demo_small, tmp_path, webhook):
    """The demo's planned run tailed from step 200: the batch of step 254 spikes again at 754; its cause grows (same
    key), so the webhook gets it once, with the steps it had when it was new."""
    import shutil

    src = demo_small / "static"
    case = tmp_path / "case"
    case.mkdir()
    for name in ("plan.parquet", "samples.parquet"):
        shutil.copy(src / name, case / name)
    (case / "run.toml").write_text(
        (src / "run.toml").read_text().replace('metrics = ["metrics.parquet"]', 'metrics = ["metrics.jsonl"]')
    )
    lines = (src / "metrics.jsonl").read_text().splitlines(keepends=True)
    (case / "metrics.jsonl").write_text("".join(lines[:200]))
    w = Watcher(str(case), *hook_args(webhook))
    with (case / "metrics.jsonl").open("a") as fh:
        fh.write("".join(lines[200:280]))

    def batches() -> list[dict]:
        return [b for _, b in webhook.received if b["cause"] == "batch"]

    deadline = time.time() + 20
    while len(batches()) < 2 and time.time() < deadline:  # the batches of 254 and 258
        time.sleep(0.05)
    assert [b["steps"] for b in batches()] == [[254], [258]]
    with (case / "metrics.jsonl").open("a") as fh:
        fh.write("".join(lines[280:800]))
    time.sleep(6 * INTERVAL)
    w.proc.send_signal(signal.SIGTERM)
    assert w.wait() == 0
    assert [b["key"] for b in batches()] == ["batch:254:c1bc105f40", "batch:258:1e9de38003"]
    assert len(webhook.keys()) == len(set(webhook.keys()))
    assert not [b for _, b in webhook.received if 754 in b["steps"]]


# --- delivery ------------------------------------------------------------------------------------------------------
class Recorder:
    """A sink that keeps what it got and when (``down_until``: it fails before then)."""

    name = "recorder"

    def __init__(self, down_until: float = 0.0) -> None:
        self.got: list[tuple[float, str]] = []
        self.down_until = down_until
        self.tries = 0

    def send(self, body: dict) -> None:
        self.tries += 1
        if time.monotonic() < self.down_until:
            raise OSError("down")
        self.got.append((time.monotonic(), body["key"]))


def body(key: str, severity: str) -> dict:
    from forensics.live.alerts import alert_body

    return alert_body({"kind": "event", "key": key, "severity": severity, "steps": [1], "summary": "s"}, "run")


def test_the_quiet_period_holds_warnings_sends_critical_at_once_and_then_the_held_together():
    from forensics.live.alerts import Delivery

    sink = Recorder()
    delivery = Delivery([sink], quiet_period_s=1.0, warn=lambda line: None)
    t0 = time.monotonic()
    delivery.submit(body("a", "warning"))
    time.sleep(0.2)
    delivery.submit(body("b", "warning"))
    delivery.submit(body("c", "warning"))
    time.sleep(0.2)
    assert [k for _, k in sink.got] == ["a"]  # b and c are held
    delivery.submit(body("d", "critical"))  # goes now, and takes what was held with it
    time.sleep(0.2)
    assert [k for _, k in sink.got] == ["a", "b", "c", "d"] and sink.got[-1][0] - t0 < 0.8
    delivery.submit(body("e", "warning"))
    time.sleep(0.3)
    assert len(sink.got) == 4
    assert delivery.close(grace_s=5) == 0  # closing sends what is held
    assert [k for _, k in sink.got] == ["a", "b", "c", "d", "e"]


def test_a_sink_that_is_down_is_retried_with_backoff_in_order_and_never_blocks_submit():
    from forensics.live.alerts import Backoff, Delivery

    sink = Recorder(down_until=time.monotonic() + 1.0)
    warned: list[str] = []
    delivery = Delivery([sink], quiet_period_s=0, backoff=Backoff(0.1, 0.4), warn=warned.append)
    t0 = time.monotonic()
    for k in "abc":
        delivery.submit(body(k, "warning"))
    assert time.monotonic() - t0 < 0.05
    assert delivery.close(grace_s=5) == 0
    assert [k for _, k in sink.got] == ["a", "b", "c"]
    assert sink.tries == 4 + 3  # failures at 0, 0.1, 0.3, 0.7 s (backoff 0.1, 0.2, 0.4), a at 1.1 s, then b, c
    assert warned == [
        "forensics watch: alert to recorder failed (down); retrying with backoff",
        "forensics watch: alert to recorder delivered again after failures",
    ]


def test_a_log_not_written_yet_is_waited_for_and_a_path_in_no_folder_is_not(tmp_path):
    from forensics.live.watch import not_yet_written, wait_for

    later, typo = tmp_path / "train.jsonl", tmp_path / "no-such-dir" / "train.jsonl"
    assert not_yet_written([str(later), str(typo), "mlflow:abc", "wandb://e/p/r"]) == [str(later)]
    said, naps = [], []

    def sleep(s):
        naps.append(s)
        if len(naps) == 3:
            later.write_text("")

    assert wait_for([str(later)], 0.5, None, said.append, sleep=sleep) is True
    assert naps == [0.5, 0.5, 0.5] and said == [f"forensics watch: waiting for {later} to appear (polling every 0.5s)"]
    now = [0.0]

    def tick(s):
        now[0] += s

    assert wait_for([str(tmp_path / "never")], 1.0, 3.0, said.append, sleep=tick, clock=lambda: now[0]) is False
    assert now[0] == 3.0


@pytest.mark.parametrize(
    "summary, shown",
    [
        ("plain words", "plain words"),
        ("cluster '<!channel> & co'", "cluster '&lt;!channel&gt; &amp; co'"),
        ("a <https://x|link>", "a &lt;https://x|link&gt;"),
    ],
)
def test_dataset_text_in_the_slack_line_is_escaped_and_the_body_keeps_it(summary, shown):
    from forensics.live.alerts import alert_body

    body = alert_body(
        {"kind": "batch", "key": "batch:1:x", "severity": "critical", "steps": [1], "summary": summary},
        run="r",
        dashboard="http://127.0.0.1:8501",
    )
    assert body["summary"] == summary
    assert (
        body["text"] == f"[critical] batch at step 1: {shown} (run r; key batch:1:x) <http://127.0.0.1:8501|dashboard>"
    )
