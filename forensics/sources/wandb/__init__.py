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

The two readers are imported on first use (``from forensics.sources.wandb import WandbRunReader`` works): reading a
run file never pays for the API client and its progress bars, nor an API read for the compiled loop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WandbApiReader", "WandbRunReader"]


def __getattr__(name: str) -> Any:
    if name == "WandbRunReader":
        from forensics.sources.wandb.run_reader import WandbRunReader

        return WandbRunReader
    if name == "WandbApiReader":
        from forensics.sources.wandb.api_reader import WandbApiReader

        return WandbApiReader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
