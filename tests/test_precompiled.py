"""The loops compiled ahead of time (forensics._precompiled): built in the background as a user's first run builds
them, the same answers as numba's JIT on the spike kernel's random runs and the rolling median's, a call of other
types sent to the JIT, and a metrics-only audit that never imports numba."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import forensics._precompiled as P
from forensics.detect import SpikeDetector
from forensics.detect.spikes.kernel_state import Window
from forensics.rolling_median import rolling_median
from tests.test_spike_reference import LOSS, random_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(session_cache) -> Path:
    """This key's module, built by the detached process a first run starts (or one already under way)."""
    P._BUILD_STARTED = False
    P.start_build()
    place = P.folder()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if (place / P.MANIFEST).exists():
            return place
        if (place / "failed").exists():
            pytest.skip(f"the loops could not be compiled ahead of time here: {(place / 'failed').read_text()}")
        lock = place.parent / f"{place.name}.building"
        if not lock.exists() and not (place / P.MANIFEST).exists():
            P._BUILD_STARTED = False
            P.start_build()
        time.sleep(0.5)
    pytest.fail(f"no module in {place} after 300 s; log: {place.parent / (place.name + '.log')}")


@pytest.fixture()
def loops(built, monkeypatch):
    """``use("aot")`` / ``use("jit")``: every loop of this process from the built module, or from numba's JIT."""
    aot = P.guarded_loops(P.load_module(built))
    assert set(aot) == set(P.LOOPS)

    def use(kind: str) -> dict:
        chosen = aot if kind == "aot" else {name: P._jit(name) for name in P.LOOPS}
        monkeypatch.setattr(P, "_CHOSEN", dict(chosen))
        return chosen

    return use


# --- fingerprints: equal only for what compiles to the same code ------------------------------------------------------
_x = np.arange(12.0)
_readonly = _x.copy()
_readonly.flags.writeable = False
_Pair = namedtuple("_Pair", "a b")

FINGERPRINTS = [
    # (left, right, same)
    (np.arange(5.0), np.ones(9), True),
    (np.arange(5.0), np.arange(5, dtype=np.float32), False),
    (np.arange(5.0), np.arange(5), False),
    (_x, _x[::2], False),  # contiguous vs strided
    (_x, _readonly, False),
    (_x, _x.reshape(3, 4), False),
    (_x.reshape(3, 4), np.asfortranarray(_x.reshape(3, 4)), False),
    (np.zeros(2, [("a", "<f8"), ("b", "<i8")]), np.zeros(2, [("b", "<i8"), ("a", "<f8")]), False),
    (np.zeros(2, [("a", "<f8"), ("b", "<i8")]), np.zeros(7, [("a", "<f8"), ("b", "<i8")]), True),
    (np.zeros(2, [("a", "<f8"), ("b", "<i8")]), np.zeros(2, np.dtype([("a", "<f8"), ("b", "<i8")], align=True)),
     True),  # the same fields at the same offsets
    (np.zeros(2, [("a", "<i4"), ("b", "<i8")]), np.zeros(2, np.dtype([("a", "<i4"), ("b", "<i8")], align=True)),
     False),  # padding moves b
    (Window(_x, _x, np.arange(2)), (_x, _x, np.arange(2)), False),  # the class is part of numba's type
    (Window(_x, _x, np.arange(2)), _Pair(_x, _x), False),
    (Window(_x, _x, np.arange(2)), Window(_x * 2, _x, np.arange(3)), True),
    (3, 4, True),
    (3, np.int64(3), False),
    (3, 3.0, False),
    (np.int64(3), np.int32(3), False),
]


@pytest.mark.parametrize(("left", "right", "same"), FINGERPRINTS)
def test_fingerprints_are_equal_exactly_when_the_types_are(left, right, same):
    assert (P.fingerprint(left) == P.fingerprint(right)) is same


# --- the same answers -------------------------------------------------------------------------------------------------
def _run_everything(seed: int, with_buckets: bool) -> tuple:
    metrics, tags = random_run(seed, 600, with_buckets, heavy=bool(seed % 2))
    support = np.sort(np.random.default_rng(seed).choice(metrics["step"].to_numpy(), 20, replace=False))
    params = dict(window=16, min_periods=8, false_rate=10.0, tail_window=40, min_peaks=5, tail_start=1.0)
    whole = SpikeDetector(LOSS, **params).detect(metrics, tags, support)
    live = SpikeDetector(LOSS, **params)
    found = []
    for start in range(0, len(metrics), 97):
        found += live.update(metrics.iloc[start:start + 97], tags)
    found += live.finish()
    trace = SpikeDetector(LOSS, **params).trace(metrics, tags, support)
    medians = [rolling_median(metrics[LOSS].to_numpy(), w, center=c, min_periods=m)
               for w, c, m in ((31, True, 1), (8, False, None), (601, True, 1))]
    return [f.to_dict() for f in whole], [f.to_dict() for f in found], trace, medians


