"""The harmful-samples estimate's two vetoes (forensics.detect.evidence.sample_effects) against their definitions, one
sample at a time: "one appearance carries it" and "its batch-mates share its excess". The estimate takes the
candidates together; each answer must be the one a loop over the candidates gives, bit for bit."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from forensics.detect.evidence import sample_effects
from forensics.detect.evidence.sample_effects import _one_appearance_carries, _shared_by_batch


def _carries_by_definition(w: sp.csr_matrix, r: np.ndarray, candidates: np.ndarray, floor: float) -> np.ndarray:
    """A sample appeared once, or with its largest contribution left out its score is below ``floor``."""
    wc = w.tocsc()
    out = np.zeros(w.shape[1], bool)
    for j in np.flatnonzero(candidates):
        rows = wc.indices[wc.indptr[j] : wc.indptr[j + 1]]
        vals = wc.data[wc.indptr[j] : wc.indptr[j + 1]]
        if len(rows) < 2:
            out[j] = True
            continue
        terms = vals * r[rows]
        rest = np.delete(np.arange(len(rows)), int(np.argmax(terms)))
        norm = float(np.sqrt(np.sum(vals[rest] ** 2)))
        out[j] = norm <= 0 or float(terms[rest].sum()) / norm < floor
    return out


def _shared_by_definition(
    w: sp.csr_matrix, r: np.ndarray, z: np.ndarray, candidates: np.ndarray, share: float
) -> np.ndarray:
    """The median score of the other samples of a candidate's steps reaches ``share`` of its own."""
    a = (w > 0).astype(np.float64).tocsr()
    marginal = (a.T @ r) / np.sqrt(np.maximum(np.asarray(a.sum(axis=0)).ravel(), 1.0))
    out = np.zeros(len(z), bool)
    ac = a.tocsc()
    for j in np.flatnonzero(candidates & (z > 2.0)):
        steps = ac.indices[ac.indptr[j] : ac.indptr[j + 1]]
        mates = np.setdiff1d(
            np.concatenate([a.indices[a.indptr[i] : a.indptr[i + 1]] for i in steps] or [np.empty(0, a.indices.dtype)]),
            [j],
        )
        out[j] = bool(len(mates)) and float(np.median(marginal[mates])) >= share * float(marginal[j])
    return out


