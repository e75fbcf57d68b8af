"""The report stage: spike-preserving downsampling, the offline HTML file, escaping of dataset text, cards, size."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from plotly.offline import get_plotlyjs

from forensics.plan.buckets import bucket_index, bucket_range
from forensics.plan.builders import static_sorted
from forensics.plan.step_mapping import batches_to_plan
from forensics.report import (
    build_report,
    cluster_mix_figure,
    composition_figure,
    loss_figure,
    minmax_indices,
    plot_indices,
    report_figures,
    stride_indices,
    write_report,
)
from forensics.report.downsample import numpy_minmax_indices
from forensics.report.figures import batch_epoch_counts
from forensics.schema import DEFAULT_BOUNDARIES
from forensics.stats import variance_share

SCRIPT_TEXT = "<script>alert(1)</script>"
SPIKE_STEPS = (254, 258)
STEPS_PER_EPOCH = 1000


# --- a small synthetic run: static plan, length-correlated clusters, two spikes, one hostile sample text ------------
def synthetic_case(n_epochs: int = 3, seed: int = 0, with_nan: bool = False) -> dict:
    """Tables of a short static-plan run and the findings an audit would give for it.

    The plan is the story's: samples sorted by length and packed into 4-sample batches once, only the batch order
    shuffled per epoch, so the spike batch recurs in every epoch. Sample 7's text is hostile HTML.
    """
    rng = np.random.default_rng(seed)
    n_samples = 4 * STEPS_PER_EPOCH
    n_tokens = np.clip(rng.lognormal(6.8, 0.8, n_samples), 16, 8192).astype(np.int32)
    cluster = np.digitize(n_tokens, [600, 1500, 3000]).astype(np.int64)  # length-correlated content
    sources = np.array(["qa", "chat", "docs", "code"])[cluster]
    words = np.array(["alpha", "beta", "gamma", "delta", "loss", "token", "batch", "def", "return", "epoch"])
    text = [" ".join(rng.choice(words, 12)) for _ in range(n_samples)]
    order = np.argsort(n_tokens, kind="stable")
    batches = order.reshape(STEPS_PER_EPOCH, 4)
    spike_batch = int(np.flatnonzero(cluster[batches].min(axis=1) == 3)[0])
    spike_ids = batches[spike_batch]
    text[int(spike_ids[0])] = f"def f(): return 1  # {SCRIPT_TEXT} & more </script><b>bold?</b>"
    samples = pd.DataFrame(
        {
            "sample_id": np.arange(n_samples, dtype=np.int64),
            "n_tokens": n_tokens,
            "text": pd.array(text, dtype="string"),
            "source": pd.array(sources, dtype="string"),
            "cluster": cluster,
        }
    )
    rows = []
    positions = []  # step of the spike batch in each epoch
    for e in range(n_epochs):
        perm = rng.permutation(STEPS_PER_EPOCH)
        if e == 0:  # put the spike batch at step 254 in epoch 0, like the story
            j = int(np.flatnonzero(perm == spike_batch)[0])
            perm[[j, SPIKE_STEPS[0]]] = perm[[SPIKE_STEPS[0], j]]
        for k, b in enumerate(perm):
            for sid in batches[b]:
                rows.append((e * STEPS_PER_EPOCH + k, int(sid), e, k))
        positions.append(e * STEPS_PER_EPOCH + int(np.flatnonzero(perm == spike_batch)[0]))
    plan = pd.DataFrame(rows, columns=["step", "sample_id", "epoch", "batch_id"])
    n_steps = n_epochs * STEPS_PER_EPOCH
    steps = np.arange(n_steps, dtype=np.int64)
    step_len = plan.groupby("step")["sample_id"].apply(lambda s: n_tokens[s.to_numpy()].mean()).to_numpy()
    bucket = bucket_index(step_len, DEFAULT_BOUNDARIES)
    step_cluster = (
        plan.assign(c=cluster[plan["sample_id"]]).groupby("step")["c"].agg(lambda c: np.bincount(c).argmax()).to_numpy()
    )
    names = {0: "qa what is", 1: "chat hello", 2: "docs <i>api</i>", 3: "code def </script> return"}
    tags = pd.DataFrame(
        {
            "step": steps,
            "epoch": steps // STEPS_PER_EPOCH,
            "bucket": bucket,
            "bucket_range": [bucket_range(int(b), DEFAULT_BOUNDARIES) for b in bucket],
            "cluster": step_cluster,
            "cluster_name": [names[int(c)] for c in step_cluster],
            "cluster_entropy": np.zeros(n_steps),
            "padding_ratio": np.full(n_steps, 0.1),
        }
    )
    loss = 0.9 + 2.0 * np.exp(-steps / 60) + 0.04 * bucket + 0.02 * rng.standard_normal(n_steps)
    loss[list(SPIKE_STEPS)] = [4.5, 5.25]
    grad = 1.0 + 0.1 * rng.standard_normal(n_steps)
    grad[list(SPIKE_STEPS)] = [9.0, 11.0]
    if with_nan:
        loss[2500] = np.nan
        grad[2500] = np.inf
    metrics = pd.DataFrame(
        {"step": steps, "train/loss": loss, "grad_norm": grad, "lr": np.minimum(1.0, (steps + 1) / 100) * 3e-4}
    )
    spike_bucket = int(bucket[SPIKE_STEPS[0]])
    spikes = []
    for s, value, score in zip(SPIKE_STEPS, (4.5, 5.25), (41.5, 48.25)):
        spikes.append(
            {
                "kind": "spike",
                "step": s,
                "end_step": s,
                "peak_step": s,
                "metric": "train/loss",
                "value": value,
                "baseline": 0.96,
                "score": score,
                "suspect_samples": [int(i) for i in spike_ids] if s == 254 else [],
                "bucket": spike_bucket,
                "bucket_range": bucket_range(spike_bucket, DEFAULT_BOUNDARIES),
                "cluster": 3,
                "cluster_name": names[3],
                "evidence": [f"loss {value} is {value / 0.96:.1f}x its baseline 0.96 (score {score})"],
                "next_step": f"Replay step {s} from the checkpoint before it with `forensics replay --step {s}`.",
                "recurrence": [{"epoch": e, "step": p, "value": float(loss[p])} for e, p in enumerate(positions) if e]
                if s == 254
                else [],
            }
        )
    findings = {
        "spikes": spikes,
        "nonfinite": [
            {"step": 2500, "metric": "train/loss", "value": float("nan")},
            {"step": 2500, "metric": "grad_norm", "value": float("inf")},
        ]
        if with_nan
        else [],
        "oscillation": {"detected": False, "bucket_variance_share": 0.42},
        "plan": {
            "static": True,
            "pair_retention": [1.0] * (n_epochs - 1),
            "identical_batches": [1.0] * (n_epochs - 1),
            "threshold": {"pair_retention": 0.2, "identical_batches": 0.1, "how": "fixed"},
        },
        "warnings": ["metric 'train/loss': 1 NaN and 0 inf values kept"] if with_nan else [],
    }
    return {
        "findings": findings,
        "metrics": metrics,
        "tags": tags,
        "samples": samples,
        "plan": plan,
        "spike_ids": [int(i) for i in spike_ids],
        "positions": positions,
    }


@pytest.fixture(scope="module")
def case() -> dict:
    return synthetic_case()


@pytest.fixture(scope="module")
def report(case: dict) -> str:
    return build_report(case["findings"], case["metrics"], case["tags"], case["samples"], case["plan"])


def _report_inputs(case: dict) -> dict:
    return {k: case[k] for k in ("findings", "metrics", "tags", "samples", "plan")}


def _embedded_json(html: str) -> str:
    m = re.search(r'<script type="application/json" id="forensics-figures">(.*?)</script>', html, re.S)
    assert m, "the figures' JSON element is missing"
    return m.group(1)


# --- downsampling -----------------------------------------------------------------------------------------------------
def test_minmax_downsampling_keeps_every_isolated_spike_while_striding_loses_them():
    rng = np.random.default_rng(1)
    n = 1_000_000
    y = 0.9 + 0.05 * rng.standard_normal(n)
    spikes = np.arange(40) * 24_000 + rng.integers(1_000, 20_000, 40)  # isolated: >= 5,000 steps apart
    y[spikes] = 4.0 + rng.random(40)
    x = np.arange(n, dtype=np.int64)
    kept = minmax_indices(x, y, 4000)
    assert len(kept) <= 4000
    assert np.isin(spikes, kept).all(), "a spike's peak was dropped by the min/max downsampler"
    fallback = numpy_minmax_indices(y, 4000)
    assert len(fallback) <= 4002 and np.isin(spikes, fallback).all()
    strided = stride_indices(n, 4000)
    assert len(strided) == 4000
    survivors = int(np.isin(spikes, strided).sum())
    assert survivors <= 2, f"striding kept {survivors} of 40 one-step spikes; it should lose nearly all"
    # what the plot shows: the max of the drawn points equals the true max in every 25,000-step window
    drawn_max = pd.Series(y[kept]).groupby(kept // 25_000).max()
    true_max = pd.Series(y).groupby(np.arange(n) // 25_000).max()
    np.testing.assert_allclose(drawn_max.to_numpy(), true_max.loc[drawn_max.index].to_numpy())


def test_without_tsdownsample_the_numpy_fallback_keeps_the_same_spikes(monkeypatch):
    import sys

    rng = np.random.default_rng(2)
    y = rng.standard_normal(300_000)
    spikes = np.array([1_234, 77_777, 150_001, 299_998])
    y[spikes] = 50.0
    y[5] = np.nan
    monkeypatch.setitem(sys.modules, "tsdownsample", None)  # import now raises ImportError
    kept = minmax_indices(np.arange(len(y)), y, 2000)
    assert np.isin(spikes, kept).all() and 5 not in kept and len(kept) <= 2002


def test_binned_median_equals_numpy_median_per_bin():
    from forensics.report.figures import binned_median

    rng = np.random.default_rng(4)
    bins = rng.integers(0, 40, 5001)
    values = rng.standard_normal(5001)
    got = binned_median(bins, values, 42)
    want = [np.median(values[bins == k]) if (bins == k).any() else np.nan for k in range(42)]
    np.testing.assert_allclose(got, want)
    assert np.isnan(got[40:]).all()


def test_plot_indices_draw_every_step_near_findings_and_skip_nonfinite():
    n = 200_000
    y = np.sin(np.arange(n) / 500.0)
    y[100_010] = np.nan
    steps = np.arange(n, dtype=np.int64) + 10  # steps need not start at 0
    idx = plot_indices(steps, y, spans=[(100_000, 100_004)], n_out=1000, window=25)
    near = np.arange(100_000 - 25 - 10, 100_004 + 25 - 10 + 1)
    near = near[near != 100_010]
    assert np.isin(near, idx).all()
    assert 100_010 not in idx
    assert np.isfinite(y[idx]).all()
    assert len(idx) <= 1000 + len(near)


# --- the HTML file ----------------------------------------------------------------------------------------------------
class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        self.scripts += tag == "script"
        for k, v in attrs:
            if k in ("src", "href", "data", "poster", "srcset", "action") and v:
                self.refs.append(v)


def test_report_is_one_file_with_plotly_inlined_once_and_no_network_fetch(report: str, tmp_path, case):
    js = get_plotlyjs()
    assert report.count(js[:400]) == 1 and report.count(js[-400:]) == 1
    parser = _Refs()
    parser.feed(report)
    assert parser.scripts == 3  # plotly, the figures' JSON, the loader
    remote = [r for r in parser.refs if re.match(r"^\s*(https?:)?//", r)]
    assert remote == [], f"the report references the network: {remote[:5]}"
    # outside the inlined library, no URL at all (no CDN, no web font, no @import)
    rest = report.replace(js, "")
    assert not re.search(r"https?://", rest), re.findall(r".{40}https?://.{40}", rest)[:3]
    assert "@import" not in rest and "@font-face" not in rest
    path = write_report(tmp_path / "out" / "report.html", **_report_inputs(case))
    assert path.read_text(encoding="utf-8") == report
    assert f'<meta name="forensics-figures" content="{len(report_figures(**_report_inputs(case)))}">' in report


def test_hostile_sample_text_is_escaped_in_the_page_and_in_the_embedded_json(report: str, case: dict):
    # every </script> in the file closes one of the report's own three script elements
    assert report.count("</script>") == 3 == len(re.findall(r"<script[\s>]", report))
    assert SCRIPT_TEXT not in report
    assert "<b>bold?</b>" not in report
    # the card shows it as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more &lt;/script&gt;&lt;b&gt;bold?&lt;/b&gt;" in report
    blob = _embedded_json(report)
    assert "<" not in blob and ">" not in blob and "&" not in blob.replace("\\u0026", "")
    figs = json.loads(blob)
    hover = [h for t in figs["curves"]["data"] for h in (t.get("hovertext") or []) if "alert(1)" in str(h)]
    assert hover, "the spike's hover names its top suspect's text"
    assert all("&lt;script&gt;alert(1)&lt;/script&gt;" in h and SCRIPT_TEXT not in h for h in hover)
    legend = [t.get("name", "") for f in figs.values() for t in f["data"]]
    assert any("code def &lt;/script&gt; return" in n for n in legend)
    assert not any("</script>" in n for n in legend)


def test_report_size_stays_flat_as_runs_grow():
    """The figures' payload must not grow with the run: 30k and 300k steps embed about the same data."""

    def payload(n: int) -> tuple[int, str]:
        rng = np.random.default_rng(n)
        steps = np.arange(n, dtype=np.int64)
        loss = 1.0 + 0.05 * rng.standard_normal(n)
        peaks = np.linspace(n * 0.1, n * 0.9, 5).astype(int)
        loss[peaks] = 5.0
        metrics = pd.DataFrame({"step": steps, "loss": loss, "grad_norm": 1 + rng.random(n), "lr": np.full(n, 1e-4)})
        bucket = rng.integers(0, 6, n)
        tags = pd.DataFrame(
            {
                "step": steps,
                "epoch": steps * 4 // n,
                "bucket": bucket,
                "bucket_range": [f"b{b}" for b in bucket],
                "cluster": rng.integers(0, 8, n),
                "cluster_name": "c",
            }
        )
        findings = {
            "spikes": [
                {
                    "step": int(p),
                    "end_step": int(p),
                    "peak_step": int(p),
                    "metric": "loss",
                    "value": 5.0,
                    "baseline": 1.0,
                    "score": 80.0,
                }
                for p in peaks
            ],
            "nonfinite": [],
            "oscillation": {"detected": False, "bucket_variance_share": 0.01},
            "plan": None,
        }
        html = build_report(findings, metrics, tags)
        return len(html.encode()) - len(get_plotlyjs().encode()), html

    small, _ = payload(30_000)
    large, html = payload(300_000)
    assert large < 1_500_000, f"{large:,} bytes of figures and cards for 300k steps"
    assert large < 1.3 * small, f"payload grew from {small:,} to {large:,} bytes"
    figs = json.loads(_embedded_json(html))
    curve_x = [t["x"] for t in figs["curves"]["data"] if t.get("mode") == "lines"]
    assert curve_x  # typed arrays (base64) keep it compact
    assert all(isinstance(x, dict) and "bdata" in x for x in curve_x)


