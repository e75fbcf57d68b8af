"""The dashboard app under streamlit's AppTest: both demo cases render every view, and a run that keeps writing
(a JSONL log, a W&B offline file) shows its new steps and a new spike on the next refresh, without a restart.

AppTest runs no timers, so each refresh is an explicit ``at.run()`` (one run of the live fragment = one poll).
The demo's sample clusters are fitted once per test session into a shared cache folder (FORENSICS_CACHE_DIR).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from forensics.cache import CACHE_ENV  # noqa: E402
from forensics.dashboard.session import TARGET  # noqa: E402
from forensics.dashboard.state import LiveRun, resolve_target  # noqa: E402

SCRIPT_TEXT = "<script>alert(1)</script>"
HOSTILE_SAMPLE = 6567  # a suspect of the static demo's spike at step 254
TIMEOUT = 240


@pytest.fixture(scope="session", autouse=True)
def dashboard_cache(tmp_path_factory: pytest.TempPathFactory):
    """One cache folder for the whole session (the browser test's server uses the same one)."""
    path = shared_cache_dir(tmp_path_factory)
    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(path)
    yield path
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


def shared_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.getbasetemp() / "dashboard-cache"
    path.mkdir(exist_ok=True)
    return path


def app(target: Path | str) -> AppTest:
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=TIMEOUT)
    at.session_state[TARGET] = [str(target)]
    return at


def page_text(at: AppTest) -> str:
    """Everything the page shows as text (markdown, captions, alerts), backslash escapes removed."""
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [w.value for w in at.warning]
    return "\n".join(parts).replace("\\", "").replace("**", "").replace("&lt;", "<").replace("&amp;", "&")


def live_case(src: Path, dst: Path, rows: int, source: str = "jsonl") -> Path:
    """A copy of a demo case whose metrics source is a log that holds only its first ``rows`` steps, with no
    findings.json (the app audits what exists at start) and one suspect sample's text set to a script tag.

    The samples keep the clusters fitted for the demo (as the dashboard cached them), so no fit is repeated.
    """
    dst.mkdir(parents=True)
    shutil.copy(src / "plan.parquet", dst / "plan.parquet")
    samples = pd.read_parquet(src / "samples.parquet")
    from forensics.live.tables import clustered_samples_path
    from forensics.live.tables import fit_clusters as _fit_clusters

    fitted = pd.read_parquet(clustered_samples_path(src / "samples.parquet", lambda: _fit_clusters(
        src / "samples.parquet")))
    samples = fitted.copy()
    samples.loc[samples["sample_id"] == HOSTILE_SAMPLE, "text"] = f"code def {SCRIPT_TEXT} return"
    samples.to_parquet(dst / "samples.parquet", index=False)
    toml = (src / "run.toml").read_text()
    metrics = '["metrics.jsonl"]' if source == "jsonl" else '["wandb"]'
    (dst / "run.toml").write_text(toml.replace('metrics = ["metrics.parquet"]', f"metrics = {metrics}"))
    if source == "jsonl":
        lines = (src / "metrics.jsonl").read_text().splitlines(keepends=True)
        (dst / "metrics.jsonl").write_text("".join(lines[:rows]))
    return dst


def append_jsonl(src: Path, dst: Path, upto: int) -> None:
    lines = (src / "metrics.jsonl").read_text().splitlines(keepends=True)
    have = len(dst.read_text().splitlines())
    with dst.open("a") as fh:
        fh.write("".join(lines[have:upto]))


def test_static_demo_shows_its_spikes_in_every_view(demo_small: Path) -> None:
    at = app(demo_small / "static").run()
    assert not at.exception, at.exception
    text = page_text(at)
    # one line per cause at the top, each with its steps: the batches of 254 and 258 and their returns
    assert "C1: batch" in text and "C2: batch" in text
    for step in (254, 258, 754, 1107):
        assert str(step) in text
    assert "built once and only reordered" in text  # the verdict, at the top
    assert len(at.get("plotly_chart")) == 1  # the run view's curves
    shown = {}
    for view in ("Buckets & clusters", "Composition", "Causes", "Step inspector"):
        at.radio(key="view").set_value(view).run()
        assert not at.exception, (view, at.exception)
        shown[view] = (len(at.get("plotly_chart")), page_text(at))
    assert shown["Buckets & clusters"][0] == 3
    assert "length buckets explain 87.8%" in shown["Buckets & clusters"][1]
    assert shown["Composition"][0] == 1 and "Composition gate FAILED" in shown["Composition"][1]
    assert "The batch of step 254 (3 samples, suspects first)" in shown["Causes"][1]
    cards = at.get("table")
    assert cards, "the step inspector shows the batch as a table"


