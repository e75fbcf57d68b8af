"""The embedded engine past memory: DuckDB reads the plan's Parquet parts directly (flat recorder folders and hive
``epoch=E/`` folders), aggregates out of core under ``memory_limit`` and spills to a temporary folder; nothing of
the plan is loaded whole. Only the counts (:mod:`forensics.engine.base`) come back to Python.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence

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
from forensics.engine.source import memory_limit, parquet_parts
from forensics.errors import ForensicsError
from forensics.plan.padding import padded_tokens_sql
from forensics.schema import EPOCH, SAMPLE_ID, STEP, batch_columns


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _listing(files: Sequence[str]) -> str:
    """Paths as a DuckDB list literal, each quoted."""
    return "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in files) + "]"


def _dense(samples: pd.DataFrame) -> int | None:
    """``n`` when the samples' ids are exactly 0 .. n-1 (the usual case), else None."""
    ids = samples[SAMPLE_ID].to_numpy(np.int64)
    n = len(ids)
    return n if n and ids[0] == 0 and ids[-1] == n - 1 and np.array_equal(ids, np.arange(n)) else None


class DuckDBEngine(Engine):
    """DuckDB over the plan's Parquet (see the module docstring); ``limit`` as ``4GB`` (default half the available
    memory), ``spill`` the folder it spills to (default a fresh temporary one, removed on :meth:`close`)."""

    name = "duckdb"

    def __init__(self, limit: str | int | None = None, spill: str | None = None, threads: int | None = None):
        import duckdb

        self.limit = memory_limit(limit)
        self._own_spill = spill is None
        self.spill = spill or tempfile.mkdtemp(prefix="forensics-duckdb-")
        self.con = duckdb.connect(":memory:")
        self.con.execute(f"SET memory_limit = '{max(self.limit // 2**20, 64)}MB'")
        self.con.execute(f"SET temp_directory = '{self.spill}'")
        self.con.execute("SET preserve_insertion_order = false")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        self._n = 0

    # --- the plan as a relation ---------------------------------------------------------------------------------
    def _relation(self, plan: PlanInput) -> str:
        """A view name over the plan (its Parquet parts, or a table registered from memory)."""
        self._n += 1
        name = f"plan_{self._n}"
        parts = None if isinstance(plan, pd.DataFrame) else parquet_parts(plan)
        if parts is None:
            from forensics.engine.pandas_engine import load

            self.con.register(name, load(plan))
            return name
        files, hive = parts
        listing = _listing(files)
        try:
            self.con.execute(
                f"CREATE OR REPLACE TEMP VIEW {name} AS SELECT * FROM read_parquet({listing}, "
                f"hive_partitioning = {str(hive).lower()}, union_by_name = true)"
            )
        except Exception as exc:  # duckdb's own error types: a corrupt or unreadable part
            raise ForensicsError(f"plan {plan} could not be read: {str(exc).splitlines()[0]}") from exc
        return name

    def _columns(self, rel: str) -> list[str]:
        return [r[0] for r in self.con.execute(f"DESCRIBE SELECT * FROM {rel}").fetchall()]

    def plan_columns(self, plan: PlanInput) -> list[str]:
        return self._columns(self._relation(plan))

    def _samples(self, samples: pd.DataFrame) -> str:
        self._n += 1
        name = f"samples_{self._n}"
        self.con.register(name, samples)
        return name

    def _check_known(self, rel: str, smp: str, gate: bool = False, dense: int | None = None) -> None:
        if dense is not None:  # sample ids 0 .. n-1: a range test over the plan, no join
            (bad,) = self.con.execute(
                f"SELECT count(*) FROM {rel} WHERE sample_id < 0 OR sample_id >= {dense}"
            ).fetchone()
            if not bad:
                return
        (n,) = self.con.execute(f"SELECT count(*) FROM {rel} p ANTI JOIN {smp} s USING (sample_id)").fetchone()
        if n:
            few = [
                r[0]
                for r in self.con.execute(
                    f"SELECT DISTINCT sample_id FROM {rel} ANTI JOIN {smp} USING (sample_id) ORDER BY 1 LIMIT 5"
                ).fetchall()
            ]
            if gate:
                (distinct,) = self.con.execute(
                    f"SELECT count(DISTINCT sample_id) FROM {rel} ANTI JOIN {smp} USING (sample_id)"
                ).fetchone()
                raise ForensicsError(
                    f"plan: {distinct} sample_id values are not in the samples table, e.g. {', '.join(map(str, few))}"
                )
            raise unknown_samples(int(n), few)

    def _df(self, sql: str) -> pd.DataFrame:
        return self.con.execute(sql).df()

    # --- per step -----------------------------------------------------------------------------------------------
    def step_counts(
        self,
        plan: PlanInput,
        samples: pd.DataFrame,
        packed: bool = False,
        tokens: bool = True,
        keep_epochs: Sequence[int] | None = None,
    ) -> StepCounts:
        rel = self._relation(plan)
        cols = self._columns(rel)
        if STEP not in cols:
            raise ForensicsError("plan: needs a 'step' column to tag steps; map batches to steps first")
        smp = self._samples(samples)
        self._check_known(rel, smp, dense=_dense(samples))
        labels = [c for c in samples.columns if c not in SAMPLE_BASE]
        where = "" if keep_epochs is None else f"WHERE epoch IN ({', '.join(str(int(e)) for e in keep_epochs)})"
        epoch = "min(epoch)" if EPOCH in cols else "0"
        rows = f"(SELECT * FROM {rel} p JOIN {smp} s USING (sample_id) {where})"
        # one scan: (step, every label) groups, reduced here to the steps and to each label's pairs
        group = ", ".join(["step"] + [_ident(c) for c in labels])
        fine = self._df(
            f"SELECT {group}, {epoch} AS epoch, count(*) AS n, sum(length) AS real FROM {rows} GROUP BY ALL"
        )
        for c in ["step", "epoch", "n", "real", *labels]:
            fine[c] = fine[c].to_numpy(np.int64)
        steps = fine.groupby("step", sort=True).agg(epoch=("epoch", "min"), n=("n", "sum"), real=("real", "sum"))
        step_values = steps.index.to_numpy(np.int64)
        n_steps = len(step_values)
        real = steps["real"].to_numpy(np.int64) if tokens else np.zeros(n_steps, np.int64)
        padded, n_batches = np.zeros(n_steps, np.int64), np.zeros(n_steps, np.int64)
        if tokens:
            keys = ", ".join(_ident(c) for c in batch_columns(cols))
            b = self._df(
                f"SELECT st, count(*) AS nb, sum(pad) AS padded FROM (SELECT max(step) AS st, "
                f"{padded_tokens_sql('count(*)', 'max(length)')} AS pad FROM {rows} GROUP BY {keys}) GROUP BY st"
            )
            at = np.searchsorted(step_values, b["st"].to_numpy(np.int64))
            n_batches[at] = b["nb"].to_numpy(np.int64)
            padded = real.copy() if packed else padded
            if not packed:
                padded[at] = b["padded"].to_numpy(np.int64)
        pairs = {}
        for col in labels:
            q = fine.groupby(["step", col], sort=True)["n"].sum().reset_index()
            pairs[col] = LabelPairs(
                np.searchsorted(step_values, q["step"].to_numpy(np.int64)),
                q[col].to_numpy(np.int64),
                q["n"].to_numpy(np.int64),
            )
        return StepCounts(
            step_values,
            steps["epoch"].to_numpy(np.int64),
            steps["n"].to_numpy(np.int64),
            real,
            padded,
            n_batches,
            pairs,
        )

    # --- per epoch and pair of epochs ---------------------------------------------------------------------------
    def _batch_code(self, rel: str, cols: list[str]) -> str:
        """An integer per row ordering the epoch's batches as their columns do (as the pandas engine codes them)."""
        keys = [c for c in batch_columns(cols) if c != EPOCH]
        if len(keys) == 1:
            return _ident(keys[0])
        spans = self.con.execute(
            f"SELECT {', '.join(f'coalesce(max({_ident(c)}), 0) + 1' for c in keys)} FROM {rel}"
        ).fetchone()
        if float(np.prod([float(s) for s in spans])) >= 2**62:
            order = ", ".join(_ident(c) for c in keys)
            return f"dense_rank() OVER (PARTITION BY epoch ORDER BY {order})"
        code = _ident(keys[0])
        for c, span in zip(keys[1:], spans[1:]):
            code = f"({code}) * {int(span)} + {_ident(c)}"
        return code

    def gate_counts(self, plan: PlanInput, samples: pd.DataFrame | None, epochs: int | None = None) -> GateCounts:
        from forensics.plan.composition import epoch_column

        rel = self._relation(plan)
        cols = self._columns(rel)
        epoch_column(pd.DataFrame(columns=cols))  # no epochs: the one message every engine gives
        smp = None
        if samples is not None:
            smp = self._samples(samples)
            self._check_known(rel, smp, gate=True, dense=_dense(samples))
            n_samples = len(samples)
        else:
            (n_samples,) = self.con.execute(f"SELECT count(DISTINCT sample_id) FROM {rel}").fetchone()
        labels = [int(r[0]) for r in self.con.execute(f"SELECT DISTINCT epoch FROM {rel} ORDER BY 1").fetchall()]
        if epochs is not None:
            labels = labels[:epochs]
        keep = ", ".join(str(e) for e in labels) or "NULL"
        code = self._batch_code(rel, cols)
        self._n += 1
        first, sizes, rows = f"first_{self._n}", f"sizes_{self._n}", f"rows_{self._n}"
        self.con.execute(
            f"CREATE OR REPLACE TEMP VIEW {rows} AS SELECT CAST(epoch AS BIGINT) AS epoch, sample_id, "
            f"{code} AS b FROM {rel} WHERE epoch IN ({keep})"
        )
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE {first} AS SELECT epoch, sample_id, min(b) AS b, "
            f"count(*) AS n FROM {rows} GROUP BY epoch, sample_id"
        )
        self.con.execute(
            f"CREATE OR REPLACE TEMP TABLE {sizes} AS SELECT epoch, b, count(*) AS size, "
            f"row_number() OVER (PARTITION BY epoch ORDER BY b) AS pos FROM {first} GROUP BY epoch, b"
        )
        per = self._df(
            f"SELECT f.epoch, f.rows, f.present, z.batches, z.multi, z.pairs FROM "
            f"(SELECT epoch, sum(n) AS rows, count(*) AS present FROM {first} GROUP BY epoch) f JOIN "
            f"(SELECT epoch, count(*) AS batches, count_if(size >= 2) AS multi, "
            f"sum(size * (size - 1) // 2) AS pairs FROM {sizes} GROUP BY epoch) z USING (epoch) "
            f"ORDER BY epoch"
        ).set_index("epoch")
        shape = None
        if smp is not None:
            shape = self._df(
                f"WITH bst AS (SELECT epoch, b, count(*) AS n, max(length) AS hi, min(length) AS lo, "
                f"sum(length) AS real FROM {rows} JOIN {smp} USING (sample_id) GROUP BY epoch, b), "
                f"lagged AS (SELECT *, lag(hi) OVER (PARTITION BY epoch ORDER BY lo, hi) AS prev FROM bst) "
                f"SELECT epoch, sum(real) AS real, sum({padded_tokens_sql('n', 'hi')}) AS padded, "
                f"max(CASE WHEN n >= 2 THEN {padded_tokens_sql('n', 'hi')} ELSE 0 END) AS budget, max(n) AS max_size, "
                f"count(*) AS shape_batches, count_if(prev > lo) AS overlaps FROM lagged GROUP BY epoch"
            ).set_index("epoch")
        out = []
        for e in labels:
            r = per.loc[e]
            extra = (
                {}
                if shape is None
                else {
                    k: int(shape.loc[e, k])
                    for k in ("real", "padded", "budget", "max_size", "shape_batches", "overlaps")
                }
            )
            out.append(
                EpochCounts(
                    e, int(r["rows"]), int(r["present"]), int(r["batches"]), int(r["multi"]), int(r["pairs"]), **extra
                )
            )

        def pair(a: int, b: int) -> PairCounts:
            got = self.con.execute(
                f"WITH g AS (SELECT x.b AS a, y.b AS b, count(*) AS c FROM {first} x JOIN {first} y "
                f"ON x.sample_id = y.sample_id WHERE x.epoch = {a} AND y.epoch = {b} GROUP BY 1, 2), "
                f"j AS (SELECT g.c, sf.size AS sb, se.pos AS pa, sf.pos AS pb, "
                f"(g.c = se.size AND g.c = sf.size) AS ex FROM g "
                f"JOIN {sizes} se ON se.epoch = {a} AND se.b = g.a JOIN {sizes} sf ON sf.epoch = {b} AND sf.b = g.b) "
                f"SELECT coalesce(sum(c * (c - 1) // 2), 0), count_if(ex), count_if(ex AND sb >= 2), "
                f"coalesce(bool_and(NOT ex OR pa = pb), true) FROM j"
            ).fetchone()
            return PairCounts(a, b, int(got[0]), int(got[1]), int(got[2]), bool(got[3]))

        done: dict[tuple[int, int], PairCounts] = {}
        for key in list(zip(labels, labels[1:])) + ([(labels[0], labels[-1])] if labels else []):
            if key not in done:  # with two epochs the first-last pair is the consecutive one
                done[key] = pair(*key)
        pairs = [done[k] for k in zip(labels, labels[1:])]
        first_last = done[(labels[0], labels[-1])] if labels else None
        self.con.execute(f"DROP TABLE {first}")
        self.con.execute(f"DROP TABLE {sizes}")
        return GateCounts(out, pairs, first_last, int(n_samples))

    # --- lookups ------------------------------------------------------------------------------------------------
    def steps_holding(self, plan: PlanInput, sample_ids: Sequence[int]) -> pd.DataFrame:
        rel = self._relation(plan)
        ids = self._samples(pd.DataFrame({SAMPLE_ID: np.asarray(list(sample_ids), np.int64)}))
        got = self._df(
            f"SELECT DISTINCT step, sample_id FROM {rel} WHERE sample_id IN (SELECT sample_id FROM {ids}) ORDER BY 1, 2"
        )
        return got.astype(np.int64).reset_index(drop=True)

    def rows_at_steps(self, plan: PlanInput, steps: Sequence[int]) -> pd.DataFrame:
        wanted = self._samples(pd.DataFrame({STEP: np.unique(np.asarray(list(steps), np.int64))}))
        return self._ordered_rows(plan, lambda rel: f"step IN (SELECT step FROM {wanted})")

    def plan_chunks(
        self, plan: PlanInput, columns: Sequence[str], last_step: int, chunk: int = 1_000_000
    ) -> Iterator[pd.DataFrame]:
        import duckdb

        rel = self._relation(plan)
        if STEP not in self._columns(rel):
            raise no_steps()
        picked = ", ".join(_ident(c) for c in columns)
        try:
            query = self.con.sql(f"SELECT {picked} FROM {rel} WHERE step <= {int(last_step)}")
            reader = (
                query.to_arrow_reader(chunk) if hasattr(query, "to_arrow_reader") else query.fetch_record_batch(chunk)
            )
            for batch in reader:
                yield batch.to_pandas()
        except duckdb.Error as exc:
            raise ForensicsError(f"plan {plan} could not be read: {str(exc).splitlines()[0]}") from exc

    def _ordered_rows(self, plan: PlanInput, where) -> pd.DataFrame:
        """The plan's rows that ``where(relation)`` (an SQL condition) keeps, every column, in the plan's own order:
        its parts as listed (:func:`forensics.engine.source.parquet_parts`), each part's rows as written."""
        parts = None if isinstance(plan, pd.DataFrame) else parquet_parts(plan)
        rel = self._relation(plan)
        cols = self._columns(rel)
        if STEP not in cols:
            raise no_steps()
        picked = ", ".join(f"p.{_ident(c)}" for c in cols)
        if parts is None:  # in memory, or not Parquet: the rows in the table's order
            from forensics.engine.pandas_engine import load

            self._n += 1
            rows = f"rows_{self._n}"
            table = load(plan)
            self.con.register(rows, table.assign(_row=np.arange(len(table))))
            return self._df(f"SELECT {picked} FROM {rows} p WHERE {where(rel)} ORDER BY p._row")
        files, hive = parts
        self._n += 1
        order = f"files_{self._n}"
        self.con.register(order, pd.DataFrame({"filename": files, "file_index": np.arange(len(files))}))
        listing = _listing(files)
        source = (
            f"read_parquet({listing}, hive_partitioning = {str(hive).lower()}, union_by_name = true, "
            "filename = true, file_row_number = true)"
        )
        return self._read(
            plan,
            f"SELECT {picked} FROM {source} p LEFT JOIN {order} f USING (filename) "
            f"WHERE {where(rel)} ORDER BY f.file_index NULLS LAST, p.filename, p.file_row_number",
        )

    def _read(self, path, sql: str) -> pd.DataFrame:
        """A query over a table's Parquet parts; one a part cannot answer (a damaged page) is bad input."""
        import duckdb

        try:
            return self._df(sql)
        except duckdb.Error as exc:
            raise ForensicsError(f"{path} could not be read: {str(exc).splitlines()[0]}") from exc

    def map_sample_chunks(self, samples, columns, fn, chunk: int = CHUNK_ROWS) -> list:
        parts = parquet_parts(samples)
        if parts is None:  # CSV or JSONL: read whole
            return super().map_sample_chunks(samples, columns, fn, chunk)
        files, hive = parts
        listing = _listing(files)
        picked = ", ".join(_ident(c) for c in columns)
        # a plain scan keeps the files' row order while preserve_insertion_order holds (off for the aggregations,
        # whose order nothing reads): on for this scan, so the texts stream in order without a sort
        import duckdb

        self.con.execute("SET preserve_insertion_order = true")
        try:
            rel = self.con.sql(
                f"SELECT {picked} FROM read_parquet({listing}, hive_partitioning = "
                f"{str(hive).lower()}, union_by_name = true)"
            )
            reader = rel.to_arrow_reader(chunk) if hasattr(rel, "to_arrow_reader") else rel.fetch_record_batch(chunk)
            out, start = [], 0
            for batch in reader:
                rows = batch.to_pandas()
                out.append(fn(rows, start))
                start += len(rows)
        except duckdb.Error as exc:
            raise ForensicsError(f"samples {samples} could not be read: {str(exc).splitlines()[0]}") from exc
        finally:
            self.con.execute("SET preserve_insertion_order = false")
        return out or [fn(pd.DataFrame({c: pd.Series([], dtype=object) for c in columns}), 0)]

    def close(self) -> None:
        self.con.close()
        if self._own_spill:
            shutil.rmtree(self.spill, ignore_errors=True)
