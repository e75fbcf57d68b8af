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

    fitted = pd.read_parquet(
        clustered_samples_path(src / "samples.parquet", lambda: _fit_clusters(src / "samples.parquet"))
    )
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


def cause_table(at: AppTest) -> pd.DataFrame:
    """The causes table widget's rows (the first table of the page)."""
    return next(d.value for d in at.dataframe if "summary" in d.value.columns)


def test_static_demo_shows_its_spikes_in_every_view(demo_small: Path) -> None:
    at = app(demo_small / "static").run()
    assert not at.exception, at.exception
    text = page_text(at)
    # one line per cause at the top, each with its steps: the batches of 254 and 258 and their returns
    assert "C1: batch · ■ critical · steps 254, 754" in text and "C2: batch · ■ critical · steps 258, 1107" in text
    assert "built once and only reordered" in text  # the verdict, at the top
    assert len(at.get("plotly_chart")) == 1  # the curve, always drawn
    # the default view under the curve: the causes table, the harmful samples grouped, the first cause's card
    assert cause_table(at)["id"].tolist() == ["C1", "C2"]
    assert "The batch of step 254 (3 samples, suspects first)" in text
    samples = next(d.value for d in at.dataframe if "appearances" in d.value.columns)
    assert samples["samples"].tolist() == ["2300, 4483, 1034", "6567, 147, 6768"]
    assert samples["appearances"].tolist() == [6, 6]
    shown = {}
    for view in ("Buckets & clusters", "Composition", "Step inspector"):
        at.radio(key="view").set_value(view).run()
        assert not at.exception, (view, at.exception)
        shown[view] = (len(at.get("plotly_chart")), page_text(at))
    assert shown["Buckets & clusters"][0] == 1 + 3
    assert "length buckets explain 87.8%" in shown["Buckets & clusters"][1]
    assert shown["Composition"][0] == 1 + 1 and "Composition gate FAILED" in shown["Composition"][1]
    cards = at.get("table")
    assert cards, "the step inspector shows the batch as a table"


def audited_case(src: Path, dst: Path, plan: bool) -> dict:
    """A copy of a demo case (its metrics only, or with its plan and samples) audited by ``forensics audit``: the
    findings.json the page then reads."""
    import subprocess
    import sys

    dst.mkdir(parents=True)
    shutil.copy(src / "metrics.jsonl", dst / "metrics.jsonl")
    toml = 'metrics = ["metrics.jsonl"]\nloss_key = "train/loss"\n'
    if plan:
        for name in ("plan.parquet", "samples.parquet"):
            shutil.copy(src / name, dst / name)
        toml = (src / "run.toml").read_text().replace('metrics = ["metrics.parquet"]', 'metrics = ["metrics.jsonl"]')
    (dst / "run.toml").write_text(toml)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "forensics", "audit", str(dst)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(root)),
        timeout=TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((dst / "findings.json").read_text())


@pytest.mark.parametrize("plan", [False, True], ids=["metrics-only", "with-plan"])
def test_the_causes_table_is_findings_json_causes(demo_small: Path, tmp_path: Path, plan: bool) -> None:
    """The table's rows are findings.json's causes, id for id, severity (word and shape) and steps as logged; the
    page works with no plan (metrics only: no harmful samples, no batch) and with one."""
    from forensics.report.overview import severity_label
    from forensics.schema.steps import steps_list

    findings = audited_case(demo_small / "static", tmp_path / "case", plan)
    at = app(tmp_path / "case").run()
    assert not at.exception, at.exception
    table = cause_table(at)
    causes = findings["causes"]
    assert len(causes) >= 2
    rank = {"critical": 0, "warning": 1, "info": 2}
    want = sorted(causes, key=lambda c: (rank[c["severity"]], min(c["logged_steps"])))
    assert table["id"].tolist() == [c["id"] for c in want]
    assert table["severity"].tolist() == [severity_label(c["severity"]) for c in want]
    assert table["steps"].tolist() == [steps_list(c["logged_steps"]) for c in want]
    text = page_text(at)
    for c in causes:  # and each as a plain-text line at the top
        assert f"{c['id']}: {c['kind']} · {severity_label(c['severity'])} · steps " in text
    assert ("Harmful samples" in text) is plan
    assert ("The batch of step" in text) is plan


