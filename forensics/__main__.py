"""The command's process starts here: ``python -m forensics`` and the ``forensics`` console script (:func:`run`).

Importing this module changes nothing; :func:`run` sizes the command's own process (:func:`size_this_process`)
before it imports the CLI, and with it numpy, numba and scikit-learn, whose pools read their sizes when they load.
"""

import gc
import sys

#: Allocations (less deallocations) between young-generation collections; Python's default is 700.
YOUNG_GENERATION = 50_000


def size_this_process() -> int:
    """What the ``forensics`` command sets for its own process, before its heavy imports; returns the thread count.

    - Thread pools sized to the cores it may use (:func:`forensics._threads.size_thread_pools`): OpenMP, BLAS and
      numba each size a pool to the whole machine, and on a small or shared machine they fight for the same cores
      (measured on 2 cores: a 3 s audit took 16-30 s). A value the user set wins.
    - A larger young generation for the cyclic garbage collector: a command imports ~1,000 modules, and every one
      counts towards the default threshold of 700 allocations: a metrics-only audit of 120K steps ran 243
      collections, 0.10-0.14 s of its ~1.0 s (measured with ``gc.callbacks``); with 50,000 it runs ~3. Cycles are
      still collected, in larger batches. A threshold the caller set higher, or 0 (collection off), is kept.

    A library caller who wants the same for its own process calls this before importing numpy; importing any module
    of the package never does it.
    """
    from forensics._threads import size_thread_pools

    young, *older = gc.get_threshold()
    if young and young < YOUNG_GENERATION:
        gc.set_threshold(YOUNG_GENERATION, *older)
    return size_thread_pools()


def run() -> None:
    """The console script: size this process, then run the command (:func:`forensics.cli.run`)."""
    size_this_process()
    from forensics.cli import run as run_command

    run_command()


__all__ = ["run", "size_this_process"]

if __name__ == "__main__":
    sys.exit(run())
