"""Apply a skip list of sample ids (``forensics skip CASE --format ids -o skip.json``) to a training dataset.

:func:`exclude_samples` takes what a training script holds, in one line, and never changes the dataset's rows:

- a Hugging Face ``datasets.Dataset``: a new dataset without those rows (``Dataset.filter`` on its ``sample_id``
  column, else ``Dataset.select`` on the row index: the ids the recorder wrote, see
  :func:`forensics.integrations._case.sample_ids_of`);
- a Lightning ``LightningDataModule``: the same object, whose datasets (the attributes holding one, as ``setup``
  leaves them) are replaced by filtered ones after each ``setup``, so ``trainer.fit(model, dm)`` trains without
  the samples;
- any other map-style dataset (``len`` and ``dataset[i]``, e.g. a ``torch.utils.data.Dataset``): a
  ``torch.utils.data.Subset`` of the rows kept (a plain index wrapper when torch is not installed).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError
from forensics.integrations._case import ID_COLUMN, _columns, sample_ids_of


def read_sample_ids(path_or_ids: str | Path | Iterable[int]) -> set[int]:
    """The sample ids of a skip list file (``{"sample_ids": [...]}``), or of the ids given directly."""
    if not isinstance(path_or_ids, (str, Path)):
        return {int(i) for i in path_or_ids}
    path = Path(path_or_ids)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ForensicsError(f"{path}: not a skip list of `forensics skip --format ids` ({exc})") from exc
    ids = doc.get("sample_ids") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ForensicsError(
            f'{path}: expected {{"sample_ids": [whole numbers], ...}} '
            "(`forensics skip CASE --format ids -o FILE` writes it)"
        )
    return set(ids)


def exclude_samples(dataset: Any, skip: str | Path | Iterable[int]) -> Any:
    """``dataset`` without the samples of the skip list ``skip`` (a path, or the ids); see the module docstring."""
    ids = read_sample_ids(skip)
    if _is_datamodule(dataset):
        return _exclude_from_datamodule(dataset, ids)
    return _exclude_from_dataset(dataset, ids)


def kept_indices(dataset: Any, ids: set[int]) -> list[int]:
    """Row indices of ``dataset`` whose sample id (its ``sample_id`` field, else the row index) is not in ``ids``."""
    try:
        n = len(dataset)
    except TypeError as exc:
        raise ForensicsError(
            "exclude_samples: the dataset has no length (an IterableDataset); filter its stream "
            "by sample id instead, or give a map-style dataset"
        ) from exc
    own = sample_ids_of(dataset, n, "exclude_samples")
    row_ids = range(n) if own is None else own.tolist()
    return [i for i, sid in enumerate(row_ids) if int(sid) not in ids]


def _exclude_from_dataset(dataset: Any, ids: set[int]) -> Any:
    columns = _columns(dataset)
    if columns is not None and hasattr(dataset, "filter") and hasattr(dataset, "select"):
        if ID_COLUMN in columns:
            return dataset.filter(lambda sid: int(sid) not in ids, input_columns=ID_COLUMN)
        return dataset.select(kept_indices(dataset, ids))
    keep = kept_indices(dataset, ids)
    try:
        from torch.utils.data import Subset
    except ImportError:
        return _Subset(dataset, keep)
    return Subset(dataset, keep)


class _Subset:
    """The rows ``indices`` of a map-style dataset, without torch (what ``torch.utils.data.Subset`` does)."""

    def __init__(self, dataset: Any, indices: list[int]) -> None:
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.indices[i]]


def _is_datamodule(obj: Any) -> bool:
    return any(k.__name__ == "LightningDataModule" for k in type(obj).__mro__)


def _dataset_attributes(dm: Any) -> list[str]:
    """The DataModule's attributes holding a dataset (map-style: ``len`` and ``[i]``; not a tensor, list or str)."""
    names = []
    for name, value in vars(dm).items():
        if name.startswith("_") or isinstance(value, (str, bytes, list, tuple, dict)) or hasattr(value, "dtype"):
            continue
        if hasattr(value, "__len__") and hasattr(value, "__getitem__"):
            names.append(name)
    return names


def _exclude_from_datamodule(dm: Any, ids: set[int]) -> Any:
    def filter_datasets() -> None:
        for name in _dataset_attributes(dm):
            value = getattr(dm, name)
            if not getattr(value, "_forensics_excluded", False):
                filtered = _exclude_from_dataset(value, ids)
                _mark(filtered)
                setattr(dm, name, filtered)

    original = dm.setup

    @functools.wraps(original)
    def setup(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        filter_datasets()
        return result

    dm.setup = setup
    filter_datasets()
    return dm


def _mark(dataset: Any) -> None:
    """Remember a dataset was filtered already (a second ``setup`` that keeps it must not filter it again)."""
    try:
        dataset._forensics_excluded = True
    except AttributeError:  # a type without a __dict__: filtering again is idempotent anyway
        pass
