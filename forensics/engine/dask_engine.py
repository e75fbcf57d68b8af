"""The engine past one machine: the same counts as dask.dataframe over the plan's Parquet (local paths, or
``s3://``, ``gs://`` ... through fsspec) on a ``distributed`` cluster: the one at ``scheduler`` (a Slurm or
Kubernetes cluster's scheduler address), else a local one of the machine's cores under ``memory_limit``.
Only the counts (:mod:`forensics.engine.base`) come back to this process. Needs the ``[dask]`` extra.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from forensics.engine.base import (
    CHUNK_ROWS,
    SAMPLE_BASE,
    Engine,
    EpochCounts,
    GateCounts,
    LabelPairs,
    PairCounts,
    PlanInput,
    StepCounts,
    no_steps,
)
from forensics.engine.pandas_engine import unknown_samples
from forensics.engine.source import hive_values, memory_limit, parquet_parts
from forensics.errors import ForensicsError
from forensics.plan.padding import padded_tokens
from forensics.schema import EPOCH, SAMPLE_ID, STEP, batch_columns

#: Rows per Dask partition when small parts are grouped (each task's overhead dwarfs a small part's work).
PARTITION_ROWS = 4_000_000


def _read_parts(files: list[str], root: str | None = None) -> pd.DataFrame:
    """Parquet parts as one partition, each with its hive ``key=value`` folders as integer columns."""
    import pyarrow.parquet as pq

    frames = []
    for file in files:
        frame = pq.read_table(file).to_pandas()
        if root is not None:
            for k, v in hive_values(Path(file), Path(root)).items():
                frame[k] = np.int64(int(v)) if v.lstrip("-").isdigit() else v
        for c in frame.columns:
            if frame[c].dtype.kind in "iu":
                frame[c] = frame[c].astype(np.int64)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _on_row_group(fn, file: str, group: int, columns: list[str], start: int):
    """``fn`` on one row group of a Parquet file (its ``columns`` only): a worker's share of a samples table."""
    import pyarrow.parquet as pq

    return fn(pq.ParquetFile(file).read_row_group(group, columns=columns).to_pandas(), start)


def _grouped(files: list[str]) -> list[list[str]]:
    """Consecutive parts grouped up to :data:`PARTITION_ROWS` rows (from their footers)."""
    import pyarrow.parquet as pq

    groups: list[list[str]] = []
    rows = PARTITION_ROWS
    for f in files:
        n = pq.ParquetFile(f).metadata.num_rows
        if rows + n > PARTITION_ROWS:
            groups.append([])
            rows = 0
        groups[-1].append(f)
        rows += n
    return groups