def band_traces(at: AppTest) -> list:
    """The curve's expected-band traces (lower edge, filled upper edge, centre) as the page drew them."""
    fig = at.session_state["fig_curves_cache"][1]
    return [t for t in fig.data if t.legendgroup == "expected"]


def test_the_curve_draws_the_expected_band_of_the_composition_with_a_plan(demo_small: Path, tmp_path: Path) -> None:
    """With a plan the loss (and grad norm) is drawn over the band "expected from composition", once in the legend;
    its centre at each loss spike's peak is the expectation the audit's driver judged it against (findings.json
    ``baseline``): the page's online driver and the audit agree."""
    from forensics.report.expected import BAND_NAME

    findings = audited_case(demo_small / "static", tmp_path / "case", plan=True)
    at = app(tmp_path / "case").run()
    assert not at.exception, at.exception
    band = band_traces(at)
    assert [(t.name, t.yaxis) for t in band] == [
        (f"{BAND_NAME} (low)", "y"),
        (BAND_NAME, "y"),
        (f"{BAND_NAME} (expected)", "y"),
        (f"{BAND_NAME} (low)", "y2"),
        (BAND_NAME, "y2"),
        (f"{BAND_NAME} (expected)", "y2"),
    ]
    assert [t.showlegend for t in band if t.name == BAND_NAME] == [True, False] and band[1].fill == "tonexty"
    centre = pd.Series(band[2].y, index=band[2].x)
    peaks = {s["peak_step"]: s["baseline"] for s in findings["spikes"] if s["metric"] == "train/loss"}
    assert sorted(peaks) == [254, 258, 754, 1107]
    assert [centre[p] for p in sorted(peaks)] == pytest.approx([peaks[p] for p in sorted(peaks)], rel=1e-9)
    spikes = {t.name for t in at.session_state["fig_curves_cache"][1].data if t.name.startswith("spike (")}
    assert spikes == {"spike (critical)"}  # the spikes stay marked beside the band


def test_the_curve_of_a_metrics_only_run_has_no_expected_band(demo_small: Path, tmp_path: Path) -> None:
    audited_case(demo_small / "static", tmp_path / "case", plan=False)
    at = app(tmp_path / "case").run()
    assert not at.exception, at.exception
    assert band_traces(at) == []
    assert len(at.get("plotly_chart")) == 1


CLICK_SPIKES = [
    {"step": 254, "end_step": 254, "peak_step": 254, "cause": "C1"},
    {"step": 300, "end_step": 303, "peak_step": 301, "cause": "C2"},
    {"step": 400, "end_step": 400, "peak_step": 400, "cause": None},  # not grouped yet: nothing to open
]


@pytest.mark.parametrize(
    ("points", "cause"),
    [
        ([{"x": 254, "customdata": "C9"}], "C9"),  # the marker's own cause wins
        ([{"x": 254}], "C1"),  # the curve's point under the marker
        ([{"x": 253}], None),  # one step before the spike
        ([{"x": 255}], None),  # one step after it
        ([{"x": 300}], "C2"),  # first step of a spike spanning steps
        ([{"x": 303.0}], "C2"),  # its last step (plotly hands x as a float)
        ([{"x": 304}], None),
        ([{"x": 400}], None),  # a spike with no cause yet
        ([{"x": 10}, {"x": 301}], "C2"),  # a box selection: the first point on a spike
        ([], None),
    ],
)
def test_a_click_on_the_curve_picks_the_cause_of_the_spike_at_its_step(points: list, cause: str | None) -> None:
    from types import SimpleNamespace

    from forensics.dashboard.views.run import clicked_cause

    run = SimpleNamespace(current_findings=lambda: {"spikes": CLICK_SPIKES})
    assert clicked_cause(run, points) == cause


