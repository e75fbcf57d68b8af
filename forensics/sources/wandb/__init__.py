"""W&B runs: read from their ``.wandb`` files on disk, or through the W&B public API.

- :mod:`~forensics.sources.wandb.run_reader`: :class:`WandbRunReader`, a ``.wandb`` file, a run folder or a
  ``wandb/`` folder of several runs (which run, resumed folders in time order, config and summary, damage);
- :mod:`~forensics.sources.wandb.scanner`: the compiled path that reader takes over a file's well-formed stretches
  (windows, a second core reading ahead, buffers), handing anything irregular to the exact Python reader;
- :mod:`~forensics.sources.wandb.scan_kernel`: the numba loop the scanner runs over each window's bytes (framing,
  CRC-32, the protobuf wire format);
- :mod:`~forensics.sources.wandb.record_log`: the file format read exactly in Python (header, LevelDB-log framing,
  resynchronising after damage) and the decoding of a record's items that both readers share;
- :mod:`~forensics.sources.wandb.api_reader`: :class:`WandbApiReader`, every history row of a run from the server.

Both readers are plain imports (``from forensics.sources.wandb import WandbRunReader``); the API reader imports the
``wandb`` client and its progress bars only when it reads, so reading a run file never pays for them. An API read
does load the run-file reader's compiled scanner with the package (measured: ~0.2 s of CPU, next to a network read).
"""

from __future__ import annotations

from forensics.sources.wandb.api_reader import WandbApiReader
from forensics.sources.wandb.run_reader import WandbRunReader

__all__ = ["WandbApiReader", "WandbRunReader"]
