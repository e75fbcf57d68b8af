"""The live loop tells the audit's story: the same rows fed in random chunks to ``forensics.live.LiveRun`` give the
audit's findings and causes field by field (confidence, logging windows and cause keys included), and each cause is
announced once, by its key, the first time it appears."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forensics.live import LiveRun, resolve_target
from forensics.pipeline.audit import run_audit
from forensics.schema import open_case


def _lines_case(dst: Path, lines: list[str], toml: str, extra: Path | None = None) -> Path:
    """A case folder whose metrics source is ``metrics.jsonl`` (written later, chunk by chunk)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    if extra is not None:
        for name in ("plan.parquet", "samples.parquet"):
            shutil.copy(extra / name, dst / name)
    (dst / "run.toml").write_text(toml)
    (dst / "metrics.jsonl").write_text("".join(lines))
    return dst


def _windowed_run_lines(n: int = 900, seed: int = 3) -> list[str]:
    """A metrics-only run logged every 4 steps (HF-style windows): loss and grad norm, a grad-led spike, a joint
    one, a loss spike alone, a grad-norm spike the loss ignores, a level shift and a NaN."""
    rng = np.random.default_rng(seed)
    steps = np.arange(3, 4 * n, 4)
    loss = 2.0 + 1.5 * np.exp(-steps / 600) + 0.02 * rng.standard_normal(n)
    grad = 1.0 + 0.05 * rng.standard_normal(n)
    grad[201:203] *= [4, 8]
    loss[203] *= 2.2  # the grad norm led
    loss[400] *= 1.9
    grad[400] *= 5  # together
    loss[520] *= 2.5  # alone
    grad[610] *= 8  # the loss never followed
    loss[700:] += 1.2  # a level shift
    loss[810] = np.nan
    return [
        json.dumps({"step": int(s), "loss": float(v), "grad_norm": float(g)}) + "\n"
        for s, v, g in zip(steps, loss, grad)
    ]


def _comparable(findings: dict) -> dict:
    """What must agree: every finding and every cause, as findings.json writes them."""
    return {
        "findings": sorted(findings["findings"], key=lambda f: json.dumps(f, sort_keys=True)),
        "spikes": findings["spikes"],
        "nonfinite": findings["nonfinite"],
        "causes": findings["causes"],
    }


def _live(case: Path, lines: list[str], cuts: list[int], first: int, name: str = "metrics.jsonl") -> LiveRun:
    """The run opened on its first ``first`` lines of ``case/name``, then refreshed once per chunk appended."""
    (case / name).write_text("".join(lines[:first]))
    run = LiveRun(resolve_target([str(case)])).start()
    bounds = [first, *sorted(c for c in cuts if first < c < len(lines)), len(lines)]
    for a, b in zip(bounds, bounds[1:]):
        with (case / name).open("a") as fh:
            fh.write("".join(lines[a:b]))
        run.refresh()
    return run


@pytest.fixture(scope="module")
def windowed_case(tmp_path_factory) -> tuple[Path, list[str], dict]:
    lines = _windowed_run_lines()
    case = _lines_case(
        tmp_path_factory.mktemp("windowed") / "case", lines, 'metrics = ["metrics.jsonl"]\nlogging_steps = 4\n'
    )
    return case, lines, run_audit(open_case(case)).findings


@pytest.fixture(scope="module")
def demo_case(demo_small, tmp_path_factory) -> tuple[Path, list[str], dict]:
    src = demo_small / "static"
    lines = (src / "metrics.jsonl").read_text().splitlines(keepends=True)
    toml = (src / "run.toml").read_text().replace('metrics = ["metrics.parquet"]', 'metrics = ["metrics.jsonl"]')
    case = _lines_case(tmp_path_factory.mktemp("demo-live") / "case", lines, toml, extra=src)
    return case, lines, run_audit(open_case(case)).findings


OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