def test_spike_cards_show_each_spikes_numbers_batch_and_recurrence(report: str, case: dict):
    cards = re.findall(r'<article class="card finding spike".*?</article>', report, re.S)
    assert len(cards) == 2
    for card, spike in zip(cards, case["findings"]["spikes"]):
        assert f'data-step="{spike["step"]}"' in card
        for number in (
            str(spike["step"]),
            f"{spike['value']:.4g}",
            "0.96",
            f"{spike['score']:.3g}",
            f"{spike['value'] / 0.96:.2f}×",
            spike["bucket_range"],
        ):
            assert number in card, f"card of step {spike['step']} lacks {number!r}"
        assert "code def &lt;/script&gt; return" in card
        # the suggested next step, its command shown as code
        assert (
            f"Replay step {spike['step']} from the checkpoint before it with "
            f"<code>forensics replay --step {spike['step']}</code>." in card
        )
    first = cards[0]
    # the batch: the 4 samples of step 254, the suspects first in their order, each with its length and source
    sample_cells = re.findall(
        r"<tr(?: class=\"is-suspect\")?><td>(?:<span class=\"suspect\">#(\d)</span>)?</td>"
        r"<td>(\d+)</td><td>(\d*)</td><td class=\"num\">(\d+)</td>",
        first,
    )
    assert [int(c[1]) for c in sample_cells] == case["spike_ids"]
    assert [c[0] for c in sample_cells] == ["1", "2", "3", "4"]
    assert all(c[2] == "254" for c in sample_cells)
    n_tokens = case["samples"].set_index("sample_id")["n_tokens"]
    assert [int(c[3]) for c in sample_cells] == [int(n_tokens[i]) for i in case["spike_ids"]]
    assert "The batch at step 254: 4 samples" in first
    # the recurrence: the same batch at its steps in epochs 1 and 2
    for e, p in enumerate(case["positions"][1:], start=1):
        assert f"<tr><td>{e}</td><td>{p}</td>" in first


