"""How the package's compiled loops load (forensics.compiled.jit): a cache hit skips numba's target refresh, a miss
still compiles through numba's own path, and neither imports scipy.linalg. Each case is a fresh process, as a user's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Modules only numba's refresh imports (its lowering registries), and the one its BLAS probe would.
REFRESH_ONLY = ("numba.np.npyimpl", "numba.np.arraymath", "numba.cpython.unicode")

LOOP = """
import numpy as np
from forensics.compiled.jit import compiled

@compiled()
def running_max(values, out):
    best = -np.inf
    for i in range(values.shape[0]):
        if values[i] > best:
            best = values[i]
        out[i] = best
    return best
"""

CALL = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from tiny_loop import running_max
values = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0])
out = np.empty_like(values)
best = running_max(values, out)
print(json.dumps({"best": best, "out": out.tolist(), "hits": sum(running_max.stats.cache_hits.values()),
                  "misses": sum(running_max.stats.cache_misses.values()),
                  "loaded": {m: m in sys.modules for m in WATCHED + ("scipy.linalg",)}}))
""".replace("WATCHED", repr(REFRESH_ONLY))


def _run(code: str, *args: str, cache: Path | None = None, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **extra}
    if cache is not None:
        env["FORENSICS_CACHE_DIR"] = str(cache)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=True
    )


def test_a_miss_compiles_through_numba_and_a_hit_loads_without_the_refresh(tmp_path):
    (tmp_path / "tiny_loop.py").write_text(LOOP)
    cache = tmp_path / "numba-cache"
    first = json.loads(_run(CALL, str(tmp_path), cache=cache).stdout)
    second = json.loads(_run(CALL, str(tmp_path), cache=cache).stdout)
    assert first["out"] == second["out"] == [3.0, 3.0, 4.0, 4.0, 5.0, 9.0, 9.0, 9.0]
    assert first["best"] == second["best"] == 9.0
    # the first process compiled (numba's own path: the refresh ran) and saved; the second loaded that code
    assert (first["misses"], first["hits"]) == (1, 0)
    assert (second["misses"], second["hits"]) == (0, 1)
    assert first["loaded"]["numba.np.npyimpl"] is True
    assert not any(second["loaded"].values()), second["loaded"]
    # the compile's refresh imported numba's array library with its BLAS probe answered "no"
    assert first["loaded"]["scipy.linalg"] is False


AUDIT = """
import contextlib, io, json, sys
from forensics.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    assert main(["audit", "--metrics", sys.argv[1], "--json", sys.argv[2], "--no-html"]) == 0
print(json.dumps({m: m in sys.modules for m in WATCHED}))
""".replace("WATCHED", repr(REFRESH_ONLY))


def test_a_metrics_only_audit_with_warm_caches_never_refreshes_numba(tmp_path):
    """The audit's loops (the spike kernel, compiled whatever the run's length) come from the cache; the findings are
    the compiling run's."""
    rows = [
        {"step": s, "loss": 2.0 - s / 400 + (0.02 if s % 3 else -0.02) + (2.5 if s == 300 else 0.0)}
        for s in range(1, 601)
    ]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "numba-cache"
    findings = []
    for i in range(2):
        out = tmp_path / f"findings{i}.json"
        done = _run(AUDIT, str(metrics), str(out), cache=cache, FORENSICS_COMPILE_FROM="0")
        loaded = json.loads(done.stdout.splitlines()[-1])
        findings.append(json.loads(out.read_text()))
    assert not any(loaded.values()), loaded
    assert [s["step"] for s in findings[1]["spikes"]] == [300]
    assert findings[0]["spikes"] == findings[1]["spikes"] and findings[0]["causes"] == findings[1]["causes"]
