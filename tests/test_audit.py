"""`forensics audit` end to end on the demo: the story's spikes, the static plan, bucket jumpiness, exit codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forensics.cli import main


def audit(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["audit", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="session")
def static_audit(demo_small: Path, tmp_path_factory) -> dict:
    """The audit of the small static demo, run once: findings, summary text, outputs."""
    out = tmp_path_factory.mktemp("audit-static")
    code = main(
        ["audit", str(demo_small / "static"), "--json", str(out / "findings.json"), "--html", str(out / "report.html")]
    )
    return {"code": code, "findings": json.loads((out / "findings.json").read_text()), "dir": out}


@pytest.fixture(scope="session")
def bucketed_audit(demo_small: Path, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("audit-bucketed")
    code = main(["audit", str(demo_small / "bucketed"), "--json", str(out / "findings.json"), "--no-html"])
    return {"code": code, "findings": json.loads((out / "findings.json").read_text())}


def loss_spikes(findings: dict) -> list[dict]:
    return [s for s in findings["spikes"] if s["metric"] == "train/loss"]


def test_static_demo_spikes_at_254_and_258_with_bucket_cluster_and_samples(static_audit, demo_small):
    labels = json.loads((demo_small / "static" / "labels.json").read_text())
    spikes = loss_spikes(static_audit["findings"])
    for label in labels["spikes"]:
        hits = [s for s in spikes if abs(s["step"] - label["step"]) <= 2]
        assert len(hits) == 1, f"labelled spike at {label['step']} not found once: {[s['step'] for s in spikes]}"
        hit = hits[0]
        assert hit["bucket"] == 5 and hit["bucket_range"] == "(3296, 8192]"
        assert isinstance(hit["cluster"], int) and hit["cluster_name"]
        assert hit["value"] > 1.5 * hit["baseline"] and hit["score"] > 10
        if label["step"] in (254, 258):  # the story's jumps from ~0.9 to 4-6
            assert 3.5 < hit["value"] < 6.5 and 0.6 < hit["baseline"] < 1.3
        first = hit["suspect_samples"][: len(label["sample_ids"])]
        assert set(first) == set(label["sample_ids"])
    assert {254, 258} <= {s["step"] for s in spikes}
    # no event outside the labelled ones
    labelled = {s["step"] for s in labels["spikes"]}
    assert all(min(abs(s["step"] - x) for x in labelled) <= 2 for s in spikes)


def test_static_demo_plan_is_static_with_full_pair_retention(static_audit):
    plan = static_audit["findings"]["plan"]
    assert plan["static"] is True
    assert len(plan["pair_retention"]) == 5 and all(x == pytest.approx(1.0) for x in plan["pair_retention"])


def test_findings_have_the_contract_keys(static_audit):
    f = static_audit["findings"]
    assert static_audit["code"] == 0
    for key in ("spikes", "nonfinite", "oscillation", "plan"):
        assert key in f
    assert isinstance(f["oscillation"]["detected"], bool)
    assert 0.0 <= f["oscillation"]["bucket_variance_share"] <= 1.0
    for s in f["spikes"]:
        for key in (
            "step",
            "end_step",
            "peak_step",
            "metric",
            "value",
            "baseline",
            "score",
            "suspect_samples",
            "bucket",
            "bucket_range",
            "cluster",
            "cluster_name",
        ):
            assert key in s, key
        assert s["step"] <= s["peak_step"] <= s["end_step"]


def test_recurrence_of_the_spike_batches_is_reported(static_audit):
    rec = static_audit["findings"]["recurrence"]
    first = next(r for r in rec["spikes"] if r["step"] == 254)
    epochs = {o["epoch"] for o in first["recurrences"]}
    assert epochs == {1, 2, 3, 4, 5}


def test_report_has_a_card_per_cause_with_every_event_in_it(static_audit):
    html = (static_audit["dir"] / "report.html").read_text()
    causes = static_audit["findings"]["causes"]
    assert [c["kind"] for c in causes] == ["batch", "batch"]
    for c in causes:
        card = html[html.index(f'id="cause-{c["id"]}"') :]
        card = card[: card.index("</article>")]
        for s in static_audit["findings"]["spikes"]:
            if s["cause"] == c["id"]:
                assert f"<td>{s['peak_step']}</td>" in card
        assert card.count('class="batch"') <= 1  # one batch table per cause, not one per metric


def test_outputs_go_into_the_case_folder_by_default(demo_small, tmp_path, capsys):
    case = tmp_path / "case"
    shutil.copytree(demo_small / "bucketed", case, ignore=shutil.ignore_patterns("wandb"))
    code, out, _ = audit([str(case)], capsys)
    assert code == 0
    assert json.loads((case / "findings.json").read_text())["plan"]["static"] is False
    html = (case / "report.html").read_text()
    assert html.count("<script") == html.count("</script>") and "Plotly.newPlot" in html
    assert f"wrote {case / 'findings.json'}, {case / 'report.html'}" in out


def test_short_runs_say_what_was_not_judged(tmp_path, capsys):
    rows = [{"step": i, "loss": 2.0 - i / 100} for i in range(45)]
    rows[20]["loss"] = 12.0
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code, _, _ = audit(["--metrics", str(tmp_path / "m.jsonl"), "--json", str(tmp_path / "f.json")], capsys)
    assert code == 0
    f = json.loads((tmp_path / "f.json").read_text())
    assert any("only 45 values: the first 32" in w for w in f["warnings"])


def test_samples_without_text_are_clustered_by_their_source(demo_small, tmp_path, capsys):
    case = tmp_path / "case"
    shutil.copytree(demo_small / "static", case, ignore=shutil.ignore_patterns("wandb"))
    samples = pd.read_parquet(case / "samples.parquet").drop(columns=["text"])
    samples.to_parquet(case / "samples.parquet")
    code, _, _ = audit([str(case), "--no-html"], capsys)
    assert code == 0
    f = json.loads((case / "findings.json").read_text())
    first = next(s for s in f["spikes"] if s["step"] == 254 and s["metric"] == "train/loss")
    assert first["cluster_name"] == "code"
    assert any("clusters are their 'source' labels" in w for w in f["warnings"])


def test_bucketed_demo_has_no_spike_and_bucket_explained_jumpiness(bucketed_audit):
    f = bucketed_audit["findings"]
    assert loss_spikes(f) == []
    assert f["oscillation"]["bucket_variance_share"] > 0.5
    assert f["plan"]["static"] is False


def test_summary_names_the_spikes_and_the_static_plan(demo_small, tmp_path, capsys):
    code, out, _ = audit([str(demo_small / "static"), "--json", str(tmp_path / "f.json"), "--no-html"], capsys)
    assert code == 0
    verdict = next(line for line in out.splitlines() if line.startswith("verdict"))
    assert "254" in verdict and "258" in verdict and "built once" in verdict and "came back" in verdict
    assert "C1 batch" in out and "C2 batch" in out and "bucket 5" in out


def test_metrics_alone_still_find_spikes_and_say_what_needs_a_plan(demo_small, tmp_path, capsys):
    code, out, _ = audit(
        ["--metrics", str(demo_small / "static" / "metrics.jsonl"), "--json", str(tmp_path / "f.json")], capsys
    )
    assert code == 0
    f = json.loads((tmp_path / "f.json").read_text())
    steps = {s["step"] for s in loss_spikes(f)}
    assert {254, 258} <= steps
    assert all(s["suspect_samples"] == [] for s in f["spikes"])
    assert f["plan"] is None
    assert any("no plan given" in w for w in f["warnings"])
    assert "no plan" in out


@pytest.mark.parametrize("kind,expected", [("spike", 1), ("static-plan", 1), ("nonfinite", 0), ("oscillation", 0)])
def test_fail_on_exit_codes_on_static_demo(demo_small, tmp_path, capsys, kind, expected):
    code, _, err = audit(
        [str(demo_small / "static"), "--json", str(tmp_path / "f.json"), "--no-html", "--fail-on", kind], capsys
    )
    assert code == expected, err


def test_fail_on_spike_passes_on_bucketed_demo(demo_small, tmp_path, capsys):
    code, _, _ = audit(
        [
            str(demo_small / "bucketed"),
            "--json",
            str(tmp_path / "f.json"),
            "--no-html",
            "--fail-on",
            "spike,static-plan",
        ],
        capsys,
    )
    assert code == 0


def test_nonfinite_values_are_reported_not_fatal(demo_small, tmp_path, capsys):
    case = tmp_path / "case"
    shutil.copytree(demo_small / "static", case, ignore=shutil.ignore_patterns("wandb"))
    m = pd.read_parquet(case / "metrics.parquet")
    m.loc[m["step"] == 2000, "train/loss"] = np.nan
    m.loc[m["step"] == 2001, "grad_norm"] = np.inf
    # written with pyarrow so the NaN stays a NaN (pandas would store it as null, i.e. "never logged")
    pq.write_table(pa.table({c: pa.array(m[c].to_numpy()) for c in m.columns}), case / "metrics.parquet")
    code, out, _ = audit([str(case), "--no-html", "--fail-on", "nonfinite"], capsys)
    assert code == 1
    f = json.loads((case / "findings.json").read_text())
    got = {(x["step"], x["metric"]) for x in f["nonfinite"]}
    assert got == {(2000, "train/loss"), (2001, "grad_norm")}
    assert "train/loss is NaN/inf at 1 step (2000)" in out and "grad_norm is NaN/inf at 1 step (2001)" in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (["/nonexistent/case"], "does not exist"),
        (["--fail-on", "explosion", "--metrics", "x.jsonl"], "--fail-on"),
        ([], "give a case folder"),
    ],
)
def test_bad_input_is_exit_2_with_one_line(args, needle, capsys):
    code, _, err = audit(args, capsys)
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_audit_does_not_modify_its_inputs(demo_small, tmp_path, capsys):
    case = tmp_path / "case"
    shutil.copytree(demo_small / "bucketed", case, ignore=shutil.ignore_patterns("wandb"))
    before = {p.name: p.read_bytes() for p in case.iterdir() if p.is_file()}
    audit([str(case), "--no-html"], capsys)
    after = {p.name: p.read_bytes() for p in case.iterdir() if p.is_file() and p.name in before}
    assert before == after


def test_missing_cells_are_not_nonfinite_but_logged_nan_is(tmp_path, capsys):
    """An eval metric logged every 10th step leaves gaps, not NaNs; a logged NaN survives ingest and is reported."""
    rng = np.random.default_rng(0)
    lines = []
    for step in range(600):
        rec = {"step": step, "loss": float(2.0 * np.exp(-step / 300) + 0.5 + 0.02 * rng.standard_normal())}
        if step % 10 == 0:
            rec["val/loss"] = 1.0
        lines.append(json.dumps(rec))
    lines[300] = '{"step": 300, "loss": NaN}'
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["ingest", str(tmp_path / "m.jsonl"), "-o", str(tmp_path / "m.parquet")]) == 0
    capsys.readouterr()
    for src in ("m.jsonl", "m.parquet"):
        code, _, err = audit(["--metrics", str(tmp_path / src), "--json", str(tmp_path / "f.json")], capsys)
        assert code == 0, err
        f = json.loads((tmp_path / "f.json").read_text())
        assert [(x["step"], x["metric"]) for x in f["nonfinite"]] == [(300, "loss")], src
        assert f["spikes"] == []