def test_report_without_plan_or_tags_still_marks_spikes_and_says_the_plan_is_missing(case: dict):
    findings = dict(case["findings"], plan=None, oscillation={"detected": False})
    findings["spikes"] = [
        dict(s, suspect_samples=[], bucket=None, cluster=None, cluster_name=None, recurrence=[])
        for s in findings["spikes"]
    ]
    html = build_report(findings, case["metrics"])
    figs = json.loads(_embedded_json(html))
    assert list(figs) == ["curves"]
    marked = [t for t in figs["curves"]["data"] if t.get("name", "").startswith("spike (")]
    assert [x for t in marked for x in t["x"]] == list(SPIKE_STEPS)
    assert html.count("No plan was given") == 2
    assert "2 train/loss spikes (254, 258)" in html
    assert "not given" in html  # the plan tile


def test_same_inputs_give_a_byte_identical_report(case: dict, report: str):
    again = build_report(**_report_inputs(case))
    assert again == report


def test_nonfinite_steps_are_marked_and_carded_but_not_drawn_as_values():
    case = synthetic_case(with_nan=True)
    html = build_report(**_report_inputs(case))
    figs = json.loads(_embedded_json(html))
    crosses = [t for t in figs["curves"]["data"] if t.get("name") == "NaN/inf"]
    assert [t["x"] for t in crosses] == [[2500], [2500]]
    assert 'data-kind="nonfinite"' in html and "2 NaN/inf values" in html
    assert "metric &#x27;train/loss&#x27;: 1 NaN and 0 inf values kept" in html
    fig = loss_figure(case["metrics"], case["findings"], case["tags"])
    for trace in fig.data:
        if trace.mode in ("lines", "markers") and trace.name != "NaN/inf" and not trace.name.startswith("spike"):
            assert np.isfinite(np.asarray(trace.y, dtype=float)).all()