@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_module_answers_as_the_jit(loops, seed):
    loops("jit")
    jit = _run_everything(seed, with_buckets=seed < 4)
    loops("aot")
    before = sum(P.misses.values())
    aot = _run_everything(seed, with_buckets=seed < 4)
    assert sum(P.misses.values()) == before  # every call ran the compiled module
    assert aot[0] == jit[0] and aot[1] == jit[1]
    pd.testing.assert_frame_equal(aot[2], jit[2])
    for a, j in zip(aot[3], jit[3]):
        np.testing.assert_array_equal(a, j)


def test_the_rolling_median_through_the_module_is_pandas(loops):
    loops("aot")
    values = np.random.default_rng(3).standard_normal(2000)
    values[[5, 70, 900]] = [np.nan, np.inf, -np.inf]
    for window, center, periods in ((7, False, None), (50, True, 1), (2001, True, 3)):
        expected = pd.Series(values).replace([np.inf, -np.inf], np.nan).rolling(
            window, center=center, min_periods=periods).median().to_numpy()
        np.testing.assert_array_equal(rolling_median(values, window, center, periods), expected)


def test_a_call_of_other_types_runs_the_jit(loops):
    chosen = loops("aot")
    medians = chosen["rolling_medians"]
    ordered = np.repeat(np.arange(6.0), 2)[::2]  # strided: the module was compiled for contiguous arrays only
    rank = np.arange(6, dtype=np.int64)
    start, end = np.zeros(6, np.int64), np.arange(1, 7, dtype=np.int64)
    out = np.empty(6)
    before = P.misses.get("rolling_medians", 0)
    medians(ordered, rank, start, end, 1, np.zeros(7, np.int64), out)
    assert P.misses["rolling_medians"] == before + 1
    np.testing.assert_array_equal(out, [0.0, 0.5, 1.0, 1.5, 2.0, 2.5])


# --- whole processes --------------------------------------------------------------------------------------------------
AUDIT = '''
import contextlib, io, json, sys
from forensics.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["audit", "--metrics", sys.argv[1], "--json", sys.argv[2], "--no-html"]) == 0
import forensics._precompiled as P
print(json.dumps({"numba": "numba" in sys.modules, "misses": P.misses}))
'''


def test_a_metrics_only_audit_never_imports_numba_and_finds_what_the_jit_finds(built, tmp_path):
    rng = np.random.default_rng(5)
    loss = 2.0 * np.exp(-np.arange(3000) / 800) + 0.9 + 0.02 * rng.standard_t(4, 3000)
    loss[[900, 2100]] += 3.0
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s + 1, "loss": float(v), "grad_norm": 1.0 + 0.01 * (s % 7)}) + "\n"
                               for s, v in enumerate(loss)))
    seen = {}
    for mode in ("1", "0"):
        out = tmp_path / f"findings-{mode}.json"
        env = {**os.environ, P.ENV: mode}
        done = subprocess.run([sys.executable, "-c", AUDIT, str(metrics), str(out)], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=300, check=True)
        seen[mode] = (json.loads(done.stdout.splitlines()[-1]), json.loads(out.read_text()))
    assert seen["1"][0] == {"numba": False, "misses": {}}
    assert seen["0"][0]["numba"] is True
    assert [s["step"] for s in seen["1"][1]["spikes"]] == [901, 2101]  # the logged steps of rows 900 and 2100
    for section in ("spikes", "causes", "verdict", "oscillation"):
        assert seen["1"][1][section] == seen["0"][1][section], section


def test_a_build_is_not_started_twice_nor_after_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("FORENSICS_CACHE_DIR", str(tmp_path))
    place = P.folder()
    place.parent.mkdir(parents=True)
    lock = place.parent / f"{place.name}.building"
    cases = [  # (state, started)
        ("disabled", False),
        ("failed", False),
        ("fresh lock", False),
    ]
    for state, started in cases:
        monkeypatch.setattr(P, "_BUILD_STARTED", False)
        monkeypatch.setenv(P.ENV, "0" if state == "disabled" else "1")
        if state == "failed":
            place.mkdir()
            (place / "failed").write_text("no compiler\n")
        if state == "fresh lock":
            (place / "failed").unlink()
            lock.touch()
        assert P.start_build() is started, state
    monkeypatch.setattr(P, "_BUILD_STARTED", True)
    lock.unlink()
    assert P.start_build() is False  # once per process
