"""Every engine gives the same numbers: tags, the gate's result and the suspects' lookups, exactly, on a seeded plan
(flat recorder folder, hive folder, in memory) and on the demo cases; ``auto`` picks by the plan's Arrow size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fixtures.scale_plan import BOUNDARIES, synthetic_samples, write_plan
from forensics.engine import choose_engine, get_engine, parse_size
from forensics.errors import ForensicsError
from forensics.plan.gate import check_case
from forensics.plan.gate.check import check_plan
from forensics.schema import load_plan, open_case
from forensics.tagging import tag_case_folder
from forensics.tagging.step_tags import tag_steps

ENGINES = ["pandas", "duckdb", "dask"]
LAYOUTS = ["flat", "hive", "memory"]


@pytest.fixture
def make_engine(request):
    """``make_engine(name)``: the engine, the Dask one on the module's cluster."""

    def make(name: str):
        if name == "dask":
            from forensics.engine.dask_engine import DaskEngine

            return DaskEngine(client=request.getfixturevalue("dask_client"))
        return get_engine(name, memory_limit="1GB")

    return make


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A seeded 3-epoch plan of 4000 samples on 8 ranks, written in both layouts, and today's pandas answers."""
    root = tmp_path_factory.mktemp("engines")
    samples = synthetic_samples(4000, seed=3)
    write_plan(samples, root / "flat", 3, "flat", seed=3)
    write_plan(samples, root / "hive", 3, "hive", seed=3)
    plan = load_plan(root / "flat")
    return {
        "root": root,
        "samples": samples,
        "plan": plan,
        "tags": tag_steps(plan, samples, BOUNDARIES),
        "gate": check_plan(plan, samples).to_json(),
    }


def _source(seeded: dict, layout: str):
    return seeded["plan"] if layout == "memory" else seeded["root"] / layout


#: Every engine on every layout; Dask (the slowest to start a computation) on the hive folder, its own reader's case.
TABLE = [(e, lay) for e in ("pandas", "duckdb") for lay in LAYOUTS] + [("dask", "hive")]


@pytest.mark.parametrize(("engine", "layout"), TABLE)
def test_same_tags_gate_and_lookups(seeded: dict, engine: str, layout: str, make_engine) -> None:
    eng = make_engine(engine)
    try:
        src = _source(seeded, layout)
        pd.testing.assert_frame_equal(
            tag_steps(src, seeded["samples"], BOUNDARIES, engine=eng), seeded["tags"], check_exact=True
        )
        assert check_plan(src, seeded["samples"], engine=eng).to_json() == seeded["gate"]
        assert (
            check_plan(src, None, engine=eng, epochs=2).to_json()
            == check_plan(seeded["plan"], None, epochs=2).to_json()
        )
        got = eng.steps_holding(src, [7, 11, 3999])
        plan = seeded["plan"]
        want = plan.loc[plan["sample_id"].isin([7, 11, 3999]), ["step", "sample_id"]].sort_values(
            ["step", "sample_id"], ignore_index=True
        )
        pd.testing.assert_frame_equal(got, want.astype(np.int64))
        assert len(got) == 9  # each of the 3 samples once per epoch
    finally:
        eng.close()