def test_severity_is_never_colour_alone(demo_small: Path, tmp_path: Path) -> None:
    """Every place a severity shows carries its word and a shape: the strip, the lines, the table, the markers."""
    case = tmp_path / "static"
    shutil.copytree(demo_small / "static", case, ignore=shutil.ignore_patterns("wandb"))
    old = (case / "metrics.parquet").stat().st_mtime - 3600
    for f in case.rglob("*"):
        os.utime(f, (old, old))
    at = app(case).run()
    strip = next(m.value for m in at.markdown if "status-strip" in m.value)
    assert "▲ WARNING</span>" in strip  # a finished run stopped writing: a warning, said in words
    assert "2 ■ critical, 0 ▲ warning, 0 ● info" in strip
    assert set(cause_table(at)["severity"]) == {"■ critical"}
    fig = at.session_state["fig_curves_cache"][1]
    spikes = [t for t in fig.data if t.name and t.name.startswith("spike (")]
    assert {t.name for t in spikes} == {"spike (critical)"}
    assert {t.marker.symbol for t in spikes} == {"square-open"}


def test_bucketed_demo_shows_no_spike(demo_small: Path) -> None:
    at = app(demo_small / "bucketed").run()
    assert not at.exception, at.exception
    text = page_text(at)
    assert "no spike found" in text
    assert "spike at step" not in text
    assert len(at.get("plotly_chart")) == 1
    assert "No causes: no spike was found." in text
    assert "0 ■ critical, 0 ▲ warning, 0 ● info" in text


def test_appended_jsonl_rows_and_a_new_spike_appear_on_refresh(demo_small: Path, tmp_path: Path) -> None:
    src = demo_small / "static"
    case = live_case(src, tmp_path / "live", rows=200)
    at = app(case).run()
    assert not at.exception, at.exception
    assert "newest step 199" in page_text(at) and "200 steps read" in page_text(at)
    assert "New findings" not in page_text(at)
    assert "Nothing new since the page opened." in page_text(at)
    append_jsonl(src, case / "metrics.jsonl", 240)  # round 1: rows, no spike yet
    at.run()
    assert "newest step 239" in page_text(at) and "240 steps read" in page_text(at)
    assert "New findings" not in page_text(at)
    append_jsonl(src, case / "metrics.jsonl", 300)  # round 2: past the spikes at 254 and 258
    at.run()
    text = page_text(at)
    assert "newest step 299" in text and "300 steps read" in text
    assert (
        "New findings (4, found while watching): step 254 spike train/loss ■ critical, step 258 spike "
        "train/loss ■ critical, step 254 spike grad_norm ■ critical, step 258 spike grad_norm ■ critical"
    ) in text
    run = at.session_state["forensics_run"]
    new = [n.finding for n in run.new_findings if n.finding["metric"] == "train/loss"]
    assert [f["step"] for f in new] == [254, 258]
    assert new[0]["bucket"] == 5 and HOSTILE_SAMPLE in new[0]["suspect_samples"]
    assert [t.value for t in at.toast][:1] and "254" in at.toast[0].value
    # the new causes are rows of the table on this refresh, and the timeline lists each with its time and step
    rows = cause_table(at)
    assert sorted(rows["id"]) == sorted(c["id"] for c in run.causes)
    spiked = [c for c in run.causes if 254 in c["steps"]]
    assert spiked and all(c["id"] in rows["id"].tolist() for c in spiked)
    found = next(d.value for d in at.dataframe if "found" in d.value.columns)
    assert "254" in found["step"].tolist() and "258" in found["step"].tolist()
    assert set(found["severity"]) == {"■ critical"} and len(found) == len(run.new_causes) + 4
    # the hostile text shows as text in the card of the spike's cause
    at.selectbox(key="cause_pick").set_value(spiked[0]["id"]).run()
    assert not at.exception
    table = next(t.value for t in at.get("table") if "text" in t.value.columns)
    assert any(SCRIPT_TEXT in str(t) for t in table["text"])


