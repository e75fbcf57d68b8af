"""TensorBoard event files, read directly (every scalar event, not a sample of them).

- :mod:`~forensics.sources.tensorboard.event_reader`: :class:`TensorBoardReader`, an ``events.out.tfevents.*`` file
  or a folder of them (files in the order they were started, subfolders as tag prefixes, both scalar encodings);
- :mod:`~forensics.sources.tensorboard.tfrecord`: the TFRecord framing under it (both checksums of every record,
  damage skipped, a record still being written left for the next read).
"""

from forensics.sources.tensorboard.event_reader import TensorBoardReader, event_files

__all__ = ["TensorBoardReader", "event_files"]
