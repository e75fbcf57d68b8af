"""The compiled loops (forensics.compiled): the plain-Python reference and the compiled loop give the same answers, a
small run never waits for a compile, a large one compiles once and says so, and the cache is keyed by the whole
package: a changed constant that a compiled loop reads is never served from an old cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.compiled import compiled_state, key, loops
from forensics.detect import SpikeDetector
from forensics.plan.builders import pack_greedy
from forensics.stats.fenwick_median import rolling_median
from tests.test_spike_reference import LOSS, random_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def use(monkeypatch):
    """``use("compiled")`` / ``use("reference")``: every loop of this process compiled, or as plain Python."""

    def choose(kind: str) -> None:
        monkeypatch.setattr(loops, "_COMPILED", set(loops.LOOPS) if kind == "compiled" else set())
        monkeypatch.setattr(loops, "_is_warm", lambda name: False)
        monkeypatch.setattr(loops, "_PLAIN_ROWS", {})
        monkeypatch.setenv(loops.COMPILE_FROM_ENV, "0" if kind == "compiled" else str(10**12))

    return choose


def _run_everything(seed: int, with_buckets: bool) -> tuple:
    metrics, tags = random_run(seed, 600, with_buckets, heavy=bool(seed % 2))
    support = np.sort(np.random.default_rng(seed).choice(metrics["step"].to_numpy(), 20, replace=False))
    params = dict(window=16, min_periods=8, false_rate=10.0, tail_window=40, min_peaks=5, tail_start=1.0)
    whole = SpikeDetector(LOSS, **params).detect(metrics, tags, support)
    live = SpikeDetector(LOSS, **params)
    found = []
    for start in range(0, len(metrics), 97):
        found += live.update(metrics.iloc[start : start + 97], tags)
    found += live.finish()
    trace = SpikeDetector(LOSS, **params).trace(metrics, tags, support)
    medians = [
        rolling_median(metrics[LOSS].to_numpy(), w, center=c, min_periods=m)
        for w, c, m in ((31, True, 1), (8, False, None), (601, True, 1))
    ]
    return [f.to_dict() for f in whole], [f.to_dict() for f in found], trace, medians


@pytest.mark.parametrize("seed", range(6))
def test_the_reference_answers_as_the_compiled_loop(use, seed):
    use("compiled")
    compiled = _run_everything(seed, with_buckets=seed < 3)
    use("reference")
    plain = _run_everything(seed, with_buckets=seed < 3)
    assert plain[0] == compiled[0] and plain[1] == compiled[1]
    assert compiled[0] or compiled[1]  # the random runs hold events to compare
    pd.testing.assert_frame_equal(plain[2], compiled[2])
    for p, c in zip(plain[3], compiled[3]):
        np.testing.assert_array_equal(p, c)


@pytest.mark.parametrize("kind", ["compiled", "reference"])
def test_the_rolling_median_is_pandas_either_way(use, kind):
    use(kind)
    values = np.random.default_rng(3).standard_normal(700)
    values[[5, 70, 600]] = [np.nan, np.inf, -np.inf]
    for window, center, periods in ((7, False, None), (50, True, 1), (701, True, 3)):
        expected = (
            pd.Series(values)
            .replace([np.inf, -np.inf], np.nan)
            .rolling(window, center=center, min_periods=periods)
            .median()
            .to_numpy()
        )
        np.testing.assert_array_equal(rolling_median(values, window, center, periods), expected)


GREEDY_CASES = [  # (seed, n, token budget, max batch size, order kind)
    (0, 1, 2048, 16, "sorted"),
    (1, 300, 2048, 16, "sorted"),
    (2, 300, 2048, 16, "int32 permutation"),
    (3, 1000, 512, 4, "permutation"),  # lengths over the budget get batches of their own
    (4, 1000, 10**9, 1, "sorted"),  # one sample per batch
    (5, 3000, 8192, 10**6, "reversed"),
]


@pytest.mark.parametrize(("seed", "n", "budget", "most", "kind"), GREEDY_CASES)
def test_the_greedy_packer_is_the_same_either_way(use, seed, n, budget, most, kind):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 700, n)
    order = {
        "sorted": np.argsort(lengths, kind="stable"),
        "reversed": np.argsort(lengths)[::-1],
        "permutation": rng.permutation(n),
        "int32 permutation": rng.permutation(n).astype(np.int32),
    }[kind]
    use("compiled")
    compiled = pack_greedy(order, lengths, budget, most)
    use("reference")
    plain = pack_greedy(order, lengths, budget, most)
    assert len(plain) == len(compiled) and all(np.array_equal(a, b) for a, b in zip(plain, compiled))
    np.testing.assert_array_equal(np.concatenate(plain), order)


# --- which version runs -----------------------------------------------------------------------------------------------
CHOICES = [  # (rows, rows given before, compile from, compiled in this process, warm on disk, loop) -> compiled?
    (10, 0, 20_000, False, False, "rolling_medians", False),
    (19_999, 0, 20_000, False, False, "rolling_medians", False),
    (20_000, 0, 20_000, False, False, "rolling_medians", True),  # the threshold itself compiles
    (9_999, 10_000, 20_000, False, False, "rolling_medians", False),
    (10_000, 10_000, 20_000, False, False, "rolling_medians", True),  # small calls add up
    (10, 0, 20_000, True, False, "rolling_medians", True),
    (10, 0, 20_000, False, True, "rolling_medians", True),
    (0, 0, 0, False, False, "rolling_medians", True),
    (10, 0, 20_000, False, False, "wandb_scan", True),  # no plain version for the .wandb scanner
]


@pytest.mark.parametrize(("rows", "before", "threshold", "in_process", "warm", "name", "is_compiled"), CHOICES)
def test_which_version_of_a_loop_runs(monkeypatch, rows, before, threshold, in_process, warm, name, is_compiled):
    monkeypatch.setattr(loops, "_COMPILED", {name} if in_process else set())
    monkeypatch.setattr(loops, "_PLAIN_ROWS", {name: before})
    monkeypatch.setattr(loops, "_is_warm", lambda _: warm)
    monkeypatch.setenv(loops.COMPILE_FROM_ENV, str(threshold))
    chosen = loops.loop(name, rows)
    assert (getattr(chosen, "__name__", "").startswith("reference(")) is (not is_compiled)


# --- whole processes --------------------------------------------------------------------------------------------------
def _metrics(path: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    loss = 3.0 * np.exp(-np.arange(n) / 400) + 1.0 + 0.02 * rng.standard_normal(n)
    loss[n // 2] *= 3.0
    path.write_text("".join(json.dumps({"step": int(s), "loss": float(v)}) + "\n" for s, v in enumerate(loss)))
    return path


AUDIT = """
import contextlib, io, json, sys
from forensics.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["audit", "--metrics", sys.argv[1], "--json", sys.argv[2], "--no-html"]) == 0
"""


def _audit(metrics: Path, out: Path, cache: Path, tree: Path = ROOT, compile_from: int = 0) -> tuple[dict, str]:
    env = {
        **os.environ,
        "FORENSICS_CACHE_DIR": str(cache),
        loops.COMPILE_FROM_ENV: str(compile_from),
        "PYTHONPATH": str(tree),
    }
    done = subprocess.run(
        [sys.executable, "-c", AUDIT, str(metrics), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stderr


@pytest.mark.slow
def test_a_changed_constant_is_never_served_from_a_warm_cache(tmp_path):
    """The package copied, its robust-SD constant changed: the next run (the cache kept) scores with the new one."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "forensics", tree / "forensics", ignore=shutil.ignore_patterns("__pycache__"))
    metrics = _metrics(tmp_path / "metrics.jsonl", 800)
    cache = tmp_path / "cache"
    first, said = _audit(metrics, tmp_path / "a.json", cache, tree)
    assert "compiling the spike detector" in said and "compiled the spike detector in" in said
    again, said_again = _audit(metrics, tmp_path / "b.json", cache, tree)
    assert "compiling" not in said_again  # warm: loaded, not compiled
    assert again["spikes"] == first["spikes"]
    stats = tree / "forensics" / "stats" / "__init__.py"
    source = stats.read_text()
    assert source.count("MAD_TO_SD = 1.4826") == 1
    stats.write_text(source.replace("MAD_TO_SD = 1.4826", "MAD_TO_SD = 2 * 1.4826"))
    changed, said_changed = _audit(metrics, tmp_path / "c.json", cache, tree)
    assert "compiling the spike detector" in said_changed  # a new key: compiled afresh
    loss = [s for s in first["spikes"] if s["metric"] == "loss"]
    loss_changed = [s for s in changed["spikes"] if s["metric"] == "loss"]
    assert [s["step"] for s in loss] == [400] and [s["step"] for s in loss_changed] == [400]
    assert loss_changed[0]["score"] == pytest.approx(loss[0]["score"] / 2, rel=0.05)
    folders = sorted(p.name for p in (cache / key.COMPILED_FOLDER).iterdir())
    assert len(folders) == 1  # the old key's folder was pruned


