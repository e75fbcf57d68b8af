"""The compiled loops the stages call by name, and which version of each runs.

numba compiles a loop the first time a process calls it and caches the machine code (:mod:`forensics.compiled.jit`,
keyed by :mod:`forensics.compiled.key`). Compiling is slow next to a small run: the spike kernel's ~40 functions take
~14 s, where judging the small demo's 3,500 steps takes ~0.05 s compiled and ~0.5 s as plain Python. So a loop runs:

- compiled, when its machine code is in the cache (or this process already compiled it);
- as its plain-Python reference (:mod:`forensics.compiled.reference`, the same code) while it is not, until the
  process has given that loop :data:`COMPILE_FROM` rows in all (where :data:`LOOPS` allows it);
- else compiled there and then, once for this version of the package, said on stderr with the time it took.

Counting the rows a process gives a loop, not one call's, is what compiles a loop called many times on small inputs
(the what-if packs ~150 orders of a dataset).

Both give the same results (property tests compare them), so which one ran never shows in a finding.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The loops by name: (module, function) of the compiled version, what the loop is (for the compile notice), and
#: whether small inputs may run its plain-Python reference (the ``.wandb`` scanner's walks every byte of a file:
#: as plain Python it would take minutes where its compile takes seconds).
LOOPS: dict[str, tuple[str, str, str, bool]] = {
    "spike_rows": ("forensics.detect.spikes.kernel", "run_rows", "the spike detector", True),
    "spike_flush": ("forensics.detect.spikes.kernel", "flush", "the spike detector's last events", True),
    "rolling_medians": ("forensics.stats.fenwick_median_kernel", "medians", "the rolling median", True),
    "greedy_cuts": ("forensics.plan.greedy_kernel", "greedy_cuts", "the greedy batch packer", True),
    "wandb_scan": ("forensics.sources.wandb.scan_kernel", "scan", "the .wandb file reader", False),
    "wandb_pivot": ("forensics.sources.wandb.scan_kernel", "pivot", "the .wandb file reader's table", False),
}
#: Inputs of at least this many rows compile a loop that is not cached yet. The plain spike kernel judges ~7,000
#: rows a second, so 20,000 rows cost about what its compile costs; a run that long is worth compiling for, once.
COMPILE_FROM = 20_000
#: Environment variable that replaces :data:`COMPILE_FROM` (0: compile every loop at its first call).
COMPILE_FROM_ENV = "FORENSICS_COMPILE_FROM"
#: Marker files, in the key's folder, of the loops whose machine code this version has cached.
WARM_FOLDER = "warm"

_COMPILED: set[str] = set()
#: Rows each loop was given in this process as plain Python.
_PLAIN_ROWS: dict[str, int] = {}


def loop(name: str, rows: int) -> Callable[..., Any]:
    """The loop ``name`` of :data:`LOOPS` for an input of ``rows`` rows: compiled when cached (or the rows this
    process gave it reach :data:`COMPILE_FROM`), else its plain-Python reference."""
    module, function, _, plain_below = LOOPS[name]
    dispatcher = getattr(importlib.import_module(module), function)
    if name in _COMPILED or _is_warm(name):
        _COMPILED.add(name)
        return dispatcher
    given = _PLAIN_ROWS.get(name, 0) + int(rows)
    if plain_below and given < compile_from():
        from forensics.compiled.reference import reference

        _PLAIN_ROWS[name] = given
        return reference(dispatcher)
    return _compiling(name, dispatcher)


def compile_from() -> int:
    """:data:`COMPILE_FROM`, or ``$FORENSICS_COMPILE_FROM`` when it holds a whole number."""
    value = os.environ.get(COMPILE_FROM_ENV, "").strip()
    return int(value) if value.isdigit() else COMPILE_FROM


def _compiling(name: str, dispatcher: Any) -> Callable[..., Any]:
    """The dispatcher, with its first call timed and said on stderr (a compile, or a load numba found cached)."""

    def first_call(*args: Any) -> Any:
        what = LOOPS[name][2]
        if name not in _COMPILED:
            print(
                f"forensics: compiling {what} (once for this version; cached in {_folder()})",
                file=sys.stderr,
                flush=True,
            )
            started = time.perf_counter()
            result = dispatcher(*args)
            _COMPILED.add(name)
            _mark_warm(name)
            print(f"forensics: compiled {what} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
            return result
        return dispatcher(*args)

    return first_call


def _folder() -> Path:
    from forensics.compiled.key import compiled_root, package_key

    return compiled_root() / package_key()


def _is_warm(name: str) -> bool:
    return (_folder() / WARM_FOLDER / name).exists()


def _mark_warm(name: str) -> None:
    from forensics.compiled.key import key_folder

    with contextlib.suppress(OSError):  # a cache that cannot be written only costs the next run a compile
        (key_folder() / WARM_FOLDER).mkdir(exist_ok=True)
        (key_folder() / WARM_FOLDER / name).touch()


def compiled_state() -> dict[str, Any]:
    """Where the compiled code's cache is and which loops are warm: ``{cache, warm, loops: {name: bool}}``
    (``warm``: every loop cached)."""
    loops = {name: _is_warm(name) for name in LOOPS}
    return {"cache": str(_folder()), "warm": all(loops.values()), "loops": loops}
