"""Building the ahead-of-time module of :mod:`forensics._precompiled`: record the argument types the loops' callers
pass, compile each loop for each of them with ``numba.pycc``, and write the module and its manifest whole.

Run as ``python -m forensics._precompiled_build`` (the foreground build, with its progress), or started detached by
:func:`forensics._precompiled.start_build` (``--lock``: the lock file it removes when done; a failure is written to
``failed`` in the key's folder, so that it is not retried for that key). The log of the last build is
``<key>.log`` beside the folder.

The signatures come from the real callers, not a list written by hand: a small metrics-only audit (a spike, a NaN, a
resumed step), detectors with buckets and support, fed whole and in chunks as a live run feeds them, and rolling
medians of every window shape. A caller that one day passes another type still works (its call runs the JIT) and is
counted in :data:`forensics._precompiled.misses`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from forensics import _precompiled as P


def build(place: Path | None = None, log: Callable[[str], None] = lambda _: None) -> Path:
    """Compile every loop of :data:`~forensics._precompiled.LOOPS` for the signatures its callers use into ``place``
    (default :func:`~forensics._precompiled.folder`), written whole: a temporary folder renamed. Returns the folder.
    Raises what pycc raises (no C compiler, an unsupported type)."""
    place = P.folder() if place is None else place
    log("recording the loops' signatures from their callers")
    recorded = record_signatures()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation: the JIT stays the fallback when it goes
        from numba.pycc import CC
    place.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{place.name}-", dir=place.parent))
    try:
        cc = CC(P.MODULE)
        cc.output_dir = str(work)
        cc.verbose = False
        cc.use_nrt = False  # as the JIT compiles them (forensics._numba): nothing inside allocates, and counting
        # references on every array access was 2/3 of the spike kernel's time
        loops: dict[str, dict[str, str]] = {}
        for name, calls in sorted(recorded.items()):
            function = P._jit(name).py_func
            for i, (print_, signature) in enumerate(sorted(calls.items())):
                export = f"{name}_{i}"
                cc.export(export, signature)(function)
                loops.setdefault(name, {})[print_] = export
        log(f"compiling {sum(map(len, loops.values()))} signatures of {len(loops)} loops (numba.pycc)")
        with warnings.catch_warnings(), _releasing_the_gil():
            warnings.simplefilter("ignore")
            cc.compile()
        built = [p.name for p in work.iterdir() if p.name.startswith(P.MODULE)]
        if len(built) != 1:
            raise RuntimeError(f"pycc wrote {built}, expected one extension module")
        (work / P.MANIFEST).write_text(json.dumps({"file": built[0], "loops": loops}, indent=1, sort_keys=True))
        if place.exists():
            shutil.rmtree(place)
        os.replace(work, place)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return place


@contextlib.contextmanager
def _releasing_the_gil() -> Iterator[None]:
    """pycc's wrappers release the GIL around each loop, as the JIT's ``nogil`` loops do (none of them touches a
    Python object): a dashboard's reading thread runs while a detector judges. pycc has no option for it; its
    compile flags are made with the flag set."""
    import numba.pycc.compiler as pycc_compiler

    plain = pycc_compiler.Flags

    class Flags(plain):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.release_gil = True

    pycc_compiler.Flags = Flags
    try:
        yield
    finally:
        pycc_compiler.Flags = plain


class _Recorder:
    """A JIT loop that notes each call's fingerprint and numba signature (while the build exercises the callers)."""

    def __init__(self, recorded: dict[str, dict[str, Any]], name: str, dispatcher: Any) -> None:
        self.recorded, self.name, self.dispatcher = recorded, name, dispatcher

    def __call__(self, *args: Any) -> Any:
        import numba

        result = self.dispatcher(*args)
        types = tuple(numba.typeof(a) for a in args)
        self.recorded.setdefault(self.name, {})[P.fingerprint(args)] = self.dispatcher.overloads[types].signature
        return result


