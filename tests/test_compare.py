"""``forensics compare`` end to end on real producers: the demo's static plan and its bucketed fix, a real HF Trainer
run and the same run re-trained without its corrupted samples, two metrics-only JSONL logs, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from forensics.cli import main

CONTRACT_KEYS = {"runs", "spikes", "removed", "before_after", "summary"}
SPIKE_KEYS = {"step", "logged_step", "runs", "class", "data_position", "values", "states"}


def compare(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _check_contract(doc: dict) -> None:
    assert set(doc) == CONTRACT_KEYS
    assert all(set(r) == {"name", "source", "steps"} for r in doc["runs"])
    assert all(set(s) == SPIKE_KEYS for s in doc["spikes"] + doc["removed"])


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def demo_compared(demo_small: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict, str]:
    """The demo's static and bucketed cases compared once: exit code, stdout, compare.json, compare.html."""
    import contextlib
    import io

    out_dir = tmp_path_factory.mktemp("demo-compare")
    before = _tree(demo_small)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = main(
            [
                "compare",
                str(demo_small / "static"),
                str(demo_small / "bucketed"),
                "--json",
                str(out_dir / "compare.json"),
                "--html",
                str(out_dir / "compare.html"),
            ]
        )
    assert _tree(demo_small) == before  # nothing written into the runs compared
    return (
        code,
        stdout.getvalue(),
        json.loads((out_dir / "compare.json").read_text()),
        (out_dir / "compare.html").read_text(encoding="utf-8"),
    )


def test_the_demos_story_spikes_are_removed_by_the_bucketed_fix(demo_compared):
    code, out, doc, _ = demo_compared
    assert code == 0
    _check_contract(doc)
    assert [(r["name"], r["steps"]) for r in doc["runs"]] == [("static", 3504), ("bucketed", 4614)]
    assert [(s["step"], s["logged_step"], s["class"], s["runs"]) for s in doc["spikes"]] == [
        (254, 254, "vanished", ["static"]),
        (258, 258, "vanished", ["static"]),
    ]
    assert [s["step"] for s in doc["removed"]] == [254, 258]
    first = doc["spikes"][0]
    assert first["data_position"]["sample_ids"] == [147, 6567, 6768]
    assert first["data_position"]["overlap"] == {"static": 1.0, "bucketed": 0.25}
    assert first["values"] == pytest.approx({"static": 4.272368374808716, "bucketed": 0.6850868831788296})
    assert doc["before_after"]["jumpiness_share"] == pytest.approx([0.8782005781802174, 0.8790158894793196])
    assert doc["before_after"]["tokens_per_s"] == pytest.approx([30732.672541657863, 26017.9155543335])
    assert doc["summary"]["removed"] == 2 and doc["summary"]["left"] == 0 and doc["summary"]["new"] == 0
    assert out.splitlines()[0] == (
        "2 spike positions across 2 runs: 2 vanished; bucketed against static: 2 removed, 0 left, 0 new."
    )
    assert "  step 254 (logged 254): vanished (removed), in static; loss static 4.272, bucketed 0.6851" in out


@pytest.fixture(scope="module")
def retrained_pair(hf_cases):
    """random_corrupt and the same run re-trained with its corrupted samples left out (cached by content)."""
    from fixtures.hf_retrained import retrained_case

    before = hf_cases["random_corrupt"]
    return before, retrained_case("random_corrupt")


def test_a_run_retrained_without_its_corrupted_samples_loses_every_spike_they_caused(retrained_pair, tmp_path, capsys):
    before, after = retrained_pair
    out_json = tmp_path / "compare.json"
    code, _, _ = compare([str(before.out), str(after.out), "--json", str(out_json)], capsys)
    assert code == 0
    doc = json.loads(out_json.read_text())
    _check_contract(doc)
    spikes = doc["spikes"]
    assert [(s["step"], s["logged_step"]) for s in spikes] == [
        (102, 103),
        (243, 244),
        (274, 275),
        (330, 331),
        (335, 336),
        (338, 339),
        (479, 480),
        (650, 651),
        (656, 657),
        (685, 686),
        (690, 691),
    ]
    assert {s["class"] for s in spikes} == {"vanished"}
    assert [s["step"] for s in doc["removed"]] == [s["step"] for s in spikes]
    corrupt = set(before.corrupt_ids)
    # each spike's batch held a corrupted sample, which the re-trained run consumed nowhere
    assert [sorted(set(s["data_position"]["sample_ids"]) & corrupt) for s in spikes] == [
        [1957],
        [261],
        [1366],
        [261],
        [1965],
        [1957],
        [792],
        [1965],
        [792],
        [784],
        [261],
    ]
    assert doc["summary"]["vanished"] == 11 and doc["summary"]["removed"] == 11