@pytest.mark.parametrize(("engine", "layout"), TABLE)
def test_rows_of_flagged_steps_keep_the_plans_order(seeded: dict, engine: str, layout: str, make_engine) -> None:
    """The rows of a few flagged steps (a spike's span, a report card's batch): as the plan reads whole, same rows,
    same order, every column."""
    src = _source(seeded, layout)
    plan = seeded["plan"] if layout == "memory" else load_plan(src)
    steps = [3, 4, int(plan["step"].max())]
    eng = make_engine(engine)
    try:
        got = eng.rows_at_steps(src, steps)
        pd.testing.assert_frame_equal(got, plan[plan["step"].isin(steps)].reset_index(drop=True), check_dtype=False)
        assert set(got["step"]) == set(steps) and got["rank"].nunique() > 1  # every rank's rows of those steps
    finally:
        eng.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_plan_without_steps_cannot_be_read_step_by_step(
    seeded: dict, engine: str, make_engine, tmp_path: Path
) -> None:
    path = tmp_path / "batches.parquet"
    seeded["plan"][["epoch", "batch_id", "sample_id"]].to_parquet(path, index=False)
    eng = make_engine(engine)
    try:
        for read in (lambda: eng.rows_at_steps(path, [10]), lambda: list(eng.plan_chunks(path, ["step"], 10))):
            with pytest.raises(ForensicsError, match=r"^plan: needs a 'step' column to be read step by step"):
                read()
    finally:
        eng.close()


