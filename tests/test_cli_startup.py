"""The command's process collects garbage in larger batches (forensics.__main__); a caller's own choice wins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _threshold(prelude: str) -> list[int]:
    code = f"import gc; {prelude}; import forensics.__main__; print(*gc.get_threshold())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=120).stdout
    return [int(x) for x in out.split()]


def test_the_command_raises_the_young_generation_and_keeps_the_older_ones():
    assert _threshold("gc.set_threshold(700, 7, 9)") == [50_000, 7, 9]


def test_a_caller_that_switched_collection_off_or_raised_it_further_keeps_its_setting():
    assert _threshold("gc.set_threshold(0)")[0] == 0
    assert _threshold("gc.set_threshold(200_000, 10, 10)") == [200_000, 10, 10]


def test_a_cyclic_garbage_of_the_command_is_still_collected():
    code = ("import gc, weakref; import forensics.__main__\n"
            "class Node: pass\n"
            "a = Node(); a.self = a; probe = weakref.ref(a); del a\n"
            "junk = [[i] for i in range(700_000)]\n"  # allocations past the young generation's threshold
            "print(probe() is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=120).stdout
    assert out.strip() == "True"


def test_a_library_caller_of_the_cli_keeps_its_collector():
    code = "import gc; import forensics.cli; print(*gc.get_threshold())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         timeout=120).stdout
    assert [int(x) for x in out.split()] == [700, 10, 10]
