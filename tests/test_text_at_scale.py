"""Text clusters of a samples table too large to load: fitted on the same draw, assigned chunk by chunk on every
engine (pandas in slices, DuckDB streaming the Parquet, Dask a task per row group on a real LocalCluster), they are the
clusters of the texts in memory, names included; the cache key does not depend on how the texts were cut."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from forensics.engine import get_engine
from forensics.errors import ForensicsError
from forensics.schema import load_samples
from forensics.tagging.clusters import cluster_samples
from forensics.tagging.text_at_scale import TextColumn, _digest, cluster_text_column, text_key


@pytest.fixture(scope="module")
def texts(demo_small: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The small demo's samples (texts from several sources), as one Parquet file of small row groups and as a
    folder of three parts; and the clusters made with every text in memory."""
    samples = load_samples(demo_small / "static" / "samples.parquet")
    root = tmp_path_factory.mktemp("texts")
    samples.to_parquet(root / "samples.parquet", index=False, row_group_size=700)
    (root / "parts").mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(samples)), 3)):
        samples.iloc[part].to_parquet(root / "parts" / f"part-{i}.parquet", index=False)
    mp = pytest.MonkeyPatch()
    mp.setenv("FORENSICS_NO_CACHE", "1")
    ref, info = cluster_samples(samples, k=None, max_fit=1500, seed=0)
    mp.undo()
    return {"root": root, "samples": samples, "codes": ref["cluster"].to_numpy(), "info": info}


def _engine(name: str, client):
    if name == "dask":
        from forensics.engine.dask_engine import DaskEngine

        return DaskEngine(client=client)
    return get_engine(name, memory_limit="1GB")


@pytest.mark.parametrize("layout", ["samples.parquet", "parts"])
@pytest.mark.parametrize("engine", ["pandas", "duckdb", "dask"])
def test_every_engine_gives_the_clusters_of_the_texts_in_memory(
    texts: dict, engine: str, layout: str, request, monkeypatch
) -> None:
    monkeypatch.setenv("FORENSICS_NO_CACHE", "1")  # on Dask: a task per row group (11 of the file, 3 parts)
    eng = _engine(engine, request.getfixturevalue("dask_client") if engine == "dask" else None)
    seen: list[int] = []
    try:
        labels = texts["samples"]["source"].to_numpy()
        codes, info = cluster_text_column(
            TextColumn(texts["root"] / layout, eng),
            len(texts["samples"]),
            None,
            max_fit=1500,
            seed=0,
            labels=labels,
            progress=seen.append,
            chunk=900,
        )
    finally:
        eng.close()
    assert np.array_equal(codes, texts["codes"])
    assert info == texts["info"]
    assert info.k >= 2 and seen == [len(texts["samples"])]


def test_the_content_key_is_the_same_for_any_chunking_and_changes_with_one_text() -> None:
    rng = np.random.default_rng(1)
    words = np.array(["alpha", "beta", "gamma", "delta", ""], dtype=object)
    body = words[rng.integers(0, 5, 1000)]

    def key(t: np.ndarray, cut: int) -> str:
        digests = [_digest(t[s : s + cut], s) for s in range(0, len(t), cut)]
        return text_key(digests, len(t), None, 100, 0, None)

    assert key(body, 1000) == key(body, 7) == key(body, 333)
    swapped = body.copy()
    i, j = np.flatnonzero(body != body[0])[:1][0], 0
    swapped[[i, j]] = swapped[[j, i]]
    edited = body.copy()
    edited[500] = edited[500] + "x"
    assert len({key(body, 100), key(swapped, 100), key(edited, 100)}) == 3


def test_a_second_run_reads_the_clusters_back_from_the_cache(texts: dict, monkeypatch) -> None:
    from forensics.tagging import text_at_scale

    eng = get_engine("duckdb", memory_limit="1GB")
    fits: list[int] = []
    try:
        col = TextColumn(texts["root"] / "samples.parquet", eng)
        n = len(texts["samples"])
        first = cluster_text_column(col, n, 3, max_fit=1500, seed=0)
        real = text_at_scale.TextClusterer.fit
        monkeypatch.setattr(text_at_scale.TextClusterer, "fit", lambda self, t: fits.append(len(t)) or real(self, t))
        again = cluster_text_column(col, n, 3, max_fit=1500, seed=0)
    finally:
        eng.close()
    assert fits == []  # nothing fitted: read back
    assert np.array_equal(first[0], again[0]) and first[1] == again[1]


def test_a_samples_table_of_another_length_is_bad_input(texts: dict) -> None:
    eng = get_engine("duckdb", memory_limit="1GB")
    try:
        with pytest.raises(ForensicsError, match=r"texts read for \d+ samples$"):
            cluster_text_column(TextColumn(texts["root"] / "samples.parquet", eng), len(texts["samples"]) + 1, 3)
    finally:
        eng.close()


def test_the_cli_tags_on_duckdb_without_loading_the_texts(demo_small: Path, tmp_path: Path) -> None:
    """``forensics tag --engine duckdb``: the step tags of the pandas path, clusters included, from a samples table
    held without its texts (the sample tags it writes have none; pandas' carry them)."""
    import subprocess
    import sys

    out, tagged = {}, {}
    for engine in ("pandas", "duckdb"):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "forensics",
                "tag",
                str(demo_small / "static"),
                "--engine",
                engine,
                "-o",
                str(tmp_path / f"{engine}.parquet"),
                "--samples-out",
                str(tmp_path / f"samples-{engine}.parquet"),
            ],
            capture_output=True,
            text=True,
        )
        assert res.returncode == 0, res.stderr
        out[engine] = pd.read_parquet(tmp_path / f"{engine}.parquet")
        tagged[engine] = pd.read_parquet(tmp_path / f"samples-{engine}.parquet")
    pd.testing.assert_frame_equal(out["duckdb"], out["pandas"], check_exact=True)
    assert out["pandas"]["cluster"].nunique() >= 2
    assert "text" in tagged["pandas"].columns and "text" not in tagged["duckdb"].columns
    assert tagged["duckdb"]["cluster"].tolist() == tagged["pandas"]["cluster"].tolist()
