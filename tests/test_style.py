"""The house style holds on every file: ``ruff check`` (the lint rules of pyproject.toml) and ``ruff format --check``
(one layout, so a change shows only what it changes)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TREES = ["forensics", "tests", "bench", "fixtures", "docs", "app.py"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff")
    cmd = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    return subprocess.run([*cmd, *args, *TREES], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [("check",), ("format", "--check")], ids=["lint", "format"])
def test_ruff_finds_nothing(args):
    done = _ruff(*args)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