def _health_run_lines(seed: int = 5) -> list[str]:
    """A metrics-only run that resumed from a checkpoint: steps 0-319 logged, then 250-599 logged again from a loss
    0.4 higher (a restart whose resumed values differ), with a loss spike at 180 and a warmup of the lr."""
    rng = np.random.default_rng(seed)

    def row(step: int, shift: float = 0.0) -> str:
        loss = 2.5 - step / 800 + 0.03 * rng.standard_normal() + shift
        loss *= 2.4 if step == 180 else 1.0
        return (
            json.dumps(
                {
                    "step": step,
                    "loss": float(loss),
                    "grad_norm": float(1 + 0.05 * rng.standard_normal()),
                    "lr": float(min(1e-3, 1e-3 * (step + 1) / 50)),
                }
            )
            + "\n"
        )

    return [row(s) for s in range(0, 320)] + [row(s, 0.4) for s in range(250, 600)]


@pytest.fixture(scope="module")
def health_case(tmp_path_factory) -> tuple[Path, list[str], dict]:
    """The resumed run, audited with the scheduler's ``slurm-123.out`` ending in a CUDA out-of-memory line."""
    lines = _health_run_lines()
    case = _lines_case(tmp_path_factory.mktemp("health") / "case", lines, 'metrics = ["metrics.jsonl"]\n')
    (case / "slurm-123.out").write_text("step 599 loss 2.41\n" + OOM_LINE)
    offline = run_audit(open_case(case)).findings
    (case / "slurm-123.out").unlink()  # each example writes it again when the run dies
    return case, lines, offline


@pytest.fixture(scope="module")
def real_log_case(real_logs_dir, tmp_path_factory) -> tuple[Path, list[str], dict]:
    """A real public log, metrics only: modded-nanogpt's 20,344 steps of a noisy per-step loss (its one-step spikes
    and its NaN timing fields), tailed as the text log it is."""
    lines = (real_logs_dir / "modded-nanogpt-1b-adamw.log").read_text().splitlines(keepends=True)
    case = tmp_path_factory.mktemp("real-log") / "case"
    case.mkdir()
    (case / "run.toml").write_text('metrics = ["train.log"]\n')
    (case / "train.log").write_text("".join(lines))
    return case, lines, run_audit(open_case(case)).findings


def test_the_windowed_run_has_what_the_property_compares(windowed_case):
    """The comparison below is only as strong as the run: joint, windowed spikes and several causes."""
    _, _, offline = windowed_case
    spikes = offline["spikes"]
    assert {s["details"].get("joint") for s in spikes} >= {"led", "accompanied", "none", "loss_response"}
    assert all(
        s["details"]["window_steps"] == [s["step"], s["end_step"]] and (s["end_step"] - s["step"] + 1) % 4 == 0
        for s in spikes
    )
    assert len(offline["causes"]) >= 4 and all(c["key"] for c in offline["causes"])


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(cuts=st.lists(st.integers(1, 899), max_size=7, unique=True), first=st.integers(40, 300))
def test_live_chunks_give_the_audits_findings_and_causes_windows_and_confidence(windowed_case, cuts, first):
    case, lines, offline = windowed_case
    run = _live(case, lines, cuts, first)
    assert _comparable(run.finish()) == _comparable(offline)


@settings(
    max_examples=2,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cuts=st.lists(st.integers(300, 3400), max_size=5, unique=True), first=st.integers(200, 250))
def test_live_chunks_of_a_planned_run_give_the_audits_causes_and_keys(demo_case, cuts, first):
    case, lines, offline = demo_case
    run = _live(case, lines, cuts, first)
    assert _comparable(run.finish()) == _comparable(offline)