def test_bucketed_demo_shows_no_spike(demo_small: Path) -> None:
    at = app(demo_small / "bucketed").run()
    assert not at.exception, at.exception
    text = page_text(at)
    assert "no spike found" in text
    assert "spike at step" not in text
    assert len(at.get("plotly_chart")) == 1
    at.radio(key="view").set_value("Causes").run()
    assert not at.exception
    assert "No causes: no spike was found." in page_text(at)


def test_appended_jsonl_rows_and_a_new_spike_appear_on_refresh(demo_small: Path, tmp_path: Path) -> None:
    src = demo_small / "static"
    case = live_case(src, tmp_path / "live", rows=200)
    at = app(case).run()
    assert not at.exception, at.exception
    assert "200 steps read, newest step 199" in page_text(at)
    assert "New findings" not in page_text(at)
    append_jsonl(src, case / "metrics.jsonl", 240)  # round 1: rows, no spike yet
    at.run()
    assert "240 steps read, newest step 239" in page_text(at)
    assert "New findings" not in page_text(at)
    append_jsonl(src, case / "metrics.jsonl", 300)  # round 2: past the spikes at 254 and 258
    at.run()
    text = page_text(at)
    assert "300 steps read, newest step 299" in text
    assert "New findings (4, found while watching)" in text  # loss and grad norm at 254 and 258
    assert "spike at step 254: train/loss" in text and "spike at step 258: train/loss" in text
    run = at.session_state["forensics_run"]
    new = [n.finding for n in run.new_findings if n.finding["metric"] == "train/loss"]
    assert [f["step"] for f in new] == [254, 258]
    assert new[0]["bucket"] == 5 and HOSTILE_SAMPLE in new[0]["suspect_samples"]
    assert [t.value for t in at.toast][:1] and "254" in at.toast[0].value
    # the hostile text shows as text in the causes card of the live spike
    at.radio(key="view").set_value("Causes").run()
    picks = at.selectbox(key="cause_pick")
    picks.set_value(picks.options.index(next(o for o in picks.options if o.startswith("live-1")))).run()
    assert not at.exception
    table = at.get("table")[0].value
    assert any(SCRIPT_TEXT in str(t) for t in table["text"])


def test_appended_wandb_records_and_a_new_spike_appear_on_refresh(demo_small: Path, tmp_path: Path) -> None:
    from forensics.sources.wandb.record_log import RecordLog

    src = demo_small / "static"
    (run_file,) = list((src / "wandb").glob("offline-run-*/run-*.wandb"))
    data = run_file.read_bytes()
    log = RecordLog(run_file)
    history_ends = [log.offset for _, rec in log.records() if rec.WhichOneof("record_type") == "history"]
    case = live_case(src, tmp_path / "live-wandb", rows=0, source="wandb")
    dst = case / "wandb" / run_file.parent.name / run_file.name
    dst.parent.mkdir(parents=True)
    dst.write_bytes(data[: history_ends[199]])  # steps 0-199
    at = app(case).run()
    assert not at.exception, at.exception
    assert "200 steps read, newest step 199" in page_text(at)
    for upto, want_new in ((239, 0), (299, 4)):
        with dst.open("ab") as fh:
            fh.write(data[dst.stat().st_size: history_ends[upto]])
        at.run()
        text = page_text(at)
        assert f"{upto + 1} steps read, newest step {upto}" in text
        assert (f"New findings ({want_new}," in text) if want_new else "New findings" not in text
    assert "spike at step 254: train/loss" in text


def test_a_run_that_stopped_writing_says_so(demo_small: Path, tmp_path: Path) -> None:
    from forensics.dashboard.views.header import status_line

    now = [2e9]
    run = LiveRun(resolve_target([str(demo_small / "static")]), clock=lambda: now[0]).start()
    run.last_arrival = now[0] - 3
    run.metrics = run.metrics.drop(columns=["_timestamp"])
    text, stale = status_line(run, 5.0, False)
    assert not stale and "written 3 s ago" in text and "refreshing every 5 s" in text
    now[0] += 600
    text, stale = status_line(run, 5.0, True)
    assert stale and "written 10 min ago · stopped writing · refresh paused" in text