def _clear_failures(method):
    """A computation whose workers all died (out of memory, most often) is one clear message, not a traceback."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        from distributed.scheduler import KilledWorker

        try:
            return method(self, *args, **kwargs)
        except KilledWorker as exc:
            raise ForensicsError(
                f"--engine dask: the workers died running {method.__name__} (out of memory, most "
                "often): give them more (--memory-limit for the local cluster, or a cluster's own "
                "workers with --scheduler), or use --engine duckdb"
            ) from exc

    return run


class DaskEngine(Engine):
    """dask.dataframe on a ``distributed`` cluster (see the module docstring). ``workers`` and ``processes`` shape
    the local cluster made when no ``scheduler`` is given."""

    name = "dask"

    def __init__(
        self,
        scheduler: str | None = None,
        limit: str | int | None = None,
        workers: int | None = None,
        processes: bool = True,
        client=None,
        connect_timeout: str = "20s",
    ):
        try:
            import dask.dataframe  # noqa: F401
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise ForensicsError(
                "--engine dask needs the [dask] extra: pip install 'loss-spike-forensics[dask]'"
            ) from exc
        import logging

        logging.getLogger("distributed.shuffle").setLevel(logging.ERROR)  # one line per shuffle is not news
        self._cluster = None
        if client is not None:
            self.client, self._own_client = client, False
            return
        self._own_client = True
        if scheduler:
            try:
                self.client = Client(scheduler, timeout=connect_timeout)
            except OSError as exc:
                raise ForensicsError(f"--scheduler {scheduler}: no Dask scheduler answers there ({exc})") from exc
        else:
            import os

            n = workers or max(1, min(4, os.cpu_count() or 1))
            self._cluster = LocalCluster(
                n_workers=n,
                threads_per_worker=1,
                processes=processes,
                memory_limit=max(memory_limit(limit) // n, 2**28),
                dashboard_address=None,
            )
            self.client = Client(self._cluster)

    # --- the plan as a dask frame -------------------------------------------------------------------------------
    def _frame(self, plan: PlanInput):
        import dask.dataframe as dd

        if isinstance(plan, pd.DataFrame):
            return dd.from_pandas(plan, npartitions=max(1, min(16, len(plan) // 250_000 + 1)))
        parts = parquet_parts(plan)
        if parts is None:
            from forensics.engine.pandas_engine import load

            return self._frame(load(plan))
        files, hive = parts
        if "://" in files[0]:  # object storage: dask lists and reads it through fsspec
            frame = dd.read_parquet(str(plan), dataset={"partitioning": "hive"} if hive else None)
            for c in frame.columns:
                if isinstance(frame[c].dtype, pd.CategoricalDtype):
                    frame[c] = frame[c].astype(str).astype(np.int64)
            return frame
        return dd.from_map(_read_parts, _grouped(files), root=str(plan) if hive else None)

    @_clear_failures
    def plan_columns(self, plan: PlanInput) -> list[str]:
        return list(self._frame(plan).columns)

    def _rows(self, frame, samples: pd.DataFrame, gate: bool = False):
        """The plan's rows joined to the coded samples; a plan sample they lack is bad input."""
        ids = samples[SAMPLE_ID].to_numpy(np.int64)
        bad = frame[~frame[SAMPLE_ID].isin(ids)][SAMPLE_ID]
        bad_ids = bad.compute()
        if len(bad_ids):
            few = np.unique(bad_ids.to_numpy(np.int64))
            if gate:
                raise ForensicsError(
                    f"plan: {len(few)} sample_id values are not in the samples table, "
                    f"e.g. {', '.join(map(str, few[:5].tolist()))}"
                )
            raise unknown_samples(len(bad_ids), few[:5].tolist())
        return frame.merge(samples, on=SAMPLE_ID, how="inner")

    # --- per step -----------------------------------------------------------------------------------------------
    @_clear_failures
    def step_counts(
        self,
        plan: PlanInput,
        samples: pd.DataFrame,
        packed: bool = False,
        tokens: bool = True,
        keep_epochs: Sequence[int] | None = None,
    ) -> StepCounts:
        import dask

        frame = self._frame(plan)
        if STEP not in frame.columns:
            raise ForensicsError("plan: needs a 'step' column to tag steps; map batches to steps first")
        if keep_epochs is not None:
            frame = frame[frame[EPOCH].isin(list(keep_epochs))]
        rows = self._rows(frame, samples)
        has_epoch = EPOCH in frame.columns
        agg = {"n": (SAMPLE_ID, "count"), "real": ("length", "sum")}
        if has_epoch:
            agg["epoch"] = (EPOCH, "min")
        lazy = {"steps": rows.groupby(STEP).agg(**agg)}
        labels = [c for c in samples.columns if c not in SAMPLE_BASE]
        for col in labels:
            lazy[col] = rows.groupby([STEP, col]).size()
        if tokens:
            keys = batch_columns(frame.columns)
            b = rows.groupby(keys).agg(st=(STEP, "max"), n=(SAMPLE_ID, "count"), hi=("length", "max"))
            b["pad"] = padded_tokens(b["n"], b["hi"])
            lazy["batches"] = b.groupby("st").agg(nb=("n", "count"), padded=("pad", "sum"))
        got = dict(zip(lazy, dask.compute(*lazy.values()), strict=True))
        steps = got["steps"].sort_index()
        step_values = steps.index.to_numpy(np.int64)
        n_steps = len(step_values)
        real = steps["real"].to_numpy(np.int64) if tokens else np.zeros(n_steps, np.int64)
        padded, n_batches = np.zeros(n_steps, np.int64), np.zeros(n_steps, np.int64)
        if tokens:
            bt = got["batches"]
            at = np.searchsorted(step_values, bt.index.to_numpy(np.int64))
            n_batches[at] = bt["nb"].to_numpy(np.int64)
            if packed:
                padded = real.copy()
            else:
                padded[at] = bt["padded"].to_numpy(np.int64)
        pairs = {}
        for col in labels:
            q = got[col].reset_index(name="n").sort_values([STEP, col], ignore_index=True)
            pairs[col] = LabelPairs(
                np.searchsorted(step_values, q[STEP].to_numpy(np.int64)),
                q[col].to_numpy(np.int64),
                q["n"].to_numpy(np.int64),
            )
        epoch = steps["epoch"].to_numpy(np.int64) if has_epoch else np.zeros(n_steps, np.int64)
        return StepCounts(step_values, epoch, steps["n"].to_numpy(np.int64), real, padded, n_batches, pairs)

    # --- per epoch and pair of epochs ---------------------------------------------------------------------------
    @_clear_failures
    def gate_counts(self, plan: PlanInput, samples: pd.DataFrame | None, epochs: int | None = None) -> GateCounts:
        import dask

        from forensics.plan.composition import epoch_column

        frame = self._frame(plan)
        epoch_column(pd.DataFrame(columns=list(frame.columns)))  # no epochs: the one message every engine gives
        if samples is not None:
            frame = self._rows(frame, samples, gate=True)
        keys = [c for c in batch_columns(frame.columns) if c != EPOCH]
        spans = [int(v) + 1 for v in dask.compute(*[frame[c].max() for c in keys])] if len(keys) > 1 else []
        n_samples = len(samples) if samples is not None else int(frame[SAMPLE_ID].nunique().compute())
        labels = sorted(int(e) for e in frame[EPOCH].unique().compute())
        if epochs is not None:
            labels = labels[:epochs]
            frame = frame[frame[EPOCH].isin(labels)]
        if spans and float(np.prod([float(s) for s in spans])) >= 2**62:
            raise ForensicsError("plan: its batch columns span more than 2**62 codes; use --engine duckdb")

        def code(part: pd.DataFrame) -> pd.Series:
            c = part[keys[0]].to_numpy(np.int64).copy()
            for k, span in zip(keys[1:], spans[1:], strict=True):
                c = c * span + part[k].to_numpy(np.int64)
            return pd.Series(c, index=part.index)

        frame = frame.assign(b=frame.map_partitions(code, meta=("b", "int64")))
        # one group per (epoch, sample): as many as the plan has rows, so the result is spread over as many
        # partitions as the plan (one partition of them all is what a worker's memory cannot hold)
        spread = max(1, frame.npartitions * 4)
        first = (
            frame.groupby([EPOCH, SAMPLE_ID])
            .agg(b=("b", "min"), n=("b", "count"), split_out=spread)
            .reset_index()
            .persist()
        )
        lazy = {
            "sizes": first.groupby([EPOCH, "b"]).size(),
            "per": first.groupby(EPOCH).agg(rows=("n", "sum"), present=("b", "count")),
        }
        if samples is not None:
            lazy["shape"] = frame.groupby([EPOCH, "b"]).agg(
                n=("b", "count"), hi=("length", "max"), lo=("length", "min"), real=("length", "sum"), split_out=spread
            )
        pair_keys = list(zip(labels, labels[1:], strict=False)) + ([(labels[0], labels[-1])] if labels else [])
        for a, b in dict.fromkeys(pair_keys):
            x = first[first[EPOCH] == a][[SAMPLE_ID, "b"]]
            y = first[first[EPOCH] == b][[SAMPLE_ID, "b"]]
            lazy[(a, b)] = x.merge(y, on=SAMPLE_ID, suffixes=("_a", "_b")).groupby(["b_a", "b_b"]).size()
        got = dict(zip(lazy, dask.compute(*lazy.values()), strict=True))
        sizes = got["sizes"].rename("size").reset_index().sort_values([EPOCH, "b"], ignore_index=True)
        sizes["pos"] = sizes.groupby(EPOCH).cumcount()
        out = []
        for e in labels:
            s = sizes.loc[sizes[EPOCH] == e, "size"].to_numpy(np.int64)
            extra = {}
            if samples is not None:
                sh = got["shape"].loc[e]
                hi, lo, n = (sh[c].to_numpy(np.int64) for c in ("hi", "lo", "n"))
                order = np.lexsort((hi, lo))
                extra = dict(
                    real=int(sh["real"].sum()),
                    padded=int(padded_tokens(n, hi).sum()),
                    budget=int(padded_tokens(n, hi)[n >= 2].max()) if (n >= 2).any() else 0,
                    max_size=int(n.max()),
                    shape_batches=len(n),
                    overlaps=int(np.count_nonzero(hi[order][:-1] > lo[order][1:])),
                )
            per = got["per"].loc[e]
            out.append(
                EpochCounts(
                    e,
                    int(per["rows"]),
                    int(per["present"]),
                    len(s),
                    int(np.count_nonzero(s >= 2)),
                    int((s * (s - 1) // 2).sum()),
                    **extra,
                )
            )
        by_epoch = {e: g.set_index("b") for e, g in sizes.groupby(EPOCH)}

        def pair(a: int, b: int) -> PairCounts:
            g = got[(a, b)].rename("c").reset_index()
            c = g["c"].to_numpy(np.int64)
            sa, sb = by_epoch[a].loc[g["b_a"]], by_epoch[b].loc[g["b_b"]]
            ex = (c == sa["size"].to_numpy()) & (c == sb["size"].to_numpy())
            same = bool(np.array_equal(sa["pos"].to_numpy()[ex], sb["pos"].to_numpy()[ex]))
            return PairCounts(
                a, b, int((c * (c - 1) // 2).sum()), int(ex.sum()), int((ex & (sb["size"].to_numpy() >= 2)).sum()), same
            )

        pairs = [pair(a, b) for a, b in zip(labels, labels[1:], strict=False)]
        first_last = pair(labels[0], labels[-1]) if labels else None
        del first
        return GateCounts(out, pairs, first_last, int(n_samples))

    # --- lookups ------------------------------------------------------------------------------------------------
    @_clear_failures
    def steps_holding(self, plan: PlanInput, sample_ids: Sequence[int]) -> pd.DataFrame:
        frame = self._frame(plan)
        ids = np.asarray(list(sample_ids), np.int64)
        got = frame[frame[SAMPLE_ID].isin(ids)][[STEP, SAMPLE_ID]].drop_duplicates().compute()
        return got.sort_values([STEP, SAMPLE_ID], ignore_index=True).astype(np.int64)

    @_clear_failures
    def rows_at_steps(self, plan: PlanInput, steps: Sequence[int]) -> pd.DataFrame:
        frame = self._stepped(plan)
        return frame[frame[STEP].isin(np.asarray(list(steps), np.int64))].compute().reset_index(drop=True)

    def plan_chunks(self, plan: PlanInput, columns: Sequence[str], last_step: int) -> Iterator[pd.DataFrame]:
        """One partition at a time, computed on the cluster and brought back (the client holds one at a time)."""
        frame = self._stepped(plan)
        rows = frame[frame[STEP] <= last_step][list(columns)]
        for part in rows.to_delayed():
            yield self._computed(part)

    @_clear_failures
    def _computed(self, part) -> pd.DataFrame:
        return part.compute()

    @_clear_failures
    def map_sample_chunks(self, samples, columns, fn, chunk: int = CHUNK_ROWS) -> list:
        """``fn`` runs on the workers, one task per row group of the samples' local Parquet reading only
        ``columns`` (its first row from the footers; on object storage one per dask partition); only the results
        come back."""
        import dask

        parts = parquet_parts(samples)
        if parts is None:  # CSV or JSONL: read whole
            return super().map_sample_chunks(samples, columns, fn, chunk)
        files = parts[0]
        if "://" in files[0]:  # object storage: dask's own partitions, each read by a worker
            frame = self._frame(samples)[list(columns)]
            lengths = frame.map_partitions(len).compute()
            starts = np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64))[:-1]]).tolist()
            tasks = [dask.delayed(fn)(part, int(start)) for part, start in zip(frame.to_delayed(), starts)]
            return list(dask.compute(*tasks))
        import pyarrow.parquet as pq

        # one task per row group, reading only the wanted columns; each group's first row from the footers
        groups = []
        for f in files:
            meta = pq.ParquetFile(f).metadata
            groups += [(f, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum([n for _, _, n in groups], dtype=np.int64)[:-1]]).tolist()
        tasks = [
            dask.delayed(_on_row_group)(fn, f, g, list(columns), int(start)) for (f, g, _), start in zip(groups, starts)
        ]
        return list(dask.compute(*tasks)) if tasks else [fn(pd.DataFrame({c: [] for c in columns}), 0)]

    def _stepped(self, plan: PlanInput):
        """The plan's frame (partitions in the plan's order); one without ``step`` is bad input."""
        frame = self._frame(plan)
        if STEP not in frame.columns:
            raise no_steps()
        return frame

    def close(self) -> None:
        if self._own_client:
            self.client.close()
            if self._cluster is not None:
                self._cluster.close()