# --- the figures -----------------------------------------------------------------------------------------------------
def test_batch_epoch_counts_find_static_batches_in_every_epoch_and_reshuffled_ones_in_one(case: dict):
    rec = batch_epoch_counts(case["plan"])
    assert len(rec) == STEPS_PER_EPOCH and (rec["n_epochs"] == 3).all() and (rec["n_samples"] == 4).all()
    rng = np.random.default_rng(3)
    reshuffled = case["plan"].copy()
    for e in (1, 2):  # rebuild batches: sample ids permuted within the epoch
        m = reshuffled["epoch"] == e
        reshuffled.loc[m, "sample_id"] = rng.permutation(reshuffled.loc[m, "sample_id"].to_numpy())
    rec2 = batch_epoch_counts(reshuffled)
    assert len(rec2) == 3 * STEPS_PER_EPOCH and (rec2["n_epochs"] == 1).all()
    fig = composition_figure(case["findings"], case["plan"])
    bars = {t.name: list(t.y) for t in fig.data}
    assert bars["batch-mate pairs kept"] == [1.0, 1.0]
    assert list(bars["distinct batches"]) == [0, 0, STEPS_PER_EPOCH]
    assert "100% of multi-sample batches recur unchanged in all 3 epochs" in fig.layout.title.subtitle.text


