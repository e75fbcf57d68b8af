"""Careless inputs a new user gives: every bad input is one line and exit 2, every data quirk is counted and kept,
outputs are where the command says, and no command modifies its inputs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main
from forensics.schema import metric_values, written


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_exit_2(argv, capsys, *needles: str) -> str:
    code, _, err = _run(argv, capsys)
    lines = [x for x in err.splitlines() if x.startswith("forensics: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def test_a_non_numeric_cell_is_a_missing_value_counted_with_its_line_and_column(tmp_path, capsys):
    csv = tmp_path / "m.csv"
    csv.write_text("step,loss,acc\n0,1.0,0.5\n1,oops,0.6\n2,0.9,0.7\n3,0.8,n/a\n")
    code, out, err = _run(["ingest", csv, "-o", tmp_path / "m.parquet"], capsys)
    assert code == 0
    assert "column 'loss': 1 cell not a number, kept as missing (line 3: 'oops')" in err
    assert "column 'acc': 1 cell not a number, kept as missing (line 5: 'n/a')" in err
    table = pd.read_parquet(tmp_path / "m.parquet", dtype_backend="pyarrow")
    assert written(table, "loss").tolist() == [True, False, True, True]
    assert metric_values(table, "loss")[[0, 2, 3]].tolist() == [1.0, 0.9, 0.8]
    _one_line_exit_2(
        ["ingest", csv, "-o", tmp_path / "s.parquet", "--strict"],
        capsys,
        "column 'loss' has a cell that is not a number",
        "line 3: 'oops'",
        "strict",
    )


def test_a_field_with_no_numeric_value_is_not_a_metric(tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    log.write_text("".join(json.dumps({"step": i, "loss": 1.0 - i / 100, "phase": "warmup"}) + "\n" for i in range(5)))
    code, out, err = _run(["ingest", log, "-o", tmp_path / "m.parquet"], capsys)
    assert code == 0 and "column 'phase' holds no numeric value (e.g. 'warmup'): not a metric" in err
    assert list(pd.read_parquet(tmp_path / "m.parquet").columns) == ["step", "loss"]


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "the file is empty"),
        (bytes(range(256)) * 8, "not text (binary data)"),
    ],
)
def test_a_source_that_yields_no_rows_is_exit_2_with_the_reason(tmp_path, capsys, content, reason):
    f = tmp_path / "m.jsonl"
    f.write_bytes(content)
    _one_line_exit_2(["ingest", f, "-o", tmp_path / "m.parquet"], capsys, "yields no rows", reason)
    assert not (tmp_path / "m.parquet").exists()


def test_a_text_log_matching_no_pattern_names_its_first_line_and_the_pattern_flag(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("epoch one starting\nbatch=12 objective=3.3\n")
    _one_line_exit_2(
        ["audit", "--metrics", log, "--no-html", "--json", tmp_path / "f.json"],
        capsys,
        "yields no rows",
        "the first line, 1, reads 'epoch one starting'",
        "--pattern",
    )
    code, out, _ = _run(
        ["ingest", log, "-o", tmp_path / "m.parquet", "--pattern", r"batch=(?P<step>\d+) objective=(?P<loss>[\d.]+)"],
        capsys,
    )
    assert code == 0 and "1 row, steps 12-12" in out


def test_validate_without_a_case_says_there_is_none(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_exit_2(["validate"], capsys, "no case in", "run.toml")


@pytest.mark.parametrize(
    "argv_tail, names",
    [
        (["tag", "{case}", "-o", "{tmp}/t.csv"], ".parquet"),
        (["audit", "{case}", "--json", "{tmp}/f.txt", "--no-html"], ".json"),
        (["audit", "{case}", "--html", "{tmp}/r.json", "--json", "{tmp}/f.json"], ".html"),
        (["check-plan", "{case}", "--junit", "{tmp}/j.json"], ".xml"),
        (["buckets", "{case}", "--json", "{tmp}/b.csv"], ".json"),
    ],
)
def test_an_output_suffix_the_command_does_not_write_is_exit_2(demo_small, tmp_path, capsys, argv_tail, names):
    argv = [a.format(case=demo_small / "static", tmp=tmp_path) for a in argv_tail]
    _one_line_exit_2(argv, capsys, names)
    assert list(tmp_path.iterdir()) == []


def test_documented_input_forms_work_a_case_folder_and_the_wandb_run_folder_inside_it(tmp_path, capsys):
    case = tmp_path / "case"
    case.mkdir()
    rng = np.random.default_rng(0)
    pd.DataFrame({"step": np.arange(300), "train/loss": 2 + 0.01 * rng.standard_normal(300)}).to_parquet(
        case / "metrics.parquet"
    )
    code, out, err = _run(["ingest", case, "-o", tmp_path / "m.parquet"], capsys)
    assert code == 0 and "300 rows, steps 0-299" in out and out.count("warning") == 0
    pytest.importorskip("wandb")
    from forensics.datasets.wandb_writer import write_wandb_run

    metrics = pd.read_parquet(case / "metrics.parquet")
    write_wandb_run(case, metrics.iloc[:120], {"lr": 1e-3}, "careless")
    code, out, err = _run(["audit", case / "wandb", "--no-html", "--json", tmp_path / "f.json"], capsys)
    findings = json.loads((tmp_path / "f.json").read_text())
    assert code == 0 and findings["run"]["steps"] == 120 and findings["run"]["sources"][0]["format"] == "wandb"


def test_bad_tables_and_flags_are_one_line_exit_2(demo_small, tmp_path, capsys):
    static = demo_small / "static"
    samples = pd.read_parquet(static / "samples.parquet")
    plan = pd.read_parquet(static / "plan.parquet")
    (tmp_path / "empty_dir").mkdir()
    plan.drop(columns=["sample_id"]).to_parquet(tmp_path / "no_ids.parquet")
    plan.assign(sample_id=plan["sample_id"] + 10**9).to_parquet(tmp_path / "strangers.parquet")
    base = [
        "audit",
        "--metrics",
        static / "metrics.parquet",
        "--samples",
        static / "samples.parquet",
        "--no-html",
        "--json",
        tmp_path / "f.json",
    ]
    _one_line_exit_2([*base, "--plan", tmp_path / "empty_dir"], capsys, "holds no .parquet parts")
    _one_line_exit_2([*base, "--plan", tmp_path / "no_ids.parquet"], capsys, "missing column 'sample_id'")
    _one_line_exit_2([*base, "--plan", tmp_path / "strangers.parquet"], capsys, "not in the samples table")
    _one_line_exit_2(["audit", static, "--fail-on", "spikes"], capsys, "--fail-on: unknown kind spikes")
    _one_line_exit_2(["audit", static, "--grad-accum", "0"], capsys, "--grad-accum: must be a positive integer")
    assert len(samples)


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_no_command_modifies_its_inputs(demo_small, tmp_path, capsys):
    case = tmp_path / "static"
    shutil.copytree(demo_small / "static", case, symlinks=True)
    out = tmp_path / "out"
    out.mkdir()
    before = _hashes(case)
    commands = [  # each with the exit code it owes (the static plan fails the gate)
        (["validate", case], 0),
        (["ingest", case, "-o", out / "m.parquet"], 0),
        (["tag", case, "-o", out / "t.parquet", "--samples-out", out / "s.parquet"], 0),
        (["buckets", case, "--json", out / "b.json"], 0),
        (["whatif", case, "--json", out / "w.json"], 0),
        (["check-plan", case, "--json", out / "c.json"], 1),
        (["audit", case, "--json", out / "f.json", "--html", out / "r.html"], 0),
    ]
    for argv, expected in commands:
        code, _, err = _run(argv, capsys)
        assert code == expected, (argv, err)
    assert _hashes(case) == before


def test_ci_logs_show_a_line_per_stage_on_stderr(demo_small, tmp_path):
    env = {**os.environ, "CI": "true", "TERM": "dumb", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "forensics",
            "audit",
            str(demo_small / "static"),
            "--json",
            str(tmp_path / "f.json"),
            "--html",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    stages = [line for line in proc.stderr.splitlines() if line.rstrip().endswith(" s") and ": " in line]
    for name in (
        "reading metrics",
        "loading the plan",
        "tagging steps",
        "checking batch composition",
        "rules",
        "writing the report",
    ):
        assert any(line.startswith(name) for line in stages), (name, proc.stderr)
    assert "\x1b[" not in proc.stderr and proc.stderr.strip().count("\n\n") == 0


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_full_disk_under_the_report_is_one_line_exit_2_not_a_clean_exit(demo_small, tmp_path):
    """The console script exits fast (os._exit after the exit handlers): an output the OS refused must still fail."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "forensics",
                "audit",
                str(demo_small / "static"),
                "--json",
                str(tmp_path / "f.json"),
                "--no-html",
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("forensics: error")]
    assert proc.returncode == 2, proc.stderr
    assert errors == ["forensics: error: No space left on device (output)"], proc.stderr
    assert "Traceback" not in proc.stderr