def test_stored_findings_are_read_and_steps_past_them_are_judged_live(demo_small: Path, tmp_path: Path) -> None:
    """A case with findings.json opens without an audit (tags from the cache) and judges only the new rows."""

    src = demo_small / "static"
    case = live_case(src, tmp_path / "stored", rows=200)
    first = LiveRun(resolve_target([str(case)])).start()
    assert first.findings_source == "computed at start" and first.findings["spikes"] == []
    (case / "findings.json").write_text(json.dumps(first.findings))
    run = LiveRun(resolve_target([str(case)])).start()
    assert run.findings_source == str(case / "findings.json")
    assert run._plan is None  # read from the cache only when a view needs it
    assert run.tags["bucket"].tolist() == first.tags["bucket"].tolist()
    append_jsonl(src, case / "metrics.jsonl", 300)
    new = run.refresh()
    assert [(n.finding["metric"], n.finding["step"]) for n in new] == [
        ("train/loss", 254), ("train/loss", 258), ("grad_norm", 254), ("grad_norm", 258)]
    assert new[0].finding["cluster_name"] == first.tags.loc[first.tags["step"] == 254, "cluster_name"].iloc[0]
    assert HOSTILE_SAMPLE in new[0].finding["suspect_samples"]
    assert len(run.step_batch(254)) == 3


def test_new_plan_parts_are_tagged_with_the_fit_of_the_start(demo_small: Path, tmp_path: Path) -> None:
    """A recorder still writing (a plan folder of parts): the parts added later get tags from the boundaries and
    clusters fitted at start, equal to a full tagging's, and the new spike names its batch's samples."""
    from forensics.plan.recorder import PlanRecorder

    src = demo_small / "static"
    case = live_case(src, tmp_path / "recording", rows=200)
    (case / "plan.parquet").unlink()
    toml = (case / "run.toml").read_text().replace('plan = "plan.parquet"', 'plan = "plan"')
    (case / "run.toml").write_text(toml)
    full = pd.read_parquet(src / "plan.parquet")
    epoch0 = full[full["epoch"] == 0]
    batches = [g["sample_id"].tolist() for _, g in epoch0.groupby("batch_id", sort=True)]
    rec = PlanRecorder(case / "plan", flush_every=10_000)
    rec.set_epoch(0)
    for ids in batches[:250]:
        rec.record(ids)
    rec.flush()
    run = LiveRun(resolve_target([str(case)])).start()
    assert int(run.tags["step"].max()) == 249
    for ids in batches[250:300]:
        rec.record(ids)
    rec.flush()
    append_jsonl(src, case / "metrics.jsonl", 300)
    new = run.refresh()
    assert int(run.tags["step"].max()) == 299 and run.tags["step"].is_unique
    reference = LiveRun(resolve_target([str(src)])).start().tags.set_index("step")
    got = run.tags.set_index("step")
    for col in ("bucket", "cluster", "n_samples", "real_tokens"):
        assert got.loc[250:299, col].tolist() == reference.loc[250:299, col].tolist(), col
    loss = [n.finding for n in new if n.finding["metric"] == "train/loss"]
    assert [f["step"] for f in loss] == [254, 258]
    assert loss[0]["bucket"] == 5 and sorted(loss[0]["suspect_samples"]) == sorted(batches[254])


def test_a_crash_line_written_while_watching_is_a_new_cause_on_the_page(tmp_path: Path) -> None:
    """The dashboard's loop reads the run's health as the audit does: a ``slurm-123.out`` that ends in a CUDA
    out-of-memory line, written after the last row, shows on the next refresh as a new critical crash cause."""
    case = tmp_path / "case"
    case.mkdir()
    (case / "run.toml").write_text('metrics = ["metrics.jsonl"]\n')
    (case / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3.0 - s / 400 + 0.01 * (s % 7)})
                                                + "\n" for s in range(300)))
    at = app(case).run()
    assert not at.exception, at.exception
    assert "crash cause" not in page_text(at)
    (case / "slurm-123.out").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    at.run()
    text = page_text(at)
    assert "New causes (1, found while watching)" in text
    assert "crash cause, steps 299 (critical)" in text