def test_batch_epoch_counts_keep_the_ranks_of_a_multi_rank_plan_apart():
    """Two ranks with a stream each (as torch's DistributedSampler gives), both numbering their batches from 0, both
    built once: every rank's batch recurs in all 3 epochs. Merged across ranks by batch_id, the shuffled batch order
    of each rank would pair them differently every epoch and the plan would look rebuilt."""
    rng = np.random.default_rng(0)
    samples = pd.DataFrame(
        {"sample_id": np.arange(400, dtype=np.int64), "n_tokens": rng.integers(50, 2000, 400).astype(np.int32)}
    )
    halves = [samples.iloc[:200].reset_index(drop=True), samples.iloc[200:].reset_index(drop=True)]
    plan = pd.concat(
        [
            batches_to_plan([static_sorted(half, e, seed=rank) for e in range(3)]).assign(rank=rank)
            for rank, half in enumerate(halves)
        ],
        ignore_index=True,
    )
    rec = batch_epoch_counts(plan)
    assert len(rec) == sum(len(static_sorted(half, 0)) for half in halves)
    assert (rec["n_epochs"] == 3).all()
    assert rec["n_samples"].sum() == len(samples)
    fig = composition_figure(None, plan)
    assert "100% of multi-sample batches recur unchanged in all 3 epochs" in fig.layout.title.subtitle.text