@pytest.fixture(scope="module")
def plan_ahead(demo_small: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's static case with its metrics cut at step 1200 of 3504: the plan runs ahead of them, and the spike
    batches of steps 254 and 258 come back after the metrics end (where only the plan knows them)."""
    import shutil

    case = tmp_path_factory.mktemp("plan-ahead") / "static"
    shutil.copytree(demo_small / "static", case, ignore=shutil.ignore_patterns("wandb"))
    metrics = pd.read_parquet(case / "metrics.parquet")
    metrics[metrics["step"] <= 1200].to_parquet(case / "metrics.parquet", index=False)
    return case


def test_the_audit_gives_the_same_findings_on_every_engine(plan_ahead: Path, tmp_path: Path) -> None:
    """``forensics audit --engine E``: DuckDB and Dask read the plan where it lies (the logged steps, and the later
    steps a spike batch comes back at) and give the findings pandas gives with the whole plan loaded."""
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).parents[1]))}
    found = {}
    for engine in ENGINES:
        out = tmp_path / f"{engine}.json"
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "forensics",
                "audit",
                str(plan_ahead),
                "--engine",
                engine,
                "--memory-limit",
                "2GB",
                "--json",
                str(out),
                "--no-html",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        found[engine] = json.loads(out.read_text())
    ref = found["pandas"]
    assert ref["recurrence"]["spikes"][0]["peak_step"] == 254
    returns = [r["step"] for r in ref["recurrence"]["spikes"][0]["recurrences"]]
    assert max(returns) > 1200  # a return only the plan knows: past the metrics' last step
    assert any("ahead of the metrics" in w for w in ref["warnings"])
    assert found["duckdb"] == ref
    assert found["dask"] == ref


def test_the_seeded_gate_passes_with_these_figures(seeded: dict) -> None:
    g = seeded["gate"]
    assert g["passed"] is True
    assert len(g["pair_retention"]) == 2
    assert [c["duplicated"] for c in g["coverage"]] == [0, 0, 0]
    assert [c["missing"] for c in g["coverage"]] == [0, 0, 0]


@pytest.mark.parametrize("engine", ["duckdb"])
@pytest.mark.parametrize("case", ["static", "bucketed"])
def test_demo_cases_give_the_same_verdict_and_tags(demo_small: Path, engine: str, case: str) -> None:
    ref = open_case(demo_small / case, sets=["engine=pandas"])
    other = open_case(demo_small / case, sets=[f"engine={engine}"])
    assert check_case(other).to_json() == check_case(ref).to_json()
    pd.testing.assert_frame_equal(tag_case_folder(other).tags, tag_case_folder(ref).tags, check_exact=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_unknown_samples_are_bad_input_in_every_engine(seeded: dict, engine: str, make_engine) -> None:
    eng = make_engine(engine)
    few = seeded["samples"].iloc[100:]
    try:
        with pytest.raises(
            ForensicsError,
            match=r"^plan: 100 sample_id values are not in the samples table, e\.g\. "
            r"0, 1, 2, 3, 4$",
        ):
            check_plan(seeded["root"] / "flat", few, engine=eng)
        with pytest.raises(ForensicsError, match=r"^plan: 300 rows name samples not in the samples table"):
            tag_steps(seeded["root"] / "hive", few, BOUNDARIES, engine=eng)
    finally:
        eng.close()


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GB", 4 * 10**9),
        ("512MB", 512 * 10**6),
        ("2GiB", 2 * 2**30),
        ("1.5g", 1_500_000_000),
        (1024, 1024),
        ("100", 100),
        (None, None),
    ],
)
def test_sizes(text, size) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["four GB", "4XB", "-1GB"])
def test_bad_sizes(text) -> None:
    with pytest.raises(ForensicsError, match="is not a size"):
        parse_size(text)


def test_auto_is_pandas_under_a_quarter_of_the_limit(seeded: dict) -> None:
    flat = seeded["root"] / "flat"
    rows, cols = 12_000, 6  # the seeded plan: 4000 samples x 3 epochs, 6 integer columns
    arrow = rows * cols * 8
    assert choose_engine("auto", flat, 4 * arrow + 1) == "pandas"
    assert choose_engine("auto", flat, 4 * arrow) == "duckdb"
    assert choose_engine("auto", seeded["plan"], 1) == "pandas"  # already in memory
    assert choose_engine("duckdb", flat, 10**12) == "duckdb"
    with pytest.raises(ForensicsError, match="--engine must be one of"):
        choose_engine("spark", flat)


@pytest.mark.parametrize("case", ["static"])
def test_demo_cases_on_dask(demo_small: Path, case: str, make_engine) -> None:
    from forensics.schema import load_samples

    folder = demo_small / case
    plan, samples = folder / "plan.parquet", load_samples(folder / "samples.parquet")
    eng = make_engine("dask")
    ref = check_plan(load_plan(plan), samples).to_json()
    assert check_plan(plan, samples, engine=eng).to_json() == {**ref}
    pd.testing.assert_frame_equal(
        tag_steps(plan, samples, BOUNDARIES, engine=eng),
        tag_steps(load_plan(plan), samples, BOUNDARIES),
        check_exact=True,
    )


def test_dask_without_a_scheduler_there_is_bad_input() -> None:
    pytest.importorskip("distributed")
    from forensics.engine.dask_engine import DaskEngine

    with pytest.raises(ForensicsError, match=r"^--scheduler tcp://127\.0\.0\.1:9: no Dask scheduler answers there"):
        DaskEngine("tcp://127.0.0.1:9", connect_timeout="1s")


def test_cli_check_plan_on_a_hive_folder(seeded: dict, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).parents[1]))}
    samples = tmp_path / "samples.parquet"
    seeded["samples"].to_parquet(samples)
    out = {}
    for layout, engine in [("hive", "duckdb"), ("flat", "pandas")]:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "forensics",
                "check-plan",
                "--plan",
                str(seeded["root"] / layout),
                "--samples",
                str(samples),
                "--engine",
                engine,
                "--memory-limit",
                "1GB",
                "--json",
                str(tmp_path / f"{layout}.json"),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        out[layout] = {k: v for k, v in json.loads((tmp_path / f"{layout}.json").read_text()).items() if k != "source"}
    assert out["hive"] == out["flat"]


def test_a_four_rank_recording_reads_the_same_in_every_engine(tmp_path: Path, make_engine) -> None:
    """Four ranks record their own batch streams with the real recorder (several parts each); every engine reads
    the folder back to the same tags and gate result as the rows that were recorded."""
    from fixtures.scale_plan import epochs
    from forensics.plan.recorder import PlanRecorder

    samples = synthetic_samples(1000, seed=5)
    folder = tmp_path / "plan"
    recorders = [PlanRecorder(folder, rank=r, flush_every=12) for r in range(4)]
    recorded = []
    for rows in epochs(samples, 2, seed=5, world_size=4, grad_accum=2):
        frame = pd.DataFrame(rows)
        for (rank, batch), g in frame.groupby(["rank", "batch_id"], sort=True):
            step, micro, epoch = (int(g[c].iloc[0]) for c in ("step", "micro", "epoch"))
            recorders[rank].record(g["sample_id"].to_numpy(), epoch=epoch, batch_id=int(batch), step=step, micro=micro)
        recorded.append(frame)
    for rec in recorders:
        rec.close()
    assert len(list(folder.glob("part-r*.parquet"))) > 8
    truth = pd.concat(recorded, ignore_index=True)
    want_tags = tag_steps(truth, samples, BOUNDARIES)
    want_gate = check_plan(truth, samples).to_json()
    for name in ENGINES:
        eng = make_engine(name)
        try:
            pd.testing.assert_frame_equal(
                tag_steps(folder, samples, BOUNDARIES, engine=eng), want_tags, check_exact=True
            )
            assert check_plan(folder, samples, engine=eng).to_json() == want_gate, name
        finally:
            eng.close()


def test_the_readmes_slurm_cluster_builds_its_job_script() -> None:
    """docs/scale.md's Slurm example, as written there, builds a cluster whose job script asks Slurm for what it says
    (no job is submitted: the cluster is never scaled)."""
    jobqueue = pytest.importorskip("dask_jobqueue")
    cluster = jobqueue.SLURMCluster(
        cores=8,
        processes=2,
        memory="64GB",
        walltime="02:00:00",
        queue="cpu",
        scheduler_options={"dashboard_address": None},
    )
    try:
        script = cluster.job_script()
        assert "#SBATCH -p cpu" in script
        assert "#SBATCH --cpus-per-task=8" in script
        assert "#SBATCH -t 02:00:00" in script
        assert "--nworkers 2" in script
        assert cluster.scheduler_address.startswith("tcp://")
    finally:
        cluster.close()
    page = (Path(__file__).parents[1] / "docs" / "scale.md").read_text()
    assert 'SLURMCluster(cores=8, processes=2, memory="64GB", walltime="02:00:00", queue="cpu")' in page


def _die(rows: pd.DataFrame, start: int) -> int:
    """A chunk function whose worker process dies under it (as one killed for its memory does)."""
    os._exit(1)


def test_workers_that_die_are_one_clear_message(tmp_path: Path) -> None:
    """A computation whose Dask workers die (the nanny kills one past its memory limit; here the process exits) is
    bad input with the way out, never a KilledWorker traceback."""
    distributed = pytest.importorskip("distributed")
    import dask

    from forensics.engine.dask_engine import DaskEngine

    samples = tmp_path / "samples.parquet"
    synthetic_samples(100).assign(text="a few words").to_parquet(samples, index=False)
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)
        client = distributed.Client(cluster)
        eng = DaskEngine(client=client)
        try:
            with pytest.raises(
                ForensicsError,
                match=r"^--engine dask: the workers died running map_sample_chunks "
                r"\(out of memory, most often\)",
            ):
                eng.map_sample_chunks(samples, ["text"], _die)
        finally:
            client.close()
            cluster.close()


def test_an_engine_audit_of_a_plan_without_steps_loads_it_whole_and_says_so(plan_ahead: Path, tmp_path: Path) -> None:
    """A plan named by (epoch, batch_id) only is mapped to steps in memory: the engine cannot read it step by step, so
    the audit loads it whole (a warning says why) and gives pandas' findings."""
    import shutil

    case = tmp_path / "case"
    shutil.copytree(plan_ahead, case)
    pd.read_parquet(case / "plan.parquet").drop(columns=["step"]).to_parquet(case / "plan.parquet", index=False)
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).parents[1]))}
    found = {}
    for engine in ("pandas", "duckdb"):
        out = tmp_path / f"{engine}.json"
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "forensics",
                "audit",
                str(case),
                "--engine",
                engine,
                "--json",
                str(out),
                "--no-html",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        found[engine] = json.loads(out.read_text())
    said = [w for w in found["duckdb"]["warnings"] if "loaded whole, not read on duckdb" in w]
    assert len(said) == 1
    found["duckdb"]["warnings"].remove(said[0])
    assert found["duckdb"] == found["pandas"]


