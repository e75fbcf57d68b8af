"""A recorded plan across resumes: the last consumption of a step wins, and the rewind is recorded.

A run that crashed after step N and resumed from an earlier checkpoint (step r <= N) trains steps r..N again, and
what the model reflects is the *second* consumption of those steps, not the crashed process's. So a recorder that
resumes at step r first calls :func:`rewind_plan`: every recorded row of its rank at step >= r is removed from the
plan's parts (each part rewritten atomically, a part left empty deleted), and the rewind is appended to
``rewinds.json`` in the plan folder (the plan readers read ``*.parquet`` only), as the metrics' readers record
theirs: ``{rank, last_step, resumed_at, rows_replaced, sampler}``. ``sampler`` is the data position the trainer said it
resumed at, when the caller knows it: ``{epoch, batch_id, skipped_data}`` (``skipped_data``: whether the loader
skipped the batches already trained in that epoch, as HF's Trainer does unless ``ignore_data_skip``).

What the caller may rely on: a crash during the rewind leaves every part whole (old or new, never half), and the
plan afterwards holds each step once, from the process that consumed it last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from forensics.plan.recorder import STEP, recorded_parts

#: The file beside the plan's parts that lists its rewinds, oldest first.
REWINDS_FILE = "rewinds.json"


def rewind_plan(
    folder: str | Path,
    rank: int | None,
    resumed_at: int,
    sampler: dict[str, Any] | None = None,
    write_record: bool = True,
) -> dict[str, Any] | None:
    """Drop the rows of ``rank`` at step >= ``resumed_at`` from the parts in ``folder`` and record the rewind.

    Returns the rewind record, or ``None`` when nothing was recorded at or past ``resumed_at`` (a resume from the
    last step recorded: nothing to replace, nothing recorded). ``write_record``: append the record to
    :data:`REWINDS_FILE` (one process of a multi-rank run writes it; every rank drops its own rows).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder = Path(folder)
    replaced, last_step = 0, None
    for part in reversed(recorded_parts(folder, rank)):
        if STEP not in pq.read_schema(part).names:
            break  # a plan recorded without steps cannot be rewound by step
        table = pq.read_table(part)
        steps = table.column(STEP)
        later = pc.greater_equal(steps, resumed_at)
        n_later = int(pc.sum(later).as_py() or 0)
        if n_later == 0:
            break  # parts are in step order: nothing earlier is past the resume
        top = int(pc.max(steps).as_py())
        last_step = top if last_step is None else max(last_step, top)
        replaced += n_later
        kept = table.filter(pc.invert(later))
        if kept.num_rows == 0:
            part.unlink()
            continue
        tmp = part.with_name(part.name + ".tmp")
        with open(tmp, "wb") as fh:
            pq.write_table(kept, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, part)
    if replaced == 0:
        return None
    record = {
        "rank": rank,
        "last_step": last_step,
        "resumed_at": int(resumed_at),
        "rows_replaced": replaced,
        "sampler": sampler,
    }
    if write_record:
        records = read_rewinds(folder) + [record]
        path = folder / REWINDS_FILE
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    return record


def read_rewinds(folder: str | Path) -> list[dict[str, Any]]:
    """The rewinds recorded in a plan folder, oldest first (``[]`` when none, or when the plan is one file)."""
    path = Path(folder) / REWINDS_FILE
    if not path.is_file():
        return []
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []
