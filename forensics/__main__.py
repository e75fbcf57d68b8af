"""The command's process starts here: ``python -m forensics`` and the ``forensics`` console script (``run``).

Before anything else is imported, the cyclic garbage collector's young generation is made larger for this process.
A command imports ~1,000 modules (pandas, numba, numpy), and every module, class and function they create counts
towards the default threshold of 700 allocations: a metrics-only audit of 120K steps ran 243 collections, 0.10-0.14 s
of its ~1.0 s (measured with ``gc.callbacks``), each scanning objects that live as long as the process. With a young
generation of 50,000 it runs ~3. Cycles are still collected, in larger batches: a cycle that survives one young
collection waits ~500K allocations for the next older one instead of ~7K, which is what bounds the memory cost (peak
RSS of the metrics-only audit 246-256 MiB against 252-262; of the full demo's audit with its report 522 MiB against
520). Only the command's process is affected: library callers (``import forensics``, ``forensics.cli.main``) keep
their settings, and a threshold the caller set higher, or 0 (collection off), is kept.
"""

import gc

#: Allocations (less deallocations) between young-generation collections; Python's default is 700.
YOUNG_GENERATION = 50_000

_young, *_older = gc.get_threshold()
if _young and _young < YOUNG_GENERATION:
    gc.set_threshold(YOUNG_GENERATION, *_older)

from forensics.cli import run  # noqa: E402 - after the collector is set, before pandas and numba are imported

__all__ = ["run"]

if __name__ == "__main__":
    run()