def _log(path: Path, spikes: dict[int, float], seed: int, n: int = 400) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for step in range(n):
            v = (3.0 + 0.02 * rng.standard_normal()) * spikes.get(step, 1.0)
            f.write(json.dumps({"step": step, "loss": round(float(v), 5)}) + "\n")
    return path


@pytest.mark.parametrize("same_order", [False, True])
def test_two_metrics_only_logs_are_compared_by_step(tmp_path: Path, capsys, same_order):
    a = _log(tmp_path / "a.jsonl", {150: 2.0, 300: 2.0}, seed=0)
    b = _log(tmp_path / "b.jsonl", {150: 2.0, 220: 2.0}, seed=1)
    out_json = tmp_path / "c.json"
    args = [str(a), str(b), "--json", str(out_json)] + (["--same-order"] if same_order else [])
    code, out, err = compare(args, capsys)
    assert code == 0
    doc = json.loads(out_json.read_text())
    _check_contract(doc)
    assert [(s["step"], s["class"], s["runs"], s["data_position"]) for s in doc["spikes"]] == [
        (150, "recurring", ["a", "b"], None),
        (220, "unique", ["b"], None),
        (300, "unique", ["a"], None),
    ]
    assert [s["step"] for s in doc["removed"]] == [300]
    logged = {
        name: {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())}
        for name, path in (("a", a), ("b", b))
    }
    assert [s["values"] for s in doc["spikes"]] == [{n: logged[n][step] for n in "ab"} for step in (150, 220, 300)]
    assert "before_after" in doc and doc["before_after"] == {}
    order = "the same data order (--same-order)" if same_order else "data order unknown (unknown)"
    assert f"  b against a: {order}" in out
    assert ("the runs' data order is not known" in err) is not same_order


def test_by_data_needs_a_plan(tmp_path: Path, capsys):
    a = _log(tmp_path / "a.jsonl", {150: 2.0}, seed=0)
    code, out, err = compare([str(a), str(a), "--by", "data"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("forensics: error: --by data: no run has a plan") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{a}"], "forensics: error: compare: give two runs or more (case folders or metrics sources)\n"),
        (["{a}", "{missing}"], "forensics: error: compare: {missing}: no such case folder or metrics source\n"),
        (["{a}", "{a}", "--name", "x"], "forensics: error: --name: give one name per RUN (2), got 1\n"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, args, message):
    a = _log(tmp_path / "a.jsonl", {150: 2.0}, seed=0)
    fill = {"a": str(a), "missing": str(tmp_path / "nope.jsonl")}
    code, out, err = compare([x.format(**fill) for x in args], capsys)
    assert (code, out, err) == (2, "", message.format(**fill))


def test_the_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    assert "example:\n  forensics compare forensics-demo/static forensics-demo/bucketed" in capsys.readouterr().out


def _figure(page: str) -> dict:
    start = page.index('<script type="application/json" id="compare-figures">') + len(
        '<script type="application/json" id="compare-figures">'
    )
    return json.loads(page[start : page.index("</script>", start)])["compare"]


def test_compare_html_overlays_both_losses_and_marks_the_spikes_by_class(demo_compared):
    page = demo_compared[3]
    fig = _figure(page)
    assert [t["name"] for t in fig["data"]] == ["static", "bucketed", "vanished spikes"]
    markers = fig["data"][2]
    # static spiked at each batch again in a later epoch (the same samples: one data position); bucketed is marked
    # at the anchor's step, where its order had put other samples
    assert list(markers["x"]) == [254, 754, 254, 258, 1107, 258]
    assert markers["text"] == ["static: spiked (vanished)"] * 2 + ["bucketed: moved (vanished)"] + [
        "static: spiked (vanished)"
    ] * 2 + ["bucketed: moved (vanished)"]
    assert "<script src" not in page and "<link" not in page  # offline: plotly inlined, nothing fetched
    assert '<td class="cls vanished">vanished (removed)</td>' in page
    assert "&lt;|endoftext|&gt;" in page and "<|endoftext|>" not in page


def test_compare_html_escapes_names_it_is_given(tmp_path: Path, capsys):
    a = _log(tmp_path / "a.jsonl", {150: 2.0}, seed=0)
    b = _log(tmp_path / "b.jsonl", {150: 2.0}, seed=1)
    page_path = tmp_path / "c.html"
    code, _, _ = compare([str(a), str(b), "--name", "</script><b>a", "--name", "b&c", "--html", str(page_path)], capsys)
    assert code == 0
    page = page_path.read_text(encoding="utf-8")
    assert "</script><b>a" not in page and "&lt;/script&gt;&lt;b&gt;a" in page and "b&amp;c" in page
    assert [t["name"] for t in _figure(page)["data"]] == ["</script><b>a", "b&c", "recurring spikes"]