def test_cluster_mix_shares_sum_to_one_and_follow_the_samples(case: dict):
    fig = cluster_mix_figure(case["tags"], case["plan"], case["samples"], n_bins=30)
    shares = np.array([np.asarray(t.y, dtype=float) for t in fig.data])
    np.testing.assert_allclose(shares.sum(axis=0), 1.0, atol=1e-6)
    # per sample: overall share of cluster 3 equals its share of the plan's rows
    plan_share = (case["samples"].set_index("sample_id").loc[case["plan"]["sample_id"], "cluster"] == 3).mean()
    c3 = [i for i, t in enumerate(fig.data) if t.name.startswith("cluster 3")][0]
    assert shares[c3].mean() == pytest.approx(plan_share, abs=0.01)


def test_variance_share_recovers_a_known_bucket_effect():
    rng = np.random.default_rng(5)
    g = rng.integers(0, 4, 200_000)
    # bucket means 0, 1, 2, 3 (variance 1.25) plus unit noise: the bucket explains 1.25 / 2.25 of the variance
    v = g + rng.standard_normal(len(g))
    assert variance_share(v, g.astype(np.int64)) == pytest.approx(1.25 / 2.25, abs=0.02)


def test_bucket_figure_titles_the_findings_share_and_draws_one_line_per_bucket(case: dict):
    figs = report_figures(**_report_inputs(case))
    assert list(figs) == ["curves", "bucket_loss", "cluster_loss", "composition", "cluster_mix"]
    fig = figs["bucket_loss"]
    subtitle = fig.layout.title.subtitle.text
    assert "bucket explains 42.0% of the detrended loss variance (as in findings.json)" in subtitle
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(lines) == case["tags"]["bucket"].nunique()
    boxes = [t for t in fig.data if t.type == "box"]
    # the synthetic loss rises 0.04 per bucket: the detrended medians must rise with the bucket
    medians = [b.median[0] for b in boxes]
    assert medians == sorted(medians)


def test_report_reads_findings_json_as_the_findings_model_writes_it():
    """findings.json from the real model: NaN written as null + value_text, details nested, other kinds listed."""
    import forensics.detect.findings as model

    found = model.Findings(
        items=[
            model.Finding(
                kind="spike",
                step=254,
                end_step=255,
                peak_step=255,
                metric="loss",
                value=4.8,
                baseline=0.91,
                score=41.2,
                severity="critical",
                tags={"bucket": 5, "bucket_range": "(3296, 8192]", "cluster": 3, "cluster_name": "code"},
                evidence=["loss 4.8 is 5.3x its baseline 0.91"],
                next_step="Replay step 254.",
                details={"recovery_step": 257, "noise_scale": 0.02},
            ),
            model.Finding(kind="nonfinite", step=900, metric="loss", value=float("nan"), severity="critical"),
            model.Finding(
                kind="level_shift",
                step=600,
                metric="loss",
                value=1.4,
                baseline=0.9,
                evidence=["the loss moved from 0.9 to 1.4 and stayed"],
            ),
        ],
        sections={"oscillation": {"detected": False, "bucket_variance_share": 0.37}},
    )
    findings = json.loads(found.to_json())
    assert findings["nonfinite"][0]["value"] is None  # how the model writes NaN
    steps = np.arange(1000, dtype=np.int64)
    loss = np.full(1000, 0.9)
    loss[254:256] = [4.0, 4.8]
    loss[600:] = 1.4
    loss[900] = np.nan
    html = build_report(findings, pd.DataFrame({"step": steps, "loss": loss}))
    spike = re.search(r'<article class="card finding spike".*?</article>', html, re.S).group(0)
    for shown in (
        "Steps 254-255",
        "4.8",
        "0.91",
        "41.2",
        "5.27×",
        "(3296, 8192]",
        "3 · code",
        "recovered at",
        "257",
        "noise scale",
        "0.02",
        "critical",
    ):
        assert shown in spike, shown
    nonfinite = re.search(r'<article class="card finding nonfinite".*?</article>', html, re.S).group(0)
    assert "<td>900</td><td>loss</td><td>nan</td>" in nonfinite
    shift = re.search(r'<article class="card finding" data-kind="level_shift".*?</article>', html, re.S).group(0)
    assert "<td>600</td>" in shift and "the loss moved from 0.9 to 1.4 and stayed" in shift
    assert "1 loss spike (254) in bucket 5 / &#x27;code&#x27;; 1 non-finite value" in html


