"""The segment re-run where a person reads it: the cause's card in report.html and in the dashboard shows the
per-group update/weight ratio and grad norm around the spike (group names from replay.json), the cause class and
its action; and which replays re-run at all (``--rerun``, ``--from-findings``, ``audit --replay``: one rule).

The case is fixtures/hf_faults.py's ``data`` run (a real tiny HF Trainer run, six corrupted near-duplicates in
step 17's batch, checkpoints with optimizer state), audited and then replayed with ``--from-findings`` alone, as the
audit's printed next step says: that replay re-runs the cause because the checkpoints hold optimizer state.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from fixtures.hf_faults import fault_runs  # noqa: E402
from forensics.cli import main  # noqa: E402
from forensics.report.rerun import MAX_GROUPS, rerun_entries, shown_groups  # noqa: E402

GROUPS = ("embeddings", "block.0.attn", "block.0.mlp", "block.1.attn", "block.1.mlp", "norms")
LIGHT = ["--device", "cpu", "--controls", "2", "--no-probes", "--no-control-step"]


@pytest.fixture(scope="module")
def runs():
    return fault_runs()


@pytest.fixture(scope="module")
def replayed(runs, tmp_path_factory) -> Path:
    """The ``data`` run audited (findings.json, report.html), then ``replay --from-findings`` without ``--rerun``."""
    case = runs["data"].copy_to(tmp_path_factory.mktemp("panel") / "case")
    assert main(["audit", str(case)]) == 0
    assert main(["replay", str(case), "--from-findings", *LIGHT]) == 0
    return case


def _read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _main_cause(runs, case: Path) -> dict:
    findings = _read(case / "findings.json")
    return next(c for c in findings["causes"] if runs["data"].spike_step in c["steps"])


def test_from_findings_reruns_when_the_checkpoints_hold_optimizer_state(runs, replayed):
    cause = _main_cause(runs, replayed)
    assert cause["cause_class"] == "data" and cause["action"].startswith("Skip the suspect samples")
    entry = next(d for d in _read(replayed / "replay" / "replay.json")["steps"] if d["step"] == runs["data"].spike_step)
    assert set(entry["rerun"]["segment"][0]["groups"]) == set(GROUPS)


def test_the_report_card_shows_the_per_group_rerun_around_the_spike(runs, replayed):
    cause = _main_cause(runs, replayed)
    html = (replayed / "report.html").read_text(encoding="utf-8")
    card = re.search(rf'<article class="card finding cause" id="cause-{cause["id"]}".*?</article>', html, re.S)
    assert card, "no card for the main cause"
    card = card.group(0)
    assert "Re-run from the checkpoint (per parameter group)" in card
    spike = runs["data"].spike_step
    assert f"Step {spike} re-run from checkpoint 12: cause class data." in card
    assert "Action: Skip the suspect samples" in card
    (figure,) = re.findall(
        rf'<script type="application/json" class="card-figure" data-target="fig-rerun-{cause["id"]}-{spike}">'
        r"(.*?)</script>",
        card,
        re.S,
    )
    fig = json.loads(figure)
    assert {t["name"] for t in fig["data"]} == set(GROUPS)
    steps = [12, 13, 14, 15, 16, 17]
    assert all(t["x"] == steps for t in fig["data"])
    # the spike step marked on both panels
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [spike, spike]
    # the element it is drawn into, and the loader that draws every card's figure
    assert f'id="fig-rerun-{cause["id"]}-{spike}"' in card and "script.card-figure" in html


def test_the_dashboard_card_shows_the_per_group_rerun(runs, replayed):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from forensics.dashboard.session import TARGET

    cause = _main_cause(runs, replayed)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=240)
    at.session_state[TARGET] = [str(replayed)]
    at.session_state["cause_pick"] = cause["id"]
    at.run()
    assert not at.exception, at.exception
    text = "\n".join(m.value for m in at.markdown).replace("\\", "").replace("**", "")
    spike = runs["data"].spike_step
    assert "Re-run from the checkpoint (per parameter group):" in text
    assert f"Step {spike} re-run from checkpoint 12: cause class data." in text
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    reruns = [f for f in charts if any(t.get("name") in GROUPS for t in f["data"])]
    # one figure per re-run step of the cause, each marking its own step on both panels
    by_step = {d["step"]: d for d in _read(replayed / "replay" / "replay.json")["steps"]}
    want = [s for s in cause["steps"] if (by_step.get(s) or {}).get("rerun")][:3]
    assert spike in want
    assert [[s["x0"] for s in f["layout"]["shapes"]] for f in reruns] == [[s, s] for s in want]
    assert all({t["name"] for t in f["data"]} == set(GROUPS) for f in reruns)


# --- which replays re-run: one rule for audit --replay and replay --from-findings --------------------------------
@pytest.mark.parametrize(
    ("asked", "from_findings", "optimizer_state", "want"),
    [
        (True, False, True, (True, False)),  # --rerun --steps: asked, a failure is bad input
        (True, True, False, (True, False)),  # --rerun --from-findings without state: still asked (an error later)
        (False, True, True, (True, True)),  # --from-findings / audit --replay with state: re-run, failures noted
        (False, True, False, (False, True)),  # ... without state: no re-run
        (False, False, True, (False, False)),  # --steps alone: never
    ],
)
def test_rerun_plan(runs, tmp_path, asked, from_findings, optimizer_state, want):
    from forensics.pipeline.replay_loop import rerun_plan
    from forensics.schema import open_case

    case = runs["data"].copy_to(tmp_path / "case")
    if not optimizer_state:
        for ck in case.glob("checkpoint-*"):
            (ck / "optimizer.pt").unlink()
    assert rerun_plan(open_case(case), asked, from_findings) == want


def test_from_findings_without_optimizer_state_replays_without_a_class(runs, tmp_path, capsys):
    case = runs["data"].copy_to(tmp_path / "case")
    for ck in case.glob("checkpoint-*"):
        (ck / "optimizer.pt").unlink()
    assert main(["audit", str(case), "--no-html"]) == 0
    assert main(["replay", str(case), "--from-findings", *LIGHT]) == 0
    cause = _main_cause(runs, case)
    assert cause["replay"]["verdict"] == "data" and "cause_class" not in cause
    assert all("rerun" not in d for d in _read(case / "replay" / "replay.json")["steps"])


# --- the groups a figure draws ---------------------------------------------------------------------------------------
def _segment(growth: dict[str, float]) -> list[dict]:
    """Two steps whose update ratio grows by ``growth[g]`` per group."""
    return [
        {
            "step": s,
            "groups": {g: {"update_ratio": 1e-3 * (f if s else 1.0), "grad_norm": 1.0} for g, f in growth.items()},
        }
        for s in (0, 1)
    ]


@pytest.mark.parametrize(
    ("n", "first", "want_first", "want_len"),
    [
        (MAX_GROUPS, None, "g00", MAX_GROUPS),  # all fit; the one that grew most first
        (MAX_GROUPS + 1, None, "g00", MAX_GROUPS),  # one too many: the least grown left out
        (MAX_GROUPS + 1, "g08", "g08", MAX_GROUPS),  # the first group to jump leads even when it grew least
        (3, "absent", "g00", 3),  # a first group the segment does not hold is not drawn
    ],
)
def test_shown_groups(n, first, want_first, want_len):
    growth = {f"g{i:02d}": float(n - i) for i in range(n)}  # g00 grew most
    shown = shown_groups({"segment": _segment(growth), "first_group": first})
    assert (shown[0], len(shown)) == (want_first, want_len)
    if first is None and n > MAX_GROUPS:
        assert f"g{n - 1:02d}" not in shown


def test_rerun_entries_are_the_causes_steps_with_a_segment():
    replay = {
        5: {"step": 5, "rerun": {"segment": [{"step": 4}]}},
        9: {"step": 9, "rerun": {"segment": []}},  # a re-run with nothing to draw
        12: {"step": 12},  # replayed, not re-run
        30: {"step": 30, "rerun": {"segment": [{"step": 29}]}},  # another cause's
    }
    assert [e["step"] for e in rerun_entries({"steps": [5, 9, 12]}, replay)] == [5]