def test_the_health_and_real_cases_have_what_the_property_compares(health_case, real_log_case):
    """The run-health case gives a crash, a restart and a spike (each a cause); the real log its spikes and the NaN
    of its timing fields."""
    _, _, health = health_case
    assert [(f["kind"], f["step"], f["severity"]) for f in health["findings"]] == [
        ("crash", 599, "critical"),
        ("restart", 250, "warning"),
        ("spike", 180, "warning"),
    ]
    assert [c["key"] for c in health["causes"]] == ["crash:599:-", "restart:250:-", "event:180:-"]
    restart = next(f for f in health["findings"] if f["kind"] == "restart")["details"]
    assert (restart["last_step"], restart["rows_replaced"]) == (319, 70)
    _, _, real = real_log_case
    kinds = [f["kind"] for f in real["findings"]]
    assert kinds.count("spike") >= 20 and "nonfinite" in kinds


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(cuts=st.lists(st.integers(1, 669), max_size=7, unique=True), first=st.integers(40, 330))
def test_live_chunks_of_a_resumed_run_that_died_give_the_audits_crash_restart_and_spike(health_case, cuts, first):
    """Rows in any chunks, the rewind cut anywhere, then the crash line written after the last row (the job died:
    no row comes with it): the live loop announces the crash, and finishes with the audit's findings and causes."""
    case, lines, offline = health_case
    try:
        run = _live(case, lines, cuts, first)
        (case / "slurm-123.out").write_text("step 599 loss 2.41\n" + OOM_LINE)
        assert run.refresh() == []
        assert "crash:599:-" in [n.key for n in run.new_causes]
        assert _comparable(run.finish()) == _comparable(offline)
    finally:
        (case / "slurm-123.out").unlink(missing_ok=True)


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(cuts=st.lists(st.integers(1, 20500), max_size=6, unique=True), first=st.integers(300, 3000))
def test_live_chunks_of_a_real_metrics_only_log_give_the_audits_findings(real_log_case, cuts, first):
    case, lines, offline = real_log_case
    run = _live(case, lines, cuts, first, name="train.log")
    assert _comparable(run.finish()) == _comparable(offline)


def test_each_cause_is_announced_once_by_its_key_and_a_return_joins_its_cause(demo_case):
    """The batch of 254 comes back later in the run: it joins the cause announced at 254 (same key), no new one."""
    case, lines, offline = demo_case
    run = _live(case, lines, cuts=[256, 262, 800, 1500, 2500], first=200)
    keys = [n.key for n in run.new_causes]
    assert len(keys) == len(set(keys))
    c254 = next(c for c in offline["causes"] if 254 in c["steps"])
    assert sum(1 for n in run.new_causes if n.key == c254["key"]) == 1
    batch = ("batch", "event")
    assert {c["key"] for c in run.causes if c["kind"] in batch} == {
        c["key"] for c in offline["causes"] if c["kind"] in batch
    }


def _hf_jsonl_case(out: Path, live: Path) -> tuple[Path, list[str]]:
    """A real Trainer run's case (its recorded plan and samples) whose metrics are its per-step log history as a
    JSONL log written as it trains (steps 0-based: HF's ``global_step`` minus 1)."""
    state = json.loads((out / "trainer_state.json").read_text())
    rows = [h for h in state["log_history"] if "loss" in h and "step" in h]
    lines = [
        json.dumps({"step": int(h["step"]) - 1, "loss": float(h["loss"]), "grad_norm": float(h["grad_norm"])}) + "\n"
        for h in rows
    ]
    live.mkdir(parents=True)
    shutil.copytree(out / "plan", live / "plan")
    shutil.copy(out / "samples.parquet", live / "samples.parquet")
    (live / "run.toml").write_text(
        'metrics = ["metrics.jsonl"]\nplan = "plan"\nsamples = "samples.parquet"\nmax_grad_norm = 1.0\n'
    )
    return live, lines


@pytest.fixture(scope="module")
def hf_case(hf_cases, tmp_path_factory) -> tuple[Path, list[str], dict]:
    live, lines = _hf_jsonl_case(hf_cases["random_corrupt"].out, tmp_path_factory.mktemp("hf") / "case")
    (live / "metrics.jsonl").write_text("".join(lines))
    return live, lines, run_audit(open_case(live)).findings


