"""Step tags: hand-computed padding, entropy, run lengths and steps-since-seen; clusters on the demo; the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import adjusted_rand_score

from forensics.cli import main
from forensics.errors import ForensicsError
from forensics.plan.builders import static_sorted
from forensics.plan.rebuild import rebuild_plan, resolve_builder
from forensics.plan.step_mapping import assign_steps
from forensics.schema import load_plan, load_samples, open_case
from forensics.tagging import TAG_COLUMNS, cluster_samples, composition, tag_case, tag_steps

BOUNDS = [0, 770, 1216, 1728, 2432, 3296, 8192]


@pytest.fixture
def tiny() -> tuple[pd.DataFrame, pd.DataFrame]:
    """8 samples with given clusters and a plan of 7 batches (2 samples each), grad_accum 2, two epochs."""
    samples = pd.DataFrame(
        {
            "sample_id": np.arange(8),
            "n_tokens": np.array([100, 200, 900, 1000, 3000, 9000, 50, 60], dtype=np.int32),
            "cluster": [0, 0, 1, 1, 2, 2, 0, 1],
            "cluster_name": ["qa", "qa", "math", "math", "code", "code", "qa", "math"],
        }
    )
    batches = {0: [[0, 1], [2, 3], [6, 7], [0, 6], [4, 5]], 1: [[6, 7], [0, 1]]}
    rows = [(e, b, s) for e, bs in batches.items() for b, batch in enumerate(bs) for s in batch]
    plan = pd.DataFrame(rows, columns=["epoch", "batch_id", "sample_id"])
    return plan, samples


def test_tiny_plan_tags_match_hand_computation(tiny):
    plan, samples = tiny
    tags = tag_steps(assign_steps(plan, grad_accum=2), samples, BOUNDS)
    # steps: 0 = batches 0,1; 1 = batches 2,3; 2 = batch 4 (partial); 3 = epoch 1's two batches
    assert tags["step"].tolist() == [0, 1, 2, 3]
    assert tags["epoch"].tolist() == [0, 0, 0, 1]
    assert tags["position_in_epoch"].tolist() == [0, 1, 2, 0]
    assert tags["n_batches"].tolist() == [2, 2, 1, 2]
    assert tags["n_samples"].tolist() == [4, 4, 2, 4]
    # real: 100+200+900+1000; 50+60+100+50; 3000+8192 (9000 capped); 50+60+100+200
    assert tags["real_tokens"].tolist() == [2200, 260, 11192, 410]
    # padded: 2*200 + 2*1000; 2*60 + 2*100; 2*8192; 2*60 + 2*200
    assert tags["padded_tokens"].tolist() == [2400, 320, 16384, 520]
    np.testing.assert_allclose(tags["padding_ratio"], [200 / 2400, 60 / 320, 5192 / 16384, 110 / 520])
    # buckets: step 0 = {0, 0, 1, 1} (tie -> lowest), step 2 = {4, 5}
    assert tags["bucket"].tolist() == [0, 0, 4, 0]
    assert tags["bucket_range"].tolist() == ["(0, 770]", "(0, 770]", "(2432, 3296]", "(0, 770]"]
    np.testing.assert_allclose(tags["bucket_share"], [0.5, 1.0, 0.5, 1.0])
    np.testing.assert_allclose(tags["bucket_entropy"], [1.0, 0.0, 1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(
        tags[[f"bucket_share_{k}" for k in range(6)]].to_numpy(),
        [[0.5, 0.5, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0.5, 0.5], [1, 0, 0, 0, 0, 0]],
    )
    # clusters: step 0 = {0,0,1,1}; step 1 = {0,1,0,0}; step 2 = {2,2}; step 3 = {0,1,0,0}
    assert tags["cluster"].tolist() == [0, 0, 2, 0]
    assert tags["cluster_name"].tolist() == ["qa", "qa", "code", "qa"]
    np.testing.assert_allclose(tags["cluster_share"], [0.5, 0.75, 1.0, 0.75])
    h = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))  # 0.811 bits
    np.testing.assert_allclose(tags["cluster_entropy"], [1.0, h, 0.0, h], atol=1e-12)
    # (bucket, cluster) per step: (0,0) (0,0) (4,2) (0,0)
    assert tags["run_length"].tolist() == [2, 2, 1, 1]
    assert tags["run_position"].tolist() == [1, 2, 1, 1]
    assert tags["steps_since_cluster_seen"].tolist() == [pd.NA, 1, pd.NA, 2]
    assert tags["steps_since_bucket_seen"].tolist() == [pd.NA, 1, pd.NA, 2]
    assert list(tags.columns[: len(TAG_COLUMNS)]) == list(TAG_COLUMNS)


def test_steps_since_seen_counts_presence_not_only_dominance():
    # cluster 1 is a minority in step 0, absent in steps 1-2, dominant in step 3: last seen 3 steps before.
    samples = pd.DataFrame(
        {"sample_id": np.arange(7), "n_tokens": np.full(7, 10, np.int32), "cluster": [0, 0, 1, 0, 0, 1, 1]}
    )
    plan = pd.DataFrame({"step": [0, 0, 0, 1, 2, 3, 3], "sample_id": np.arange(7)})
    tags = tag_steps(plan, samples, BOUNDS)
    assert tags["cluster"].tolist() == [0, 0, 0, 1]
    assert tags["steps_since_cluster_seen"].tolist() == [pd.NA, 1, 1, 3]
    assert tags["run_length"].tolist() == [3, 3, 3, 1]
    assert tags["n_batches"].tolist() == [1, 1, 1, 1]  # a plan with only `step`: one batch per step


def test_padded_tokens_equal_a_direct_count_over_the_builders_batches():
    rng = np.random.default_rng(1)
    samples = pd.DataFrame(
        {"sample_id": np.arange(3000) * 3 + 7, "n_tokens": rng.integers(10, 12000, 3000).astype(np.int32)}
    )
    batches = [static_sorted(samples, e, 0) for e in range(2)]
    lengths = dict(zip(samples["sample_id"], np.minimum(samples["n_tokens"], 8192)))
    padded = sum(len(b) * max(lengths[s] for s in b) for epoch in batches for b in epoch)
    real = sum(lengths[s] for epoch in batches for b in epoch for s in b)
    plan = assign_steps(rebuild_plan(samples, resolve_builder("static_sorted"), 2), grad_accum=3, world_size=2)
    tags = tag_steps(plan, samples, BOUNDS)
    assert int(tags["padded_tokens"].sum()) == padded
    assert int(tags["real_tokens"].sum()) == real
    assert tags["n_batches"].sum() == sum(len(e) for e in batches)
    assert tags["step"].tolist() == list(range(len(tags)))
    assert ((tags["padding_ratio"] >= 0) & (tags["padding_ratio"] < 1)).all()


def test_composition_shares_sum_to_one_per_step(tiny):
    plan, samples = tiny
    comp = composition(assign_steps(plan, grad_accum=2), samples, by="cluster")
    assert comp.groupby("step")["share"].sum().tolist() == [1.0, 1.0, 1.0, 1.0]
    assert comp.loc[comp["step"] == 1, ["cluster", "n_samples"]].to_numpy().tolist() == [[0, 3], [1, 1]]


def test_a_plan_sample_missing_from_samples_is_bad_input(tiny):
    plan, samples = tiny
    with pytest.raises(ForensicsError, match="not in the samples"):
        tag_steps(assign_steps(plan), samples[samples["sample_id"] != 6], BOUNDS)


def test_without_text_every_step_is_cluster_minus_one_with_a_warning(tiny):
    plan, samples = tiny
    result = tag_case(plan, samples.drop(columns=["cluster", "cluster_name"]))
    assert (result.tags["cluster"] == -1).all()
    assert any("no 'text' column" in w for w in result.warnings)


def test_given_clusters_are_kept_unless_clustering_is_asked_for(tiny):
    plan, samples = tiny
    samples = samples.assign(
        text=["question capital city"] * 2
        + ["solve integral equation"] * 2
        + ["def return self"] * 2
        + ["question capital river", "solve integral prime"]
    )
    assert tag_case(plan, samples).clusters.method == "given"
    result = tag_case(plan, samples, clusters=3)
    assert result.clusters.method == "text"
    # the three kinds of text are three clusters, whatever their ids
    by_kind = result.samples.groupby(result.samples["text"].str.split().str[0])["cluster"].nunique()
    assert by_kind.tolist() == [1, 1, 1] and result.samples["cluster"].nunique() == 3
    with pytest.raises(ForensicsError, match="'clusters'"):
        tag_case(plan, samples, clusters="many")


def test_optimal_boundaries_are_the_finders(tiny):
    import forensics.plan.optimal_boundaries as finder

    plan, samples = tiny
    result = tag_case(plan, samples, boundaries="optimal", n_buckets=3)
    lengths = np.minimum(samples["n_tokens"].to_numpy(np.int64), 8192)
    assert result.boundaries == finder.optimal_boundaries(lengths, 3, max_len=8192)
    assert len(result.boundaries) == 4
    assert result.tags["bucket"].between(0, 2).all()


# --- the demo runs ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_tables(demo_small):
    out = {}
    for name in ("static", "bucketed"):
        case = open_case(demo_small / name)
        samples = load_samples(case.samples_path)
        out[name] = (case, load_plan(case.plan_path, samples), samples)
    return out


def test_every_demo_step_has_its_bucket_and_a_text_cluster(demo_tables):
    for case, plan, samples in demo_tables.values():
        k = samples["source"].nunique()
        result = tag_case(
            plan,
            samples,
            grad_accum=case.config.grad_accum,
            world_size=case.config.world_size,
            boundaries=case.config.boundaries,
            clusters=k,
        )
        tags = result.tags
        assert tags["step"].tolist() == sorted(result.plan["step"].unique())
        assert tags["bucket"].between(0, len(case.config.boundaries) - 2).all()
        assert tags["cluster"].between(0, k - 1).all() and tags["cluster_name"].str.len().min() > 0
        assert tags[["bucket", "cluster", "cluster_entropy", "padding_ratio"]].notna().all().all()
        assert int(tags["n_samples"].sum()) == len(plan)
        assert adjusted_rand_score(samples["source"], result.samples["cluster"]) >= 0.9


def test_static_demo_repeats_its_steps_each_epoch_and_pads_less_than_bucketed(demo_tables):
    tags = {
        name: tag_case(plan, samples, cluster_by="source", boundaries=BOUNDS).tags
        for name, (_, plan, samples) in demo_tables.items()
    }
    # both plans put one bucket in each batch
    for t in tags.values():
        assert t["bucket_share"].mean() > 0.9
    # static: the same batches every epoch (only their order moves), so each epoch has the same multiset of steps
    static = tags["static"]
    per_epoch = [sorted(zip(g["n_samples"], g["real_tokens"])) for _, g in static.groupby("epoch")]
    assert len(per_epoch) == 6 and all(e == per_epoch[0] for e in per_epoch)
    bucketed = tags["bucketed"]
    per_epoch_b = [sorted(zip(g["n_samples"], g["real_tokens"])) for _, g in bucketed.groupby("epoch")]
    assert per_epoch_b[1] != per_epoch_b[0]
    # sorted packing is nearly unpadded; shuffling inside wide buckets pads more
    assert static["padding_ratio"].mean() < 0.1 < bucketed["padding_ratio"].mean()


def test_clusters_from_text_alone_recover_the_demo_sources_with_k_chosen(demo_tables, monkeypatch):
    monkeypatch.setenv("FORENSICS_NO_CACHE", "1")  # both fits done afresh: the seed, not the cache, makes them equal
    _, _, samples = demo_tables["static"]
    clustered, info = cluster_samples(samples, k=None, seed=0)
    assert info.k == samples["source"].nunique()
    assert adjusted_rand_score(samples["source"], clustered["cluster"]) >= 0.9
    again, _ = cluster_samples(samples, k=None, seed=0)
    assert again["cluster"].tolist() == clustered["cluster"].tolist()  # seeded: same inputs, same clusters


def test_fast_term_counts_and_tfidf_are_scikit_learns_matrices_entry_for_entry():
    """ASCII texts are counted on their bytes, others by scikit-learn's analyser: the same CSR either way, on texts
    full of what tokenisers disagree on (punctuation, digits, underscores, case, one-letter runs, accents, the Turkish
    dotted I, Greek final sigma, replacement characters, empty texts), in any chunk and slice."""
    from sklearn.feature_extraction.text import CountVectorizer

    from forensics.tagging.clusters import TextClusterer

    rng = np.random.default_rng(0)
    chars = list("abcABC01_ ,.!\t\n-'") + ["\u00e9", "\u03a3", "\u0130", "\u00df", "\ufffd"]
    weights = np.array([8] * 6 + [3, 3, 2, 15, 3, 3, 2, 2, 2, 2, 2] + [0.3] * 5)
    texts = np.array(
        ["".join(rng.choice(chars, size=int(rng.integers(0, 40)), p=weights / weights.sum())) for _ in range(3000)]
        + ["", "a", "ab", "Question: the capital?", "\u03a3\u039f\u03a6\u039f\u03a3"],
        dtype=object,
    )
    model = TextClusterer(3, max_fit=3000, seed=0, chunk=700)
    model.fit(texts)
    assert 0.1 < np.mean([not t.isascii() for t in texts]) < 0.9 and len(model.vectorizer_.vocabulary_) > 100
    assert model._tfidf(texts).nnz > 3000
    for part in (texts, texts[17:1234], texts[-3:]):
        fast, reference = model._tfidf(part), model.vectorizer_.transform(part)
        assert fast.dtype == reference.dtype == np.float32
        assert np.array_equal(fast.indptr, reference.indptr) and np.array_equal(fast.indices, reference.indices)
        assert np.array_equal(fast.data, reference.data)  # the same floats, not merely close ones
        assert CountVectorizer.transform(model.vectorizer_, part).nnz == fast.nnz
    # predict (chunked, fast counts) labels every text as the reference features would
    reference_labels = model.relabel_[model.kmeans_.predict(model._reduce(model.vectorizer_.transform(texts)))]
    assert np.array_equal(model.predict(texts), reference_labels)


def test_cluster_by_a_label_column_names_clusters_by_label(demo_tables):
    _, _, samples = demo_tables["static"]
    clustered, info = cluster_samples(samples, cluster_by="source")
    assert info.names == dict(enumerate(sorted(samples["source"].unique())))
    assert (clustered["cluster_name"] == clustered["source"]).all()


# --- the CLI -------------------------------------------------------------------------------------------------------
def test_cli_tags_a_case_and_writes_samples_with_bucket_and_cluster(demo_small, tmp_path, capsys):
    out, s2 = tmp_path / "tags.parquet", tmp_path / "s2.parquet"
    code = main(
        [
            "tag",
            str(demo_small / "static"),
            "--clusters",
            "5",
            "--grad-accum",
            "2",
            "--step-offset",
            "1",
            "-o",
            str(out),
            "--samples-out",
            str(s2),
        ]
    )
    assert code == 0
    tags = pd.read_parquet(out)
    assert set(TAG_COLUMNS) <= set(tags.columns)
    plan = load_plan(demo_small / "static" / "plan.parquet")
    # the demo plan has explicit steps, which win over --grad-accum; --step-offset leaves plan steps alone
    assert tags["step"].tolist() == sorted(plan["step"].unique())
    samples = pd.read_parquet(s2)
    assert {"bucket", "cluster", "cluster_name"} <= set(samples.columns)
    meta = json.loads(pq.read_schema(out).metadata[b"forensics"])
    assert meta["boundaries"] == BOUNDS and meta["clusters"]["k"] == 5
    printed = capsys.readouterr()
    assert f"tagged {len(tags)} steps" in printed.out
    assert "the plan has a 'step' column, which wins: grad_accum not used" in printed.err


def test_cli_with_plan_and_samples_files(tiny, tmp_path):
    plan, samples = tiny
    plan.to_csv(tmp_path / "plan.csv", index=False)
    samples.to_parquet(tmp_path / "samples.parquet")
    out = tmp_path / "t.parquet"
    assert (
        main(
            [
                "tag",
                "--plan",
                str(tmp_path / "plan.csv"),
                "--samples",
                str(tmp_path / "samples.parquet"),
                "--grad-accum",
                "2",
                "--boundaries",
                "0,500,8192",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    tags = pd.read_parquet(out)
    assert tags["padded_tokens"].tolist() == [2400, 320, 16384, 520]
    assert tags["bucket"].tolist() == [0, 0, 1, 0]  # (0, 500] and (500, 8192]
    assert tags["cluster_name"].tolist() == ["qa", "qa", "code", "qa"]  # the samples' given clusters are kept


@pytest.mark.parametrize(
    "args, message",
    [
        (["--plan", "{d}/missing.parquet", "--samples", "{d}/samples.parquet"], "does not exist"),
        (["--plan", "{d}/bad_plan.csv", "--samples", "{d}/samples.parquet"], "needs a 'step' column"),
        (["--plan", "{d}/plan.csv", "--samples", "{d}/samples.parquet", "--clusters", "many"], "--clusters"),
        (["--plan", "{d}/plan.csv", "--samples", "{d}/samples.parquet", "--cluster-by", "topic"], "topic"),
        (["--plan", "{d}/plan.csv", "--samples", "{d}/samples.parquet", "--boundaries", "0,900,100"], "increase"),
        (["--plan", "{d}/plan.csv", "--samples", "{d}/samples.parquet", "--grad-accum", "0"], "--grad-accum"),
        (["--samples", "{d}/samples.parquet"], "needs a plan"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tiny, tmp_path, capsys, args, message):
    plan, samples = tiny
    plan.to_csv(tmp_path / "plan.csv", index=False)
    plan.drop(columns=["batch_id"]).to_csv(tmp_path / "bad_plan.csv", index=False)
    samples.to_parquet(tmp_path / "samples.parquet")
    code = main(["tag", *[a.format(d=tmp_path) for a in args], "-o", str(tmp_path / "t.parquet")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "t.parquet").exists()


def test_texts_without_words_tag_without_clusters_and_say_so():
    import numpy as np
    import pandas as pd

    from forensics.tagging import tag_case

    samples = pd.DataFrame({"sample_id": np.arange(10), "n_tokens": np.arange(10) * 100 + 5, "text": [""] * 10})
    plan = pd.DataFrame({"step": np.repeat(np.arange(5), 2), "sample_id": np.arange(10)})
    result = tag_case(plan, samples)
    assert result.tags["cluster"].tolist() == [-1] * 5
    assert any("hold no words" in w for w in result.warnings)
