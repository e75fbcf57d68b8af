"""Compiled loops: how they are compiled, where their machine code is cached and what it is keyed by, and their
plain-Python references.

- :mod:`~forensics.compiled.key`: the cache's key (the package's version and the content of every one of its
  modules, numba's and Python's versions) and its folder; folders of other keys are pruned.
- :mod:`~forensics.compiled.jit`: ``@compiled()``, numba's ``njit`` with its on-disk cache in that folder.
- :mod:`~forensics.compiled.reference`: any compiled loop run as the plain Python it is written in.
- :mod:`~forensics.compiled.loops`: the loops the stages call by name; small inputs run the reference until the
  loop's machine code is cached, large ones compile it once (said on stderr with its time).

Nothing here runs at import: no environment variable, numba option or thread pool of the caller's process changes.
"""

from forensics.compiled.loops import compiled_state, loop

__all__ = ["compiled_state", "loop"]
