"""The command's process collects garbage in larger batches (forensics.__main__.size_this_process, which the
``forensics`` command calls and no import does); a caller's own choice wins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> str:
    """What a fresh interpreter running ``code`` prints."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=120
    ).stdout


def _threshold(prelude: str, module: str = "forensics.__main__", sized: bool = True) -> list[int]:
    size = f"; {module}.size_this_process()" if sized else ""
    return [int(x) for x in _python(f"import gc; {prelude}; import {module}{size}; print(*gc.get_threshold())").split()]


def test_the_command_raises_the_young_generation_and_keeps_the_older_ones():
    assert _threshold("gc.set_threshold(700, 7, 9)") == [50_000, 7, 9]


def test_a_caller_that_switched_collection_off_or_raised_it_further_keeps_its_setting():
    assert _threshold("gc.set_threshold(0)")[0] == 0
    assert _threshold("gc.set_threshold(200_000, 10, 10)") == [200_000, 10, 10]


def test_a_cyclic_garbage_of_the_command_is_still_collected():
    code = (
        "import gc, weakref; import forensics.__main__; forensics.__main__.size_this_process()\n"
        "class Node: pass\n"
        "a = Node(); a.self = a; probe = weakref.ref(a); del a\n"
        "junk = [[i] for i in range(700_000)]\n"  # allocations past the young generation's threshold
        "print(probe() is None)"
    )
    assert _python(code).strip() == "True"


def test_a_library_caller_of_the_cli_keeps_its_collector():
    """The interpreter's own defaults (they differ between Python versions), untouched by importing the CLI or the
    command's module."""
    defaults = [int(x) for x in _python("import gc; print(*gc.get_threshold())").split()]
    assert _threshold("pass", module="forensics.cli", sized=False) == defaults
    assert _threshold("pass", module="forensics.__main__", sized=False) == defaults
