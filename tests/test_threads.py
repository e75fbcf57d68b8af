"""Thread pools sized to the cores the process may use: affinity, cgroup quota, the user's own setting.

Each check runs in a fresh interpreter, since the pools are sized once, by the ``forensics`` command before its heavy
imports (forensics.__main__.size_this_process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from forensics._threads import POOLS, _cgroup_quota, free_cores, usable_cores

PROBE = """
import json, os, sys
if {cores!r} is not None:
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:{cores!r}]))
import forensics.__main__
forensics.__main__.size_this_process()  # what the command does first
import forensics._threads
import numba, threadpoolctl
from sklearn.cluster import KMeans  # noqa: F401  (loads OpenMP and BLAS as the clustering does)
import numpy as np
np.ones((4, 4)) @ np.ones((4, 4))
pools = {{p["internal_api"]: p["num_threads"] for p in threadpoolctl.threadpool_info()}}
print(json.dumps({{"env": {{k: os.environ.get(k) for k in {pools!r}}}, "numba": numba.get_num_threads(),
                  "pools": pools, "sized": forensics._threads.SIZED_TO}}))
"""


def _probe(cores: int | None = None, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in POOLS and k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(cores=cores, pools=list(POOLS))],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_pools_follow_the_cpu_affinity_not_the_machine():
    got = _probe(cores=1)
    assert set(got["env"].values()) == {"1"}  # what forensics set: OpenMP, BLAS, numba, numexpr
    assert got["numba"] == 1
    assert got["pools"] and set(got["pools"].values()) == {1}, got["pools"]  # OpenMP and BLAS alike


def test_the_users_own_setting_wins():
    got = _probe(OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    assert got["env"]["OMP_NUM_THREADS"] == "1" and got["numba"] == 1
    assert got["env"]["NUMEXPR_NUM_THREADS"] == str(got["sized"])  # the ones not set are still sized
    assert got["env"]["MKL_NUM_THREADS"] == "1"  # and BLAS to one thread


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs CPU affinity and two cores"
)
def test_blas_keeps_one_thread_whatever_the_cores_so_findings_do_not_follow_the_load():
    got = _probe(cores=2)
    assert got["env"]["OPENBLAS_NUM_THREADS"] == got["env"]["MKL_NUM_THREADS"] == "1"
    assert got["pools"]["openblas"] == 1, got["pools"]  # numpy's and scipy's OpenBLAS, as loaded
    assert got["env"]["OMP_NUM_THREADS"] == str(got["sized"])  # OpenMP still gets the free cores
    assert 1 <= got["sized"] <= usable_cores()


def test_a_cgroup_quota_caps_the_cores(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_quota(str(tmp_path)) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_quota(str(tmp_path)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert _cgroup_quota(str(v1)) == 2.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert _cgroup_quota(str(v1)) is None
    assert _cgroup_quota(str(tmp_path / "absent")) is None


def test_usable_cores_is_the_affinity_capped_by_the_quota(monkeypatch):
    import forensics._threads as threads

    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: None)
    assert threads.usable_cores() == affinity
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 1.5)  # a container given one and a half CPUs
    assert threads.usable_cores() == 1
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 0.25)  # never fewer than one
    assert threads.usable_cores() == 1


def test_cores_other_processes_run_on_are_not_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    load = tmp_path / "loadavg"
    load.write_text("0.50 0.40 0.30 1/82 12345\n")  # only this process runs
    assert free_cores(2, str(load)) == 2
    load.write_text("2.10 1.20 0.90 3/82 12345\n")  # this one and two busy neighbours on 2 CPUs
    assert free_cores(2, str(load)) == 1
    load.write_text("9.00 9.00 9.00 12/300 12345\n")  # never fewer than one
    assert free_cores(2, str(load)) == 1
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # a container with a 4-CPU quota on a busy 64-CPU host
    load.write_text("40.0 40.0 40.0 41/900 12345\n")
    assert free_cores(4, str(load)) == 4
    assert free_cores(3, str(tmp_path / "absent")) == 3
    load.write_text("garbage\n")
    assert free_cores(3, str(load)) == 3


SPIN_PROBE = """
import os, time
import forensics.__main__
forensics.__main__.size_this_process()  # sets the spin before numpy loads OpenBLAS
import numpy as np
np.ones((256, 256)) @ np.ones((256, 256))  # work for the pool's second thread, which then waits for more
time.sleep(0.4)  # longer than OpenBLAS's default spin (2**28 cycles: about 0.1 s on a 2.5 GHz core)
me = os.getpid()
ticks = [sum(int(v) for v in open(f"/proc/{me}/task/{t}/stat").read().rsplit(") ", 1)[1].split()[11:13])
         for t in os.listdir(f"/proc/{me}/task") if int(t) != me]
print(max(ticks) if ticks else -1)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads thread CPU times from Linux's /proc")
def test_idle_openblas_workers_sleep_instead_of_spinning():
    """numpy's import starts OpenBLAS's pool; with its default spin an idle worker burns about 0.1 s of a core
    (without ``forensics`` imported first, this probe's busiest worker measured 13-23 ticks on 2 cores)."""
    clean = {k: v for k, v in os.environ.items() if k not in POOLS and k != "OPENBLAS_THREAD_TIMEOUT"}
    env = {**clean, "OPENBLAS_NUM_THREADS": "2"}  # a second thread even on a 1-core runner: the user's value wins
    out = subprocess.run(
        [sys.executable, "-c", SPIN_PROBE], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert int(out.stdout.strip().splitlines()[-1]) <= 2  # clock ticks (10 ms each): asleep right after its work
    code = "import forensics.__main__ as m, os; m.size_this_process(); print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    spun = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**clean, "OPENBLAS_THREAD_TIMEOUT": "20"},
        timeout=60,
        check=True,
    )
    assert spun.stdout.strip() == "20"  # a user's own spin wins