def test_composition_figure_names_the_gates_epoch_pairs():
    """Epochs counted from 1 (or with gaps) keep their names; a missing value stays a gap, not a shift."""
    from forensics.report import composition_figure

    plan_section = {
        "static": True,
        "pair_retention": [1.0, None, 0.5],
        "identical_batches": [1.0, None, 0.2],
        "epoch_pairs": [[1, 2], [2, 3], [3, 5]],
        "threshold": {"pair_retention": 0.1},
    }
    fig = composition_figure({"plan": plan_section})
    bars = [t for t in fig.data if t.type == "bar"]
    assert list(bars[0].x) == ["1→2", "2→3", "3→5"]
    assert list(bars[0].y) == [1.0, None, 0.5]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # the same remedy for three single steps: one line naming them all, logged numbers kept
        (
            [
                "Record the plan to name the batch of step 5 (logged 6).",
                "Record the plan to name the batch of step 9 (logged 10).",
            ],
            ["Record the plan to name the batch of steps 5 and 9 (logged 6, 10)."],
        ),
        # different remedies stay apart, in their order
        (["Inspect samples 1, 2 at step 5.", "Replay step 9."], ["Inspect samples 1, 2 at step 5.", "Replay step 9."]),
        # a step range or two steps in one line is never folded
        (["A of steps 4-6.", "A of steps 7-9."], ["A of steps 4-6.", "A of steps 7-9."]),
        (
            ["A of step 1 and step 2.", "A of step 3 and step 4."],
            ["A of step 1 and step 2.", "A of step 3 and step 4."],
        ),
        # a step without a logged number
        (
            ["Record step 30001.", "Record step 100001.", "Record step 60001."],
            ["Record steps 30001, 60001 and 100001."],
        ),
    ],
)
def test_next_steps_asking_the_same_of_single_steps_fold_into_one(steps, expected):
    from forensics.report.summary import _next_steps

    assert _next_steps({"causes": [{"next_step": s} for s in steps]}) == expected


def test_report_top_shares_the_dashboards_strip_and_tables():
    """The report's top reads like the dashboard's: the status strip (state in words and shape), the causes as a
    sortable table, most severe first, and harmful samples consumed together in one row; dataset text escaped."""
    import re

    case = synthetic_case()
    findings = dict(case["findings"])
    last = int(case["metrics"]["step"].iloc[-1])
    findings["causes"] = [
        {
            "id": "C1",
            "kind": "batch",
            "severity": "warning",
            "steps": [254],
            "logged_steps": [254],
            "summary": "spike <script>x</script> at 254: detail",
        },
        {
            "id": "C2",
            "kind": "crash",
            "severity": "critical",
            "steps": [last],
            "logged_steps": [last],
            "summary": "CUDA out of memory",
            "replay": {"verdict": "data"},
        },
    ]
    findings["harmful_samples"] = [
        {"sample_id": 7, "appearances": 2, "steps": [3, 9], "effect": 0.4, "q": 0.01, "reason": "r"},
        {"sample_id": 8, "appearances": 2, "steps": [3, 9], "effect": 0.4, "q": 0.02, "reason": "r"},
    ]
    html = build_report(findings, case["metrics"])
    assert "■ CRITICAL</span> <span>crash cause C2 at steps " in html
    assert "causes: 1 ■ critical, 1 ▲ warning, 0 ● info" in html
    body = html[html.index('id="causes-table"') : html.index("</table>", html.index('id="causes-table"'))]
    rows = re.findall(r"<tr><td>(C\d)</td><td[^>]*>([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td>", body)
    assert rows == [("C2", "■ critical", "crash", str(last)), ("C1", "▲ warning", "batch", "254")]
    assert '<th data-col="5">replay verdict</th>' in body and "cause class" not in body
    assert "spike &lt;script&gt;x&lt;/script&gt; at 254</td>" in body and "<script>x" not in body
    samples = html[html.index('id="samples-table"') : html.index("</table>", html.index('id="samples-table"'))]
    assert samples.count("<tr><td>") == 1 and "<td>7, 8</td><td>2</td><td>+40%</td>" in samples


