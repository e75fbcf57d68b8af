"""Triage on real HF Trainer runs (fixtures/hf_cases.py): a clean run comes out quiet, a corrupted one tells one short
story with its corrupted samples first, severity comes from evidence, and the run-level harmful samples are the
corrupted ones."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from forensics.cli import main
from forensics.detect import rank_suspects
from forensics.schema import ATYPICAL_CLUSTER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def audited(hf_cases, tmp_path_factory):
    """Each case audited as a new user does it (the output folder, no flag): findings and the printed summary."""
    out = tmp_path_factory.mktemp("triage")
    cache: dict[str, tuple[dict, list[str]]] = {}

    def get(name: str) -> tuple[dict, list[str]]:
        if name not in cache:
            import contextlib
            import io

            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                code = main(["audit", str(hf_cases[name].out), "--no-html", "--json", str(out / f"{name}.json")])
            assert code == 0
            cache[name] = json.loads((out / f"{name}.json").read_text()), buf.getvalue().splitlines()
        return cache[name]

    return get


def _corrupt_steps(case) -> dict[int, int]:
    plan = pd.read_parquet(case.out / "plan")
    held = plan[plan["sample_id"].isin(case.corrupt_ids)]
    return held.groupby("step")["sample_id"].nunique().astype(int).to_dict()


def test_a_clean_length_grouped_run_comes_out_quiet(audited):
    findings, _ = audited("clean_grouped")
    severities = [c["severity"] for c in findings["causes"]]
    assert severities.count("critical") == 0 and severities.count("warning") <= 2
    grad = [f for f in findings["findings"] if f["kind"] == "grad_norm_spikes"]
    assert len(grad) == 1
    (cause,) = [c for c in findings["causes"] if c["kind"] == "grad_norm"]
    spikes = [s for s in findings["spikes"] if s["metric"] == findings["run"]["grad_norm_key"]]
    assert spikes and all(s["cause"] == cause["id"] for s in spikes)
    assert grad[0]["details"]["count"] == len(spikes) and grad[0]["details"]["clipped_share"] is not None
    assert len(findings["harmful_samples"]) <= 1


def test_a_static_corrupted_run_tells_one_short_story(audited, hf_cases):
    case = hf_cases["static_corrupt"]
    findings, _ = audited("static_corrupt")
    corrupt = set(case.corrupt_ids)
    steps = set(_corrupt_steps(case))
    (main_cause,) = [c for c in findings["causes"] if steps <= set(c["steps"])]
    assert main_cause["severity"] == "critical" and main_cause is findings["causes"][0]
    assert str(min(steps)) in findings["verdict"]
    assert set(main_cause["suspect_samples"][: len(corrupt)]) == corrupt
    others = [c for c in findings["causes"] if c is not main_cause and c["severity"] in ("critical", "warning")]
    assert len(others) <= 2


def test_a_re_paired_poisoned_micro_batch_is_one_cause_with_no_clean_step(audited, hf_cases):
    case = hf_cases["accum2_repaired"]
    findings, _ = audited("accum2_repaired")
    corrupt = set(case.corrupt_ids)
    holding = set(_corrupt_steps(case))
    poisoned = [
        c
        for c in findings["causes"]
        if c["kind"] in ("batch", "samples") and set(c["suspect_samples"][: len(corrupt)]) == corrupt
    ]
    assert len(poisoned) == 1
    assert len(poisoned[0]["events"]) >= 3 and set(poisoned[0]["steps"]) <= holding


@pytest.mark.parametrize(
    "name",
    [
        "clean_grouped",
        "static_corrupt",
        "accum2_repaired",
        "grouped_longest_corrupt",
        "random_corrupt",
        "random_accum2_corrupt",
    ],
)
def test_every_summary_fits_40_lines_and_causes_agree_with_their_findings(audited, name):
    findings, lines = audited(name)
    assert len(lines) <= 40
    by_id = {c["id"]: c["severity"] for c in findings["causes"]}
    for f in findings["findings"]:
        if f.get("cause") in by_id:
            assert f["severity"] == by_id[f["cause"]], (f["kind"], f["step"])
    spikes = {(s["step"], s["metric"]): s["severity"] for s in findings["spikes"]}
    for f in findings["findings"]:
        if f["kind"] == "spike":
            assert spikes[(f["step"], f["metric"])] == f["severity"]


def test_steps_with_three_corrupted_longest_samples_are_found_and_rank_them_first(audited, hf_cases):
    """A bucket made of corrupted batches cannot hide them: every step holding 3 or more is in a critical cause,
    and in each the corrupted samples rank above every clean one."""
    case = hf_cases["grouped_longest_corrupt"]
    findings, _ = audited("grouped_longest_corrupt")
    plan = pd.read_parquet(case.out / "plan")
    samples = pd.read_parquet(case.out / "samples.parquet")
    corrupt = set(case.corrupt_ids)
    critical = {s for c in findings["causes"] if c["severity"] == "critical" for s in c["steps"]}
    heavy = [s for s, k in _corrupt_steps(case).items() if k >= 3]
    assert len(heavy) >= 5
    for step in heavy:
        assert step in critical, step
        ranked = [s.sample_id for s in rank_suspects(step, plan, samples, top=None)]
        k = sum(i in corrupt for i in ranked)
        assert set(ranked[:k]) <= corrupt, step


@pytest.mark.parametrize(
    "name",
    [
        "random_corrupt",
        "random_accum2_corrupt",
        "grouped_longest_corrupt",
    ],
)
def test_harmful_samples_are_the_corrupted_ones(audited, hf_cases, name):
    case = hf_cases[name]
    findings, _ = audited(name)
    corrupt = set(case.corrupt_ids)
    listed = [h["sample_id"] for h in findings["harmful_samples"]]
    assert sum(i in corrupt for i in listed) >= 8 and sum(i not in corrupt for i in listed) <= 2
    assert all(h["q"] <= 0.05 and h["appearances"] == len(h["steps"]) for h in findings["harmful_samples"])
    covered = {s for c in findings["causes"] if c["kind"] == "samples" for s in c["steps"]}
    holding = set(_corrupt_steps(case))
    assert len(covered & holding) >= 0.8 * len(holding)


def test_an_epoch_end_partial_batch_says_its_size(audited, hf_cases):
    findings, _ = audited("random_corrupt")
    small = [s for s in findings["spikes"] if s["details"].get("batch_size")]
    assert small
    for s in small:
        b = s["details"]["batch_size"]
        assert b["n_samples"] == 2 and b["last_of_epoch"] is True
        assert any(f"2 samples against a median of 8: the last batch of epoch {s['epoch']}" in e for e in s["evidence"])


#: Stop words and function words no cluster name may be made of (a person reads the name, not the tokenizer).
STOP_WORDS = set(
    """a an and are as at be by does did do for from has have he her his how i if in is it its no not of
