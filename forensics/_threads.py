"""Thread pools sized to the cores this process may use, before numpy, numba or scikit-learn start theirs: what the
``forensics`` command does for its own process (:func:`forensics.__main__.size_this_process`), never an import.

OpenMP, OpenBLAS/MKL and numba each size a pool to the whole machine, and on a small or shared machine they then
fight for the same cores (measured on 2 cores: a 3 s audit took 16-30 s). The cores a process may use are its CPU
affinity, capped by a cgroup CPU quota (containers, CI runners), less the cores other processes are running on
when it starts (a loaded machine: :func:`free_cores`); BLAS keeps one thread, so the findings do not depend on
the load (:data:`BLAS_POOLS`). A value the user set wins; idle OpenMP and OpenBLAS threads
sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, ``OPENBLAS_THREAD_TIMEOUT``), so a busy neighbour is not
slowed by ours.
"""

from __future__ import annotations

import math
import os

POOLS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
#: The BLAS pools, one thread unless the user says otherwise: a threaded BLAS splits a product's sum by its thread
#: count, so the pool size, which follows the load, changed the findings' last digits (the full demo's harmful-sample
#: scores differed between 1 and 2 threads, 1 run in 5). Nothing the audit multiplies is large enough to gain from a
#: second thread: its first audit of the full demo, clusters fitted, 8.1-8.8 s with one, 8.0-8.2 s with two.
BLAS_POOLS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on: its affinity, capped by a cgroup v2/v1 CPU quota; at least 1."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return max(1, n)


def _cgroup_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup's quota allows (``cpu.max`` of v2, else ``cpu.cfs_quota_us / cpu.cfs_period_us`` of v1); None
    when unlimited or unknown."""
    try:
        with open(f"{root}/cpu.max", encoding="ascii") as fh:
            limit, period = fh.read().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open(f"{root}/cpu/cpu.cfs_quota_us", encoding="ascii") as fh:
            limit = int(fh.read())
        with open(f"{root}/cpu/cpu.cfs_period_us", encoding="ascii") as fh:
            period = int(fh.read())
        return None if limit <= 0 else limit / period
    except (OSError, ValueError):
        return None


def free_cores(usable: int, loadavg: str = "/proc/loadavg") -> int:
    """Of the ``usable`` cores, those no other process is running on right now: the machine's online CPUs less the
    runnable tasks other than this one (the fourth field of ``/proc/loadavg``, sampled once), capped by ``usable``,
    at least 1; ``usable`` where the count is unknown (not Linux).

    Measured on 2 cores with one busy process per core (``bench_audit_process.py``'s load): with pools of 2 threads
    the small demo's audit took 1.8-6.7 s over 10 runs; with 1 thread, 2.4-3.4 s. A parallel region whose second
    thread waits for a core another process holds stalls the whole region.
    """
    try:
        with open(loadavg, encoding="ascii") as fh:
            running = int(fh.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return usable
    online = os.cpu_count() or usable
    return max(1, min(usable, online - max(0, running - 1)))


#: How long an idle OpenBLAS worker spins before it sleeps, as a power of two of CPU cycles (OpenBLAS clamps it to
#: 4..30): the shortest. Its default, 28 (about 0.1 s), made numpy's import alone burn 0.1 s of a second core on a
#: 2-core machine. The small demo's ``tag``, medians of 6 alternated runs: 1.06 -> 0.89 s of CPU, 0.99 -> 0.90 s wall;
#: its first audit (clusters fitted, BLAS used), 3 runs: 5.64 -> 5.08 s of CPU, 6.62 -> 5.94 s wall.
OPENBLAS_SPIN = "4"

#: The pool size the ``forensics`` command chose for its process (None in any other process).
SIZED_TO: int | None = None


def size_thread_pools() -> int:
    """Set each pool's size to the :func:`free_cores` of :func:`usable_cores` where the user has not (the BLAS pools
    to one: :data:`BLAS_POOLS`); return that size."""
    global SIZED_TO
    n = SIZED_TO = free_cores(usable_cores())
    for var in POOLS:
        os.environ.setdefault(var, "1" if var in BLAS_POOLS else str(n))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("KMP_BLOCKTIME", "0")
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_SPIN)
    return n