def _design(seed: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """Steps x samples token shares: batches of 1-12 samples, samples seen 0-9 times (some once, some never), ties
    in a step's largest contribution, a step holding one sample alone, residuals with NaN in a few steps."""
    rng = np.random.default_rng(seed)
    n_steps, n_samples = int(rng.integers(40, 160)), int(rng.integers(30, 120))
    rows, cols, vals = [], [], []
    for s in range(n_steps):
        members = rng.choice(n_samples, size=int(rng.integers(1, 13)), replace=False)
        share = rng.choice([0.25, 0.5, 1.0], size=len(members)) if rng.random() < 0.3 else rng.random(len(members))
        rows += [s] * len(members)
        cols += members.tolist()
        vals += (share / share.sum()).tolist()
    w = sp.csr_matrix((vals, (rows, cols)), shape=(n_steps, n_samples))
    r = rng.standard_t(3, n_steps) + (rng.random(n_steps) < 0.1) * 4.0
    r[rng.random(n_steps) < 0.03 * (seed % 2)] = np.nan
    z = rng.normal(2.0, 1.5, n_samples)
    candidates = rng.random(n_samples) < 0.7
    return w, r, z, candidates


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("floor", [0.0, 1.0, 2.0])
def test_one_appearance_carries_is_its_definition(seed: int, floor: float) -> None:
    w, r, _, candidates = _design(seed)
    want = _carries_by_definition(w, r, candidates, floor)
    assert want.any() and (floor > 0 or (candidates & ~want).any())  # both answers occur in the table
    np.testing.assert_array_equal(_one_appearance_carries(w, r, candidates, floor), want)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_shared_by_batch_is_its_definition(seed: int, share: float, monkeypatch) -> None:
    w, r, z, candidates = _design(seed)
    want = _shared_by_definition(w, r, z, candidates, share)
    np.testing.assert_array_equal(_shared_by_batch(w, r, z, candidates, share), want)
    monkeypatch.setattr(sample_effects, "MATES_AT_ONCE", 7)  # candidates a few at a time: the same answers
    np.testing.assert_array_equal(_shared_by_batch(w, r, z, candidates, share), want)


def test_the_vetoes_without_candidates() -> None:
    w, r, z, _ = _design(0)
    none = np.zeros(w.shape[1], bool)
    assert not _one_appearance_carries(w, r, none).any()
    assert not _shared_by_batch(w, r, z, none).any()


def test_blocks_are_the_samples_with_exactly_the_same_steps() -> None:
    """Columns: 0, 1 and 3 share steps {0, 2}; 2 shares {0} alone; 4 has steps {0, 2, 3}; 5 never appears. Only the
    samples of ``near`` are compared, but a block takes in every member, near or not."""
    w = sp.csr_matrix(
        np.array(
            [
                [0.2, 0.3, 0.5, 0.1, 0.2, 0.0],
                [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                [0.4, 0.1, 0.0, 0.3, 0.2, 0.0],
                [0.0, 0.0, 0.0, 0.0, 0.6, 0.0],
            ]
        )
    )
    cases = [  # near, blocks
        ([False, True, False, False, False, False], [0, 0, 2, 0, 4, 5]),
        ([True, True, True, True, True, True], [0, 0, 2, 0, 4, 5]),
        ([False] * 6, [0, 1, 2, 3, 4, 5]),
        ([False, False, True, False, True, True], [0, 1, 2, 3, 4, 5]),
    ]
    for near, want in cases:
        np.testing.assert_array_equal(sample_effects._blocks(w, np.array(near)), want)


def test_a_blocks_samples_share_its_effect_and_are_listed_by_id(audited_static_block) -> None:
    """A static plan packs the same corrupted samples together every epoch: the run cannot tell them apart, so each
    is credited with what the block adds (not the one the pursuit happened to take with the rest at 0%)."""
    listed = audited_static_block
    blocks: dict[tuple, list[dict]] = {}
    for h in listed:
        blocks.setdefault(tuple(h["steps"]), []).append(h)
    shared = [b for b in blocks.values() if len(b) > 1]
    assert shared, "the static case has samples that always come together"
    for b in shared:
        assert len({round(h["effect"], 9) for h in b}) == 1 and b[0]["effect"] > 0.05
    assert all(h["effect"] > 0 for h in listed)


@pytest.fixture(scope="module")
def audited_static_block(demo_small, tmp_path_factory) -> list[dict]:
    import contextlib
    import io
    import json

    from forensics.cli import main

    out = tmp_path_factory.mktemp("blocks") / "findings.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["audit", str(demo_small / "static"), "--no-html", "--json", str(out)]) == 0
    return json.loads(out.read_text())["harmful_samples"]


@pytest.mark.parametrize(
    ("q", "excess", "listed"),
    [
        (0.05, 0.5, True),  # at both limits
        (0.05, 0.49, False),  # significant, but its own loss under 1.5x what its steps expect of it
        (0.0501, 2.0, False),  # a large excess, not significant
        (0.0, 0.0, False),  # the pursuit gave it no effect: its steps' excess is its batch-mates'
        (1e-300, 0.51, True),
    ],
)
def test_a_sample_is_listed_only_when_significant_and_its_excess_matters(q, excess, listed) -> None:
    from forensics.detect.rules.harmful_samples import MIN_EXCESS, listed_samples

    assert MIN_EXCESS == 0.5
    est = pd.DataFrame(
        {"sample_id": [7, 8], "q": [q, 0.5], "excess": [excess, 3.0], "z": [5.0, 9.0], "content": [False, True]}
    )
    assert listed_samples(est, q=0.05)["sample_id"].tolist() == ([7] if listed else [])


def test_listed_samples_put_content_evidence_first_then_the_score() -> None:
    from forensics.detect.rules.harmful_samples import listed_samples

    est = pd.DataFrame(
        {
            "sample_id": [1, 2, 3, 4],
            "q": [0.01] * 4,
            "excess": [1.0] * 4,
            "z": [9.0, 3.0, 5.0, 5.0],
            "content": [False, True, False, False],
        }
    )
    assert listed_samples(est, q=0.05)["sample_id"].tolist() == [2, 1, 3, 4]
    assert listed_samples(est, q=0.05, limit=2)["sample_id"].tolist() == [2, 1]


@pytest.mark.parametrize(
    ("step_excess", "taken_beta", "want"),
    [
        # two suspects hold half of each of their two steps; the pursuit credited the first with the steps' whole
        # log-excess ln 2 (leaving 0): put back, both carry it (expm1 = 1 over the share of 1 they hold together)
        ([np.log(2.0), np.log(2.0)], 2 * np.log(2.0), 1.0),
        # nothing was taken and the steps kept ln 3 and 0: the mean of 2 and 0 over the share held together
        ([np.log(3.0), 0.0], 0.0, 1.0),
        # a step that fell below its expectation counts against it
        ([np.log(2.0), np.log(0.5)], 0.0, 0.25),
    ],
)
def test_an_untaken_suspect_shares_its_steps_excess_with_the_other_suspects(step_excess, taken_beta, want) -> None:
    """The untaken sample's excess: what its steps kept with the taken suspects' effects put back, over the token
    share the suspects hold there together, averaged over its appearances (scale 1: the noise weights are neutral)."""
    from forensics.detect.evidence.sample_effects import _group_excess

    # steps 0 and 1 each hold samples 0 and 1 at half the tokens; sample 2 (not a suspect) holds step 2
    w = sp.csr_matrix(np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]))
    beta = np.array([taken_beta, 0.0, 0.0])
    left = np.array([*step_excess, 0.0]) - w @ beta  # what the steps kept after the taken effect
    near = np.array([True, True, False])
    which = np.array([False, True, False])
    got = _group_excess(w, left, beta, np.ones(3), near, which)
    assert got == pytest.approx([want])


