"""Every command that reads an input, given each input damaged: one line naming the file, exit 2, nothing written.

The table is commands x the inputs each reads x four kinds of damage. The inputs come from the real demo builder
(the small static case, audited once so that ``findings.json`` exists); the damage is applied to a copy. A truncated
JSONL or CSV metrics file is left out on purpose: a half-written last line is what a live run leaves, data the
readers keep (docs/concepts.md, bad input vs data quirks), not bad input.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.cli import main

DAMAGES = ("truncated", "emptied", "random", "wrong_schema")

#: What each input of a case is called in the table, and the file it lives in.
FILES = {
    "metrics.parquet": "metrics.parquet",
    "metrics.jsonl": "metrics.jsonl",
    "metrics.csv": "metrics.csv",
    "plan": "plan.parquet",
    "samples": "samples.parquet",
    "run.toml": "run.toml",
    "findings.json": "findings.json",
    "replay.json": "replay/replay.json",
}

#: command -> (argv with CASE / OTHER / OUT placeholders, the inputs it reads).
COMMANDS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "audit": (
        ["audit", "CASE"],
        ("metrics.parquet", "metrics.jsonl", "metrics.csv", "plan", "samples", "run.toml", "replay.json"),
    ),
    "check-plan": (["check-plan", "CASE"], ("plan", "samples", "run.toml")),
    "check-plan --plan": (["check-plan", "--plan", "CASE/plan.parquet"], ("plan",)),
    "tag": (["tag", "CASE", "-o", "OUT/tags.parquet"], ("plan", "samples", "run.toml")),
    "buckets": (["buckets", "CASE", "--json", "OUT/buckets.json"], ("samples", "run.toml")),
    "whatif": (["whatif", "CASE", "--json", "OUT/whatif.json"], ("samples", "run.toml")),
    "compare": (
        ["compare", "CASE", "OTHER", "--json", "OUT/compare.json"],
        ("metrics.parquet", "metrics.jsonl", "metrics.csv", "plan", "run.toml"),
    ),
    "skip": (["skip", "CASE", "--format", "ids", "-o", "OUT/skip.json"], ("findings.json",)),
    "ingest": (
        ["ingest", "CASE/METRICS", "-o", "OUT/metrics.parquet"],
        ("metrics.parquet", "metrics.jsonl", "metrics.csv"),
    ),
    "validate": (
        ["validate", "CASE"],
        ("metrics.parquet", "metrics.jsonl", "metrics.csv", "plan", "samples", "run.toml"),
    ),
    "replay": (["replay", "CASE", "--steps", "40"], ("plan", "samples", "run.toml", "findings.json", "replay.json")),
    # the live loop the dashboard shares; it exits at its first cause when the inputs load (so a miss cannot hang)
    "watch": (
        ["watch", "CASE", "--interval", "0.2", "--exit-on", "info", "--quiet-period", "0"],
        ("metrics.parquet", "plan", "samples", "run.toml"),
    ),
}

#: A truncated text metrics file is data (a half-written last line), not bad input.
KEPT = {("metrics.jsonl", "truncated"), ("metrics.csv", "truncated")}

#: How a line says what was expected of the file.
EXPECTED = re.compile(r"expected|must be|needs")

CASES = [
    (command, what, damage)
    for command, (_, inputs) in COMMANDS.items()
    for what in inputs
    for damage in DAMAGES
    if (what, damage) not in KEPT
]


@pytest.fixture(scope="module")
def base_case(demo_small: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small static demo case, audited once (``findings.json``), with a ``replay/replay.json`` and its metrics
    also as JSONL and CSV (one column per metric, as a logger writes them)."""
    out = tmp_path_factory.mktemp("damaged-base") / "case"
    src = demo_small / "static"
    out.mkdir()
    for name in ("metrics.parquet", "plan.parquet", "samples.parquet", "run.toml"):
        shutil.copy(src / name, out / name)
    (out / "replay-model").symlink_to(src / "replay-model")
    metrics = pd.read_parquet(out / "metrics.parquet")
    metrics.to_json(out / "metrics.jsonl", orient="records", lines=True)
    metrics.to_csv(out / "metrics.csv", index=False)
    assert main(["audit", str(out)]) == 0
    (out / "report.html").unlink()
    (out / "replay").mkdir()
    (out / "replay/replay.json").write_text(
        json.dumps({"steps": [{"step": 40, "mode": "eval", "verdict": "normal", "logged": 1.0, "replayed": 1.0}]})
    )
    return out


def _wrong_schema(what: str, path: Path) -> None:
    """A well-formed file of the input's format that holds none of the fields the input needs."""
    if path.suffix == ".parquet":
        pd.DataFrame({"colour": ["red", "green"], "weight": [1.5, 2.5]}).to_parquet(path)
    elif path.suffix == ".jsonl":
        path.write_text('{"colour": "red"}\n{"colour": "green"}\n')
    elif path.suffix == ".csv":
        path.write_text("colour,shade\nred,dark\ngreen,light\n")
    elif path.suffix == ".toml":
        path.write_text('grad_accum = "many"\nboundaries = "wide"\n')
    else:  # findings.json, replay.json: JSON, but a list where an object is expected
        path.write_text("[1, 2, 3]\n")


def _damage(path: Path, what: str, damage: str) -> None:
    data = path.read_bytes() if path.exists() else b""
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "emptied":
        path.write_bytes(b"")
    elif damage == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    else:
        _wrong_schema(what, path)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and "replay-model" not in p.parts
    }


def _point_metrics_at(case: Path, name: str) -> None:
    """Make the case's run.toml name ``name`` as its only metrics source."""
    toml = case / "run.toml"
    lines = [
        f'metrics = ["{name}"]' if line.startswith("metrics =") else line for line in toml.read_text().splitlines()
    ]
    toml.write_text("\n".join(lines) + "\n")


# an exception a library could only print (pyarrow's row handler) is a traceback on the user's terminal too
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(("command", "what", "damage"), CASES, ids=[" ".join(c) for c in CASES])
def test_damaged_input_is_one_line_and_exit_2(
    command: str, what: str, damage: str, base_case: Path, demo_small: Path, tmp_path: Path, capsys
) -> None:
    case = tmp_path / "case"
    shutil.copytree(base_case, case, symlinks=True)
    out = tmp_path / "out"
    out.mkdir()
    if what.startswith("metrics."):
        _point_metrics_at(case, what)
    target = case / FILES[what]
    target.parent.mkdir(exist_ok=True)
    _damage(target, what, damage)
    argv = [
        a.replace("CASE", str(case))
        .replace("OTHER", str(demo_small / "bucketed"))
        .replace("OUT", str(out))
        .replace("METRICS", what)
        for a in COMMANDS[command][0]
    ]
    before = _snapshot(tmp_path)
    capsys.readouterr()

    code = main(argv)

    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert FILES[what].split("/")[-1] in lines[0], err
    assert EXPECTED.search(lines[0]), err
    assert _snapshot(tmp_path) == before


def test_table_counts_its_cases() -> None:
    """The table covers every command and input named above, each with every damage it can take."""
    assert len(CASES) == 160
    assert {c for c, _, _ in CASES} == set(COMMANDS)