@pytest.mark.parametrize(("engine", "layout"), TABLE)
def test_the_rules_view_of_a_plan_reads_the_same_through_every_engine(
    seeded: dict, engine: str, layout: str, make_engine
) -> None:
    """What the rules read of a plan (forensics.detect.plan_view): flagged steps' rows, where given samples were
    trained, the tested family and the logged rows a chunk at a time; through an engine as from the table in memory,
    row for row and in the plan's order."""
    from forensics.detect.plan_view import EnginePlan, FramePlan

    src = _source(seeded, layout)
    plan = seeded["plan"] if layout == "memory" else load_plan(src)
    last = int(plan["step"].max()) // 3
    frame = FramePlan(plan, last_step=last)
    eng = make_engine(engine)
    try:
        view = EnginePlan(eng, src, last, seeded["samples"]["sample_id"].to_numpy())
        steps = [0, 5, last, last + 1]
        pd.testing.assert_frame_equal(view.rows_at(steps), frame.rows_at(steps), check_dtype=False)
        assert set(view.rows_at(steps)["step"]) == set(steps)
        ids = [7, 11, 3999]
        held = view.rows_holding(ids)
        pd.testing.assert_frame_equal(held, frame.rows_holding(ids), check_dtype=False)
        assert len(held) == 9 and set(held["sample_id"]) == set(ids)  # 3 samples, each in 3 epochs
        logged = np.arange(0, last + 1, 2)
        assert view.tested(logged) == frame.tested(logged)
        assert view.tested(logged)[0] == len(logged)
        assert view.n_rows() == frame.n_rows() == int((plan["step"] <= last).sum())
        key = ["step", "sample_id"]
        chunks = pd.concat(list(view.chunks(key))).sort_values(key, ignore_index=True)
        want = plan.loc[plan["step"] <= last, key].sort_values(key, ignore_index=True)
        pd.testing.assert_frame_equal(chunks, want, check_dtype=False)
    finally:
        eng.close()