def test_a_small_run_is_judged_without_compiling(tmp_path):
    metrics = _metrics(tmp_path / "metrics.jsonl", 800)
    found, said = _audit(metrics, tmp_path / "a.json", tmp_path / "cache", compile_from=loops.COMPILE_FROM)
    assert "compiling" not in said
    assert [s["step"] for s in found["spikes"] if s["metric"] == "loss"] == [400]
    assert not (tmp_path / "cache" / key.COMPILED_FOLDER).exists()


def test_the_state_says_where_the_cache_is_and_whether_it_is_warm(monkeypatch, tmp_path):
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path))
    state = compiled_state()
    assert state["cache"] == str(tmp_path / key.COMPILED_FOLDER / key.package_key())
    assert state["warm"] is False and set(state["loops"]) == set(loops.LOOPS)
    for name in loops.LOOPS:
        loops._mark_warm(name)
    assert compiled_state()["warm"] is True


def test_a_new_key_prunes_the_others_and_the_legacy_folders(tmp_path):
    root = tmp_path / key.COMPILED_FOLDER
    for old in (root / "0123456789abcdef0123", tmp_path / "numba" / "abc", tmp_path / "precompiled" / "x"):
        old.mkdir(parents=True)
    keep = root / "fedcba9876543210fedc"
    removed = key.prune(keep)
    assert sorted(p.name for p in removed) == ["0123456789abcdef0123", "numba", "precompiled"]
    assert not any(p.exists() for p in removed)


def test_validate_reports_the_compiled_code(monkeypatch, tmp_path, capsys):
    from forensics.cli import main

    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path / "cache"))
    metrics = _metrics(tmp_path / "metrics.jsonl", 50)
    assert main(["validate", "--metrics", str(metrics), "--json", str(tmp_path / "v.json")]) == 0
    said = json.loads((tmp_path / "v.json").read_text())["compiled"]
    assert said == {
        "cache": str(tmp_path / "cache" / key.COMPILED_FOLDER / key.package_key()),
        "warm": False,
        "loops": {name: False for name in loops.LOOPS},
    }
    assert "compiled loops: not cached yet" in capsys.readouterr().out
    assert main(["validate", "--metrics", str(metrics), "--json", str(tmp_path / "v.txt")]) == 2
