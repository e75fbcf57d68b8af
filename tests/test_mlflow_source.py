"""MLflow runs as metrics sources: a run written by the real ``mlflow`` client into a file store under tmp."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from forensics.errors import ForensicsError
from forensics.pipeline.audit import run_audit
from forensics.schema import open_case
from forensics.sources import open_reader

mlflow = pytest.importorskip("mlflow")


def _rows(n: int = 120) -> list[dict]:
    rng = np.random.default_rng(7)
    rows = [
        {
            "step": s,
            "loss": round(3.0 - s / 200 + float(rng.normal(0, 0.01)), 6),
            "grad_norm": round(1.0 + float(rng.normal(0, 0.05)), 6),
        }
        for s in range(n)
    ]
    if n > 60:
        rows[60]["loss"] = 9.0
    return rows


def _log(store: Path, batches: list[list[dict]]) -> str:
    """One MLflow run holding every batch of rows in order (a later batch = a resume into the same run)."""
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
    run_id = client.create_run("0").info.run_id
    t = 1_700_000_000_000
    for rows in batches:
        for r in rows:
            t += 1
            client.log_batch(
                run_id, metrics=[mlflow.entities.Metric(k, v, t, r["step"]) for k, v in r.items() if k != "step"]
            )
    client.set_terminated(run_id)
    return run_id


def _tree(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("ml") / "mlruns"
    return root, _log(root, [_rows()])


def test_mlruns_folder_audits_like_its_jsonl_twin(store, tmp_path):
    root, run_id = store
    before = _tree(root)
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    a = run_audit(open_case(None, overrides={"metrics": [str(root)]})).findings
    b = run_audit(open_case(None, overrides={"metrics": [str(tmp_path / "m.jsonl")]})).findings
    assert _tree(root) == before  # reading writes nothing

    def story(f):
        return [(x["kind"], x["step"], x["severity"]) for x in f["findings"]], f["run"]["loss_key"], f["run"]["steps"]

    assert story(a) == story(b)
    assert [(x["kind"], x["step"]) for x in a["findings"] if x["kind"] == "spike"] == [("spike", 60)]


def test_run_id_with_tracking_uri_and_run_folder(store):
    root, run_id = store
    reader = open_reader(f"mlflow:{run_id}", tracking_uri=str(root))
    table = reader.read_all()
    assert (len(table), list(table.columns)) == (120, ["step", "grad_norm", "loss"])
    assert reader.report.metadata["run_id"] == run_id
    folder = open_reader(root / "0" / run_id).read_all()
    assert folder["loss"].tolist() == table["loss"].tolist()


def test_resume_into_the_same_run_is_a_restart(tmp_path):
    root = tmp_path / "mlruns"
    rows = _rows()
    _log(root, [rows[:100], rows[80:]])
    found = run_audit(open_case(None, overrides={"metrics": [str(root)]})).findings
    assert [
        (f["details"]["last_step"], f["details"]["resumed_at"]) for f in found["findings"] if f["kind"] == "restart"
    ] == [(99, 80)]


@pytest.mark.parametrize(
    "source, env, message",
    [
        ("mlflow:abc", None, "no tracking URI; set MLFLOW_TRACKING_URI or give --mlflow-uri"),
        ("mlflow:", "x", "names no run"),
        ("mlflow:0123456789abcdef", "STORE", "MLflow run 0123456789abcdef at file://"),
    ],
)
def test_bad_mlflow_sources(store, monkeypatch, source, env, message):
    root, _ = store
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    if env:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", str(root) if env == "STORE" else env)
    with pytest.raises(ForensicsError, match=message):
        open_reader(source).read_all()


def test_store_with_two_runs_asks_for_one(tmp_path):
    root = tmp_path / "mlruns"
    _log(root, [_rows(5)])
    _log(root, [_rows(5)])
    with pytest.raises(ForensicsError, match="holds 2 runs"):
        open_reader(root)


def test_audit_cli_reads_a_run_id_with_mlflow_uri(store, tmp_path):
    import subprocess
    import sys

    root, run_id = store
    out = tmp_path / "f.json"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "audit",
            "--metrics",
            f"mlflow:{run_id}",
            "--mlflow-uri",
            str(root),
            "--json",
            str(out),
            "--no-html",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    found = json.loads(out.read_text())
    assert (found["run"]["loss_key"], [f["step"] for f in found["findings"] if f["kind"] == "spike"]) == ("loss", [60])
    bad = subprocess.run(
        [sys.executable, "-m", "forensics", "audit", "--metrics", f"mlflow:{run_id}", "--no-html", "--json", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert (bad.returncode, bad.stderr.strip().splitlines()[-1].split(";")[0]) == (
        2,
        f"forensics: error: MLflow source 'mlflow:{run_id}': no tracking URI",
    )


def test_the_live_loop_reads_an_mlflow_run_id(store, monkeypatch):
    from forensics.live import LiveRun, resolve_target

    root, run_id = store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", root.as_uri())
    run = LiveRun(resolve_target([f"mlflow:{run_id}"], command="watch")).start()
    assert len(run.metrics) == 120 and run.loss_key == "loss"
    assert [(f["kind"], f["step"]) for f in run.findings["findings"] if f["kind"] == "spike"] == [("spike", 60)]
