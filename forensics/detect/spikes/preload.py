"""Loading the spike rule's compiled kernel on a thread while the dashboard reads the log it opens (a preload of
numba's machine code, not the learning-rate warm-up the findings speak of).

numba's first use in a process costs a few tenths of a second before any row is judged (its import, its CPU target
and LLVM, then the cached kernel itself). Much of it is spent in C (LLVM, the dynamic loader, reading the cache) and
pyarrow parses with the GIL released, so started before the log is read, the two overlap (opening a 1M-step case:
1.85 -> 1.72 s, mean of 4 alternated runs). The audit does not use it: its rule set imports the kernel right away,
and on a 120K-step log no gain was measured. The thread changes no result: the detector loads the kernel itself
when the thread has not finished (Python's import lock and numba's compiler lock make the two wait for each other),
and a failure on the thread is left for the detector to raise where it can be reported.
"""

from __future__ import annotations

import threading

import numpy as np

_STARTED: threading.Thread | None = None


def _load() -> None:
    try:
        import pandas as pd

        from forensics.detect.spikes.detector import SpikeDetector

        steps = np.arange(64, dtype=np.int64)
        rows = pd.DataFrame({"step": steps, "loss": 1.0 + 0.01 * np.sin(steps)})
        detector = SpikeDetector("loss")
        detector.update(rows)
        detector.finish()
    except Exception:  # noqa: BLE001 - the detector raises it again, in the main thread, with its context
        pass


def preload_kernel() -> threading.Thread:
    """Start loading the kernel on a daemon thread (once per process); returns that thread."""
    global _STARTED
    if _STARTED is None:
        _STARTED = threading.Thread(target=_load, name="forensics-kernel-preload", daemon=True)
        _STARTED.start()
    return _STARTED