def _decoy_run(seed: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Two corrupted samples, A (steps 10 and 30) and B (step 20; its other step fell before the logged rows), and a
    clean decoy D whose two batches were those of steps 10 and 20, a touch hotter than 30: the greedy pursuit takes
    D first. Columns: D, a clean C (steps 30 and 40), A, B, then one clean sample per other step; all with content
    evidence but the fillers."""
    rng = np.random.default_rng(seed)
    n = 80
    r = 0.05 * rng.standard_normal(n)
    r[[10, 20, 30, 40]] = [1.02, 1.03, 1.0, 0.0]  # the noise elsewhere (its robust SD is the pursuit's scale)
    steps = {0: [10, 20], 1: [30, 40], 2: [10, 30], 3: [20]}
    fillers = [s for s in range(n) if s not in (10, 20, 30, 40)]
    rows = [s for c in steps for s in steps[c]] + fillers
    cols = [c for c in steps for _ in steps[c]] + list(range(4, 4 + len(fillers)))
    w = sp.csr_matrix((np.full(len(rows), 0.25), (rows, cols)), shape=(n, 4 + len(fillers)))
    first = np.zeros(w.shape[1], bool)
    first[:4] = True
    return w, r, first


@pytest.mark.parametrize("seed", range(5))
def test_the_pursuits_exchanges_undo_a_decoy_the_greedy_order_took(seed: int, monkeypatch) -> None:
    w, r, first = _decoy_run(seed)
    assert np.flatnonzero(sample_effects._pursuit(w, r, 50, first=first) > 0).tolist() == [2, 3]
    monkeypatch.setattr(sample_effects, "EXCHANGE_ROUNDS", 0)  # the greedy order alone keeps the decoy
    assert np.flatnonzero(sample_effects._pursuit(w, r, 50, first=first) > 0).tolist() == [0, 2, 3]