# --- the expected band of the composition -----------------------------------------------------------------------------
def _curve_traces(html: str) -> list[dict]:
    """The curves figure's traces as embedded in the page (plotly's typed arrays decoded)."""
    import base64

    def decode(v):
        if isinstance(v, dict) and "bdata" in v:
            return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
        return v

    return [{k: decode(v) for k, v in t.items()} for t in json.loads(_embedded_json(html))["curves"]["data"]]


def test_report_draws_the_expected_band_at_the_drivers_expectation(demo_small, tmp_path):
    """``forensics audit --html`` on the demo's static case (with its plan): the loss curve has the shaded band
    "expected from composition" in the legend; its centre at each spike's peak is the expectation the spike was
    judged against (findings.json ``baseline``, the driver's value), and its edges are that expectation times
    exp(-+3 robust SDs) of the loss's log residual against it."""
    import shutil

    from forensics.cli import main
    from forensics.pipeline.audit import run_audit
    from forensics.report.expected import BAND_NAME, BAND_SDS
    from forensics.schema import open_case
    from forensics.stats import robust_sd

    case = tmp_path / "static"
    shutil.copytree(demo_small / "static", case, ignore=shutil.ignore_patterns("wandb"))
    out = tmp_path / "report.html"
    assert main(["audit", str(case), "--html", str(out)]) == 0
    findings = json.loads((case / "findings.json").read_text())
    traces = _curve_traces(out.read_text(encoding="utf-8"))
    band = [t for t in traces if t.get("legendgroup") == "expected"]
    # the loss panel's and the grad norm's: lower edge, upper edge filled down to it (in the legend once), centre
    assert [(t["name"], t.get("yaxis", "y")) for t in band] == [
        (f"{BAND_NAME} (low)", "y"),
        (BAND_NAME, "y"),
        (f"{BAND_NAME} (expected)", "y"),
        (f"{BAND_NAME} (low)", "y2"),
        (BAND_NAME, "y2"),
        (f"{BAND_NAME} (expected)", "y2"),
    ]
    assert [t.get("showlegend") for t in band if t["name"] == BAND_NAME] == [True, False]
    assert band[1]["fill"] == "tonexty"
    low, high, centre = (
        pd.Series(np.asarray(t["y"], np.float64), index=np.asarray(t["x"], np.int64)) for t in band[:3]
    )
    loss_spikes = [s for s in findings["spikes"] if s["metric"] == "train/loss"]
    assert [s["peak_step"] for s in loss_spikes] == [254, 258, 754, 1107]
    for s in loss_spikes:
        assert centre[s["peak_step"]] == pytest.approx(s["baseline"], rel=1e-12)
    # the whole centre line is the driver's expectation at the drawn steps, and the width its residual's noise
    audit = run_audit(open_case(case))
    expected = audit.expected.set_index("step")["train/loss"]
    np.testing.assert_allclose(centre.to_numpy(), expected.reindex(centre.index).to_numpy(), rtol=1e-12)
    loss = audit.metrics.set_index("step")["train/loss"].astype(float).reindex(expected.index)
    r = np.log(loss.to_numpy() / expected.to_numpy())
    width = BAND_SDS * robust_sd(r[np.isfinite(r)])
    np.testing.assert_allclose(low.to_numpy(), centre.to_numpy() * np.exp(-width), rtol=1e-12)
    np.testing.assert_allclose(high.to_numpy(), centre.to_numpy() * np.exp(width), rtol=1e-12)
    assert 0.05 < width < 0.5  # a band a reader can see, not one that hides the spikes
    for s in loss_spikes:  # every spike lies above it
        assert s["value"] > high[s["peak_step"]]
    # the report written again after a replay (the tables read again) draws the same band
    from forensics.pipeline.replay_loop import write_case_report

    write_case_report(open_case(case), findings, None, tmp_path / "again.html")
    again = [t for t in _curve_traces((tmp_path / "again.html").read_text()) if t.get("legendgroup") == "expected"]
    assert [t["name"] for t in again] == [t["name"] for t in band]
    for a, b in zip(again, band):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["y"], b["y"])


def test_report_without_a_plan_draws_no_expected_band(case: dict):
    html = build_report(case["findings"], case["metrics"])
    assert not [t for t in _curve_traces(html) if t.get("legendgroup") == "expected"]
    assert "expected from composition" not in html