def test_a_harmful_sample_text_is_shown_as_text(demo_small: Path, tmp_path: Path) -> None:
    """A sample's text, opened from the harmful samples table, is plain text: a script tag shows literally and no
    Markdown or HTML element carries it."""
    case = live_case(demo_small / "static", tmp_path / "live", rows=3504)
    at = app(case).run()
    assert not at.exception, at.exception
    run = at.session_state["forensics_run"]
    assert HOSTILE_SAMPLE in [h["sample_id"] for h in run.harmful_samples]
    at.selectbox(key="sample_text_pick").set_value(HOSTILE_SAMPLE).run()
    assert not at.exception
    assert [t.value for t in at.text] == [f"code def {SCRIPT_TEXT} return"]
    assert not any("<script" in m.value for m in at.markdown)


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
    assert "200 steps read" in page_text(at) and "newest step 199" in page_text(at)
    for upto, want_new in ((239, 0), (299, 4)):
        with dst.open("ab") as fh:
            fh.write(data[dst.stat().st_size : history_ends[upto]])
        at.run()
        text = page_text(at)
        assert f"{upto + 1} steps read" in text and f"newest step {upto}" in text
        assert (f"New findings ({want_new}," in text) if want_new else "New findings" not in text
    assert "step 254 spike train/loss ■ critical" in text


def test_a_run_that_stopped_writing_says_so(demo_small: Path, tmp_path: Path) -> None:
    from forensics.dashboard.views.header import strip_words

    now = [2e9]
    run = LiveRun(resolve_target([str(demo_small / "static")]), clock=lambda: now[0]).start()
    run.last_arrival = now[0] - 3
    run.metrics = run.metrics.drop(columns=["_timestamp"])
    text = strip_words(run, 5.0, False)
    assert text.startswith(
        "✓ OK: no cause at warning or above in the last 175 steps │ newest step 3,503 · row age "
        "3 s │ throughput 30.4K tokens_per_s"
    )
    assert "STALE" not in text and text.endswith("3,504 steps read · refreshing every 5 s")
    now[0] += 600
    text = strip_words(run, 5.0, True)
    assert text.startswith(
        "▲ WARNING: the run stopped writing │ newest step 3,503 · row age 10 min · STALE (no new row for 2 min)"
    )
    assert text.endswith("refresh paused")


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
        ("train/loss", 254),
        ("train/loss", 258),
        ("grad_norm", 254),
        ("grad_norm", 258),
    ]
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
    (case / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 3.0 - s / 400 + 0.01 * (s % 7)}) + "\n" for s in range(300))
    )
    at = app(case).run()
    assert not at.exception, at.exception
    assert ": crash ·" not in page_text(at) and "■ CRITICAL" not in page_text(at)
    (case / "slurm-123.out").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    at.run()
    text = page_text(at)
    run = at.session_state["forensics_run"]
    (crash,) = [n.cause for n in run.new_causes]
    assert crash["kind"] == "crash" and crash["severity"] == "critical"
    assert f"{crash['id']}: crash · ■ critical · steps 299 · new at " in text  # its line at the top
    assert f"■ CRITICAL</span> <span>crash cause {crash['id']} at steps 299</span>" in text  # the state now
    assert f"last new cause {crash['id']} crash · critical at " in text
    assert crash["id"] in cause_table(at)["id"].tolist()
    found = next(d.value for d in at.dataframe if "found" in d.value.columns)
    assert found[["step", "severity", "what"]].values.tolist() == [["299", "■ critical", f"cause {crash['id']}: crash"]]