def test_an_engine_audit_of_a_finished_run_reads_the_plan_a_chunk_at_a_time(
    demo_small: Path, tmp_path: Path, monkeypatch
) -> None:
    """The metrics reach the plan's last step: on DuckDB the rules read the plan in chunks (1,000 rows here, so
    steps span chunks) and hold only a few flagged steps' rows, and the findings are those pandas gives with the
    plan loaded."""
    import contextlib
    import io

    from forensics.cli import main
    from forensics.engine.duckdb_engine import DuckDBEngine

    sizes: list[int] = []
    looked_up: list[int] = []
    chunked, at_steps = DuckDBEngine.plan_chunks, DuckDBEngine.rows_at_steps

    def small_chunks(self, plan, columns, last_step, chunk=1_000):
        for rows in chunked(self, plan, columns, last_step, chunk=1_000):
            sizes.append(len(rows))
            yield rows

    def counted(self, plan, steps):
        rows = at_steps(self, plan, steps)
        looked_up.append(len(rows))
        return rows

    monkeypatch.setattr(DuckDBEngine, "plan_chunks", small_chunks)
    monkeypatch.setattr(DuckDBEngine, "rows_at_steps", counted)
    case = demo_small / "static"
    found = {}
    for engine in ("pandas", "duckdb"):
        out = tmp_path / f"{engine}.json"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main(
                ["audit", str(case), "--engine", engine, "--memory-limit", "2GB", "--json", str(out), "--no-html"]
            )
        assert code == 0
        found[engine] = json.loads(out.read_text())
    n_rows = len(load_plan(case / "plan.parquet"))
    assert sizes and max(sizes) <= 1_000 and sum(sizes) >= n_rows  # every row was read, a chunk at a time
    assert looked_up and sum(looked_up) < 0.05 * n_rows  # and only a few flagged steps' rows were held
    ref = found["pandas"]
    assert ref["recurrence"]["spikes"][0]["peak_step"] == 254 and ref["forgetting"]["n_steps"] > 0
    assert found["duckdb"] == ref


