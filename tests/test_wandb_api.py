"""The W&B public API reader, with the real ``wandb`` 0.31 client talking to a local server on 127.0.0.1.

The client (through its ``wandb-core`` subprocess) sends, for one ``read_new()``:

1. ``POST /graphql`` ``query Viewer`` (``wandb.Api()`` checks the key) and ``query GetDefaultEntity``;
2. ``POST /graphql`` ``query Run($project, $entity, $name)`` with ``...RunFragment`` (state, config,
   summaryMetrics, historyKeys.lastStep); later reads send it again (``Run.load(force=True)``);
3. ``POST /graphql`` ``query RunHistoryKeys`` (``scan_history`` caps the scan at ``lastStep``);
4. ``POST /graphql`` ``query RunParquetHistory($entity, $project, $runName, $liveKeys=["_step"])``:
   ``parquetUrls`` and ``liveData`` (the steps past the export);
5. ``GET <parquetUrl>`` with ``Range: bytes=...`` headers (or whole): the parquet history export;
6. ``POST /graphql`` ``query HistoryPage($entity, $project, $run, $minStep, $maxStep, $pageSize)``, one per
   ``page_size`` steps from the page holding the export's end, ``pageSize`` = ``maxStep - minStep`` (so nothing is
   sampled; the rows of that first page that the export also held arrive twice and are read once);
7. ``POST /sdk/otel/v1/metrics``: telemetry, accepted and ignored.

The server (``tests/wandb_server.py``) answers exactly these and stops itself after a minute at most.
"""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path

import numpy as np
import pytest

wandb = pytest.importorskip("wandb")

from wandb_server import FakeRun, FakeWandbServer  # noqa: E402  (tests/ is on sys.path)

from forensics.errors import ForensicsError  # noqa: E402
from forensics.sources import open_reader  # noqa: E402
from forensics.sources.wandb.api_reader import RunPath, WandbApiReader, parse_run_path  # noqa: E402

pytestmark = pytest.mark.skipif(
    wandb.__version__ != "0.31.0", reason=f"the server answers wandb 0.31.0's requests; installed {wandb.__version__}"
)

DUMMY_KEY = "0123456789abcdef0123456789abcdef01234567"


def make_rows(start: int, stop: int) -> list[dict]:
    """History rows as W&B keeps them: nested dicts, NaN/inf, an eval metric every third step, a text value."""
    rows = []
    for i in range(start, stop):
        loss = {7: math.nan, 8: math.inf, 130: math.nan, 131: -math.inf}.get(i, 1.0 / (i + 1))
        row = {
            "_step": i,
            "_runtime": 0.1 * i,
            "_timestamp": 1.7e9 + i,
            "train/loss": loss,
            "opt": {"lr": 1e-4 * (i % 7), "grad_norm": 0.25 * i},
            "note": f"step {i}",
        }
        if i % 3 == 0:
            row["eval/acc"] = i / 1000
        rows.append(row)
    return rows


