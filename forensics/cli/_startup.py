"""Imported first by the ``forensics`` command, before pandas and numba: the cyclic garbage collector's
young generation is made larger for the process.

A command imports ~1,000 modules, and every module, class and function it creates counts towards the collector's
default threshold of 700 allocations: a metrics-only audit of 120K steps ran 243 collections, 0.10-0.14 s of its
~1.0 s (measured with ``gc.callbacks``), each scanning objects that live as long as the process. With a young
generation of 50,000 it runs ~3. Cycles are still collected, only in larger batches, so a long audit's memory stays
bounded (peak RSS unchanged: 246-256 MiB against 252-262). Library callers (``import forensics``) keep their own
settings; this runs only in the command's process.
"""

from __future__ import annotations

import gc

#: Allocations (less deallocations) between young-generation collections; Python's default is 700.
YOUNG_GENERATION = 50_000

_threshold, *older = gc.get_threshold()
if _threshold and _threshold < YOUNG_GENERATION:  # 0: the caller switched collection off; keep that
    gc.set_threshold(YOUNG_GENERATION, *older)