@pytest.mark.parametrize(("rows", "stride"), [(0, 1), (1, 1), (100, 1), (101, 2), (200, 2), (201, 3), (1000, 10)])
def test_the_harmful_samples_estimate_keeps_one_logged_step_in_k_past_its_entries(rows: int, stride: int) -> None:
    from forensics.detect.evidence.sample_effects import membership_stride

    assert membership_stride(rows, max_entries=100) == stride


def test_an_engine_audit_rejects_the_bad_rows_pandas_rejects(plan_ahead: Path, tmp_path: Path) -> None:
    """A plan with negative steps is bad input on every engine: one line, exit 2, the message pandas gives."""
    import shutil

    case = tmp_path / "case"
    shutil.copytree(plan_ahead, case)
    plan = pd.read_parquet(case / "plan.parquet")
    plan.loc[plan.index[:3], "step"] = -1
    plan.to_parquet(case / "plan.parquet", index=False)
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).parents[1]))}
    for engine in ("pandas", "duckdb"):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "forensics",
                "audit",
                str(case),
                "--engine",
                engine,
                "--memory-limit",
                "2GB",
                "--no-html",
                "--json",
                str(tmp_path / "f.json"),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        assert res.returncode == 2, (engine, res.stderr)
        assert "column 'step' must be >= 0" in res.stderr and "Traceback" not in res.stderr, engine


def test_each_question_is_put_to_the_engine_once(seeded: dict, make_engine) -> None:
    """Recurrence, attribution and the enrichment ask the view the same lookups: each reaches the engine once,
    and the answer given again is the same."""
    from forensics.detect.plan_view import EnginePlan

    eng = make_engine("duckdb")
    asked: list[str] = []
    for name in ("rows_at_steps", "steps_holding"):
        real = getattr(eng, name)
        setattr(eng, name, lambda *a, _real=real, _name=name: asked.append(_name) or _real(*a))
    try:
        view = EnginePlan(eng, seeded["root"] / "flat", 100, seeded["samples"]["sample_id"].to_numpy())
        first = view.rows_at([5, 3]), view.rows_holding([7, 11]), view.tested(range(50))
        again = view.rows_at([3, 5, 5]), view.rows_holding([11, 7]), view.tested(range(50))
        assert asked == ["rows_at_steps", "steps_holding"]
        assert first[0] is again[0] and first[1] is again[1] and first[2] == again[2]
        assert view.rows_at([6]) is not first[0] and asked[-1] == "rows_at_steps"
    finally:
        eng.close()


@pytest.mark.parametrize(("size", "longest"), [(1, 7), (3, 5), (0, 9)])
def test_every_engine_pads_by_the_plans_one_rule(size, longest):
    """The SQL engine's padded tokens are the plan's rule (forensics.plan.padding), not a copy: the expression it
    builds gives padded_tokens' value, and no engine writes the product itself."""
    import re
    from pathlib import Path

    import duckdb

    from forensics.plan.padding import padded_tokens, padded_tokens_sql

    got = duckdb.sql(f"SELECT {padded_tokens_sql(str(size), str(longest))} AS p").fetchall()[0][0]
    assert got == padded_tokens(size, longest)
    engines = Path(__file__).resolve().parents[1] / "forensics" / "engine"
    inline = re.compile(r"\bn \* hi\b|count\(\*\) \* max\(length\)|\[\"n\"\] \* b\[\"hi\"\]")
    assert [p.name for p in engines.glob("*.py") if inline.search(p.read_text())] == []
