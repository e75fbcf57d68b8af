"""Importing the package changes nothing in the importing process: a training script that imports the recorder keeps
its environment, its torch threads, its collector and signal handlers, and starts no thread or process.

Each check runs in a fresh interpreter (what a process had before the import is the point)."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import forensics

ROOT = Path(__file__).resolve().parent.parent

#: Modules that are programs, not libraries: importing them runs them.
PROGRAMS = {"forensics.dashboard.app"}


def _modules() -> list[str]:
    found = ["forensics"]
    for info in pkgutil.walk_packages(forensics.__path__, "forensics."):
        if info.name not in PROGRAMS:
            found.append(info.name)
    return sorted(found)


STATE = """
import gc, json, os, signal, sys, threading

def state():
    import torch
    return {"env": dict(os.environ), "torch_threads": torch.get_num_threads(),
            "torch_interop": torch.get_num_interop_threads(), "gc": list(gc.get_threshold()),
            "gc_enabled": gc.isenabled(),
            "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)},
            "threads": sorted(t.name for t in threading.enumerate()),
            # the package's own import hooks (a library it imports, six say, may add one of its own)
            "import_hooks": [repr(f) for f in [*sys.meta_path, *sys.path_hooks]
                             if getattr(type(f), "__module__", "").startswith("forensics")
                             or getattr(f, "__module__", "").startswith("forensics")],
            "children": _children()}

def _children():
    me = str(os.getpid())
    kids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()[1] == me:
                    kids.append(pid)
            except OSError:
                pass
    return kids

changed = {}
import torch  # torch's own import hooks are the baseline, not a change
before = state()
for name in sys.argv[1:]:
    __import__(name)
    now = state()
    diff = {k: (before[k], now[k]) for k in before if before[k] != now[k]}
    if diff:
        changed[name] = diff
        before = now
print(json.dumps(changed, default=str))
"""


def _changes(modules: list[str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "OPENBLAS_", "NUMBA_"))}
    done = subprocess.run(
        [sys.executable, "-c", STATE, *modules], capture_output=True, text=True, cwd=ROOT, env=clean, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_any_module_changes_nothing_in_the_process():
    modules = _modules()
    assert len(modules) > 150  # the walk found the package, not a stub
    assert _changes(modules) == {}


TORCH_THREADS = """
import sys
for name in sys.argv[1:]:
    __import__(name)
import torch
print(torch.get_num_threads(), torch.get_num_interop_threads())
"""


@pytest.mark.parametrize(
    "module", ["forensics.integrations.hf", "forensics.integrations.torch", "forensics.plan.recorder", "forensics"]
)
def test_torch_imported_after_the_recorder_keeps_its_threads(module):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "OPENBLAS_", "NUMBA_"))}

    def threads(*imports: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", TORCH_THREADS, *imports],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=clean,
            timeout=300,
            check=True,
        ).stdout.strip()

    assert threads(module) == threads()


def test_no_process_outlives_the_command(tmp_path):
    """An audit that compiles its loops (the first long run) leaves nothing running in its session once it exits."""
    rows = "".join(f'{{"step": {s}, "loss": {2.0 - s / 1000 + (1.5 if s == 300 else 0.0)}}}\n' for s in range(600))
    (tmp_path / "m.jsonl").write_text(rows)
    env = {**os.environ, "FORENSICS_CACHE_DIR": str(tmp_path / "cache"), "FORENSICS_COMPILE_FROM": "0"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forensics",
            "audit",
            "--metrics",
            str(tmp_path / "m.jsonl"),
            "--json",
            str(tmp_path / "f.json"),
            "--no-html",
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert "compiled the spike detector in" in err  # it did compile: the case a background build once served
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == proc.pid:  # the session the command led
                left.append(pid)
    assert left == []