@pytest.fixture
def wandb_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A dummy key, W&B's folders under tmp_path, online mode: nothing of the user's setup is read or written."""
    for name in ("WANDB_MODE", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_API_KEY", DUMMY_KEY)


def history_pages(server: FakeWandbServer, since: int = 0) -> list[tuple[int, int, int]]:
    return [(v["minStep"], v["maxStep"], v["pageSize"]) for op, v in server.queries[since:] if op == "HistoryPage"]


def test_every_row_is_read_across_the_export_and_the_pages(wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = make_rows(0, 250)
    run = FakeRun(
        rows,
        config={"lr": 3e-4, "model": {"layers": 12}},
        summary={"train/loss": 0.004, "_runtime": 9},
        export_upto=120,
    )
    with FakeWandbServer({"acme/drafter/run1": run}) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        reader = WandbApiReader("wandb://acme/drafter/run1", page_size=50, timeout=5)
        got = reader.read_new()
        ops = server.operations()
    assert got["step"].tolist() == list(range(250))
    want_loss = np.array([r["train/loss"] for r in rows])
    np.testing.assert_array_equal(got["train/loss"].to_numpy(), want_loss)  # NaN/inf in the export and the pages
    np.testing.assert_array_equal(got["opt/grad_norm"].to_numpy(), 0.25 * np.arange(250))
    np.testing.assert_array_equal(got["opt/lr"].to_numpy(), 1e-4 * (np.arange(250) % 7))
    acc = got["eval/acc"].to_numpy()
    np.testing.assert_array_equal(acc[::3], np.arange(0, 250, 3) / 1000)
    assert np.isnan(acc[1::3]).all() and "eval/acc" not in reader.report.nonfinite  # missing, not NaN
    assert reader.report.nonfinite == {"train/loss": {"nan": 2, "inf": 2}}
    assert "_runtime" not in got.columns and got["_timestamp"].iloc[-1] == 1.7e9 + 249
    assert any("250 non-numeric history values dropped" in w and "'note'" in w for w in reader.report.warnings)
    meta = reader.report.metadata
    assert meta["config"] == {"lr": 3e-4, "model": {"layers": 12}}
    assert meta["summary"] == {"train/loss": 0.004} and meta["last_step"] == 249 and meta["state"] == "running"
    # the export covers steps 0-119; the rest comes in pages that ask for as many samples as they span steps (no
    # sampling). The client starts at the page holding the export's end, so steps 100-119 arrive twice: read once.
    assert "RunParquetHistory" in ops and ops.index("RunParquetHistory") < ops.index("HistoryPage")
    assert history_pages(server) == [(100, 150, 50), (150, 200, 50), (200, 250, 50)]
    assert any(r.startswith("GET /export/run1.parquet") for r in server.other_requests)


def test_a_later_read_fetches_only_steps_past_the_last(wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun(make_rows(0, 40))
    with FakeWandbServer({"acme/drafter/live1": run}) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        reader = WandbApiReader("acme/drafter/live1", page_size=25, timeout=5)
        first = reader.read_new()
        assert first["step"].tolist() == list(range(40))
        assert history_pages(server) == [(0, 25, 25), (25, 40, 15)]
        mark = len(server.queries)
        run.rows += make_rows(40, 70)
        second = reader.read_new()
        assert second["step"].tolist() == list(range(40, 70))
        np.testing.assert_array_equal(second["opt/grad_norm"].to_numpy(), 0.25 * np.arange(40, 70))
        assert history_pages(server, mark) == [(40, 65, 25), (65, 70, 5)]
        mark = len(server.queries)
        assert len(reader.read_new()) == 0
        assert history_pages(server, mark) == []  # nothing new: no page asked for
    assert reader.table["step"].tolist() == list(range(70))


def test_keys_keep_rows_that_lack_the_other_keys(wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A keyed ``scan_history`` drops rows missing any key; the reader must not: loss stays on every step."""
    with FakeWandbServer({"acme/drafter/k1": FakeRun(make_rows(0, 30))}) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        got = WandbApiReader(
            "https://wandb.ai/acme/drafter/runs/k1/overview", keys=["train/loss", "eval/*"], timeout=5
        ).read_all()
    assert sorted(got.columns) == ["_timestamp", "eval/acc", "step", "train/loss"]
    assert got["step"].tolist() == list(range(30)) and got["eval/acc"].notna().sum() == 10


def test_unknown_run_is_bad_input(wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeWandbServer({"acme/drafter/run1": FakeRun(make_rows(0, 5))}) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        with pytest.raises(ForensicsError, match=r"W&B run acme/drafter/nope was not found on http://127\.0\.0\.1"):
            WandbApiReader("wandb://acme/drafter/nope", timeout=5).read_new()


def test_a_refused_key_is_bad_input(wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeWandbServer({"acme/drafter/run1": FakeRun(make_rows(0, 5))}, api_key="f" * 40) as server:
        monkeypatch.setenv("WANDB_BASE_URL", server.url)
        with pytest.raises(ForensicsError, match="rejected the API key for run acme/drafter/run1"):
            WandbApiReader("wandb://acme/drafter/run1", timeout=5).read_new()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_missing_api_key_is_bad_input(wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ForensicsError, match="no W&B API key .* set WANDB_API_KEY or run `wandb login`"):
        WandbApiReader("wandb://acme/drafter/run1", timeout=2).read_new()


def test_no_network_is_bad_input_within_seconds(wandb_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    start = time.monotonic()
    with pytest.raises(ForensicsError, match=f"could not reach W&B at {url}"):
        WandbApiReader("wandb://acme/drafter/run1", timeout=2).read_new()
    assert time.monotonic() - start < 15


def test_run_paths_and_urls_parse() -> None:
    want = RunPath("acme", "drafter", "ab12cd")
    assert parse_run_path("wandb://acme/drafter/ab12cd") == want
    assert parse_run_path("https://wandb.ai/acme/drafter/runs/ab12cd/logs?nw=1") == want
    assert parse_run_path("wandb.ai/acme/drafter/runs/ab12cd") == want
    assert parse_run_path("acme/drafter/ab12cd") == want
    with pytest.raises(ForensicsError, match="not a run path"):
        parse_run_path("wandb://acme/drafter")


def test_open_reader_sends_run_paths_to_the_api_reader() -> None:
    for source in ("wandb://acme/drafter/ab12cd", "https://wandb.ai/acme/drafter/runs/ab12cd"):
        reader = open_reader(source, keys=["train/loss"])
        assert isinstance(reader, WandbApiReader) and reader.run_path == RunPath("acme", "drafter", "ab12cd")
        assert reader.keys == ["train/loss"]  # constructing reads nothing: no request is made here