def record_signatures() -> dict[str, dict[str, Any]]:
    """Per loop, the signatures its callers use, by fingerprint: the real callers run on small inputs (the JIT)."""
    recorded: dict[str, dict[str, Any]] = {}
    saved = dict(P._CHOSEN)
    P._CHOSEN.clear()
    P.RECORDING = lambda name, dispatcher: _Recorder(recorded, name, dispatcher)
    try:
        _exercise_callers()
    finally:
        P.RECORDING = None
        P._CHOSEN.clear()
        P._CHOSEN.update(saved)
    missing = set(P.LOOPS) - set(recorded)
    if missing:
        raise RuntimeError(f"the callers never ran {sorted(missing)}: nothing to compile them for")
    return recorded


def _exercise_callers() -> None:
    """A metrics-only audit of a small run (a spike, a NaN, a resumed step), then detectors with buckets and support,
    whole and in chunks as a live run feeds them, and rolling medians: what the callers pass, in every form."""
    import pandas as pd

    from forensics.cli import main
    from forensics.detect.spikes.detector import SpikeDetector
    from forensics.stats import rolling_median

    steps = np.arange(1, 801)
    rng = np.random.default_rng(0)
    loss = 2.0 * np.exp(-steps / 300) + 0.9 + 0.02 * rng.standard_normal(len(steps))
    loss[400] += 3.0
    loss[500] = np.nan
    grad = 1.0 + 0.1 * np.abs(rng.standard_normal(len(steps)))
    grad[398] += 5.0
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        rows = [{"step": int(s), "loss": float(v), "grad_norm": float(g), "learning_rate": 1e-4}
                for s, v, g in zip(steps, loss, grad)]
        rows.insert(300, dict(rows[290]))  # a resumed step
        metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(["audit", "--metrics", str(metrics), "--json", str(Path(tmp) / "f.json"), "--no-html"])
    frame = pd.DataFrame({"step": steps, "loss": loss})
    tags = pd.DataFrame({"step": steps, "bucket": steps % 3})
    for table in (frame, frame.astype({"step": "float64"})):
        SpikeDetector("loss").detect(table, tags, support=[399])
        live = SpikeDetector("loss")
        for start in range(0, len(table), 97):
            live.update(table.iloc[start:start + 97])
        live.finish()
    for values in (loss, loss.astype(np.float32), loss[::2]):
        rolling_median(values, 31)
        rolling_median(values, 8, center=False, min_periods=None)


def main(argv: list[str] | None = None) -> int:
    """The foreground build (progress on stderr; exit 2 with the reason when it fails) or, with ``--lock``, the
    background one a first run started."""
    parser = argparse.ArgumentParser(prog="python -m forensics._precompiled_build",
                                     description="Compile the loops of a metrics-only audit ahead of time.")
    parser.add_argument("--lock", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    background = args.lock is not None
    os.environ[P.ENV] = "0"  # the build's own callers run the JIT
    place = P.folder()
    log_path = place.parent / f"{place.name}.log"
    started = time.perf_counter()
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log_file:
            def log(message: str) -> None:
                log_file.write(message + "\n")
                log_file.flush()
                if not background:
                    print(message, file=sys.stderr)

            try:
                build(place, log)
            except Exception as error:  # noqa: BLE001 - any failure leaves the JIT in charge, with its reason
                log(f"failed: {type(error).__name__}: {error}")
                if background:
                    place.mkdir(parents=True, exist_ok=True)
                    (place / "failed").write_text(f"{type(error).__name__}: {error}\nsee {log_path}\n")
                else:
                    print(f"error: could not compile the loops ahead of time ({error}); numba's JIT stays in use. "
                          f"Log: {log_path}", file=sys.stderr)
                return 2
            log(f"built {place} in {time.perf_counter() - started:.1f} s")
    except OSError as error:
        print(f"error: could not write the compiled loops under {place.parent}: {error}", file=sys.stderr)
        return 2
    finally:
        if args.lock:
            Path(args.lock).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