on or our she so than that the their them then there these they this to was we were what when where which who why
will with yes you your""".split()
)


@pytest.mark.parametrize("name", ["clean_grouped", "static_corrupt", "random_corrupt"])
def test_cluster_names_are_real_words(audited, name):
    findings, _ = audited(name)
    names = {s.get("cluster_name") for s in findings["spikes"] if s.get("cluster_name")}
    names |= {c["details"].get("cluster_name") for c in findings["causes"] if c["details"].get("cluster_name")}
    assert names
    for n in names:
        if n.startswith(ATYPICAL_CLUSTER):  # the fixed name of texts unlike every cluster, with its source label
            assert re.fullmatch(re.escape(ATYPICAL_CLUSTER) + r"( \([a-z]+\))?", n), n
            continue
        words = re.sub(r"\([^)]*\)", "", n).split()
        assert words and all(re.fullmatch(r"[a-z][a-z'-]{2,}", w) and w not in STOP_WORDS for w in words), n


def test_the_demo_cluster_names_are_real_words(demo_small):
    from forensics.tagging.clusters import cluster_samples

    _, info = cluster_samples(pd.read_parquet(demo_small / "static" / "samples.parquet"))
    for n in info.names.values():
        words = re.sub(r"\([^)]*\)", "", n).split()
        assert words and all(re.fullmatch(r"[a-z][a-z'-]{2,}", w) and w not in STOP_WORDS for w in words), n


def test_past_the_entries_it_holds_the_harmful_samples_estimate_thins_the_logged_steps(hf_cases, tmp_path, monkeypatch):
    """A plan whose logged steps hold more (step, sample) entries than the estimate holds (here: half the run's):
    it keeps one logged step in 2, says so, and still names the corrupted samples (with half their appearances)."""
    import contextlib
    import io

    import forensics.detect.evidence.sample_effects as effects

    case = hf_cases["random_corrupt"]
    rows = len(pd.read_parquet(case.out / "plan"))
    monkeypatch.setattr(effects, "MAX_ENTRIES", rows // 2 + 1)
    out = tmp_path / "findings.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["audit", str(case.out), "--no-html", "--json", str(out)]) == 0
    findings = json.loads(out.read_text())
    assert any("estimated on one logged step in 2" in w for w in findings["warnings"])
    listed = [h["sample_id"] for h in findings["harmful_samples"]]
    corrupt = set(case.corrupt_ids)
    assert sum(i in corrupt for i in listed) >= 6 and sum(i not in corrupt for i in listed) <= 2, listed