@pytest.mark.slow
@settings(
    max_examples=2,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(cuts=st.lists(st.integers(130, 750), max_size=5, unique=True), first=st.integers(100, 125))
def test_live_chunks_of_a_real_trainer_run_with_its_plan_give_the_audits_findings(hf_case, cuts, first):
    """The harmful samples, the grad-norm spikes the loss did not follow, the spikes with their suspects and the steps
    their composition explains: the live loop over a real HF Trainer run with its recorded plan ends where the audit
    does."""
    case, lines, offline = hf_case
    kinds = {f["kind"] for f in offline["findings"]}
    assert kinds == {"spike", "grad_norm_spikes", "harmful_samples", "expected_for_bucket"}, kinds
    run = _live(case, lines, cuts, first)
    assert _comparable(run.finish()) == _comparable(offline)


@pytest.mark.slow
def test_harmful_samples_accumulate_live_as_they_come_back(hf_cases, tmp_path):
    """A real Trainer run tailed as it writes: the run-level estimate is redone as rows arrive, and by the end it
    lists the corrupted samples, as the audit does."""
    case = hf_cases["random_corrupt"]
    live, lines = _hf_jsonl_case(case.out, tmp_path / "live")
    run = _live(live, lines, cuts=list(range(200, len(lines), 150)), first=120)
    listed = {h["sample_id"] for h in run.harmful_samples}
    corrupt = set(case.corrupt_ids)
    assert len(listed & corrupt) >= 8 and len(listed - corrupt) <= 2
    assert any(c["kind"] == "samples" for c in run.causes)


def test_a_run_audited_through_an_engine_runs_live_as_in_memory(demo_small, tmp_path):
    """A case whose run.toml reads the plan through DuckDB: the live loop starts from that audit, holds the plan it
    extends as parts arrive, and comes to the findings and causes the loop over the in-memory plan comes to."""
    found = {}
    for engine in ("pandas", "duckdb"):
        case = tmp_path / engine
        shutil.copytree(demo_small / "static", case, ignore=shutil.ignore_patterns("wandb", "findings.json"))
        toml = case / "run.toml"  # top-level keys go before the [detect.*] tables
        toml.write_text(f'engine = "{engine}"\nmemory_limit = "2GB"\n' + toml.read_text())
        run = LiveRun(resolve_target([str(case)])).start()
        assert run.plan is not None and len(run.plan)
        # the commands the causes print name the case folder: the same name for both
        found[engine] = json.loads(json.dumps(_comparable(run.finish())).replace(str(case), "CASE"))
    assert found["pandas"]["causes"] and found["duckdb"] == found["pandas"]


FAMILY_LIVE = ["cut-group_by_length-s0-corrupt", "cut-group_by_length-s1-clean", "static-s0-corrupt"]


@pytest.fixture(scope="module", params=FAMILY_LIVE)
def family_case(request, hf_family, tmp_path_factory) -> tuple[Path, list[str], dict]:
    live, lines = _hf_jsonl_case(hf_family(request.param).out, tmp_path_factory.mktemp("family") / "case")
    (live / "metrics.jsonl").write_text("".join(lines))
    return live, lines, run_audit(open_case(live)).findings


@pytest.mark.slow
def test_live_chunks_of_a_family_run_judge_each_step_against_its_composition_as_the_audit_does(family_case):
    """Runs whose loss moves with their batches' content (fixtures/hf_family.py: a corrupted twin whose buckets cut
    through a content type, a clean one, and a static plan's twin): the live loop's causal expectation, fed in
    chunks, ends where the audit does, spikes, their expected baselines and causes included."""
    case, lines, offline = family_case
    # the comparison is only as strong as the run: spikes judged against an expectation the composition moved
    assert [s for s in offline["spikes"] if abs(s["details"].get("expected_factor", 1.0) - 1.0) > 0.05]
    run = _live(case, lines, cuts=[90, 91, 200, 333], first=60)
    assert _comparable(run.finish()) == _comparable(offline)
