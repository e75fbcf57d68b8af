"""The run-level estimate of each sample's effect on the loss of the steps that consumed it (the method is
described in :mod:`forensics.detect.rules.harmful_samples`, the rule that reports it).

:func:`estimate` returns one row per sample of the plan with its score, its p- and q-values and what its evidence
rests on; the rule lists those under the false-discovery limit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp

from forensics.detect.base import RunTables
from forensics.detect.evidence.content import content_evidence
from forensics.detect.evidence.local_reference import (
    MIN_HALF_WINDOW,
    cluster_token_shares,
    local_residuals,
    relative_noise,
)
from forensics.detect.evidence.nnls import nnls_normal
from forensics.schema import CLUSTER, N_TOKENS, SAMPLE_ID, STEP
from forensics.stats import robust_sd, rolling_median

#: A cluster holding less than this share of the samples is not a covariate (a small family of corrupted samples
#: may be a cluster of its own: its share would explain them away).
COVARIATE_CLUSTER_SHARE = 0.05
#: Huber's constant (robust SDs) for the tag fit's weights.
HUBER_C = 1.5
#: The ridge penalty that shares a step's excess among the samples with content evidence, in units of a typical such
#: sample's squared token shares (3: several corrupted samples of one batch keep a share each; measured on the
#: length-grouped fixture run whose longest samples are corrupted: 1 lists 7 of 10, 3 and 10 list 8, no clean one).
RIDGE = 3.0
#: The content evidence of every sample is read up to this many samples; past it, of the ones whose steps' residuals
#: ran highest (the content family is then chosen by the run's own evidence: a documented approximation).
CONTENT_ALL = 50_000
#: Null scores drawn (the residuals re-assigned at random as many times as it takes, at most ``permutations``).
NULL_SIZE = 4_000_000
#: The most (logged step, sample) entries the estimate holds. Past it (a finished run of a plan too large to load),
#: every k-th logged step is kept, k the fewest that fit: a harmful sample that comes back each epoch keeps about
#: 1/k of its appearances, and the residuals are still those of the whole run's trend (a documented approximation).
MAX_ENTRIES = 20_000_000
#: A sample without content evidence must keep this score with its largest appearance left out ("each time").
ONCE_FLOOR = 2.0
#: A suspect the pursuit did not take is sized by its steps' shared excess only when its own score reaches this (the
#: untaken corrupted rows of a length-grouped run whose longest samples are corrupted score 8.6-10.8; clean rows with
#: content flags of their own that the false-discovery limit lets through on a random-sampler run, 1.9-2.0).
UNTAKEN_MIN_Z = 3.0
#: The pursuit's exchanges (:func:`_pursuit`): at most this many rounds over the taken samples, and this many trials
#: in all (each a completion of the pursuit, a few products of the step-by-sample matrix: bounded on a large run).
EXCHANGE_ROUNDS, EXCHANGE_TRIALS = 2, 256
#: The share of steps the tag fit is made on in the end (the best-fitting ones: trimmed squares).
TRIM_KEEP = 0.8


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """Benjamini-Hochberg q-values of ``p``."""
    n = len(p)
    if not n:
        return p
    order = np.argsort(p)
    ranked = p[order] * n / np.arange(1, n + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(n)
    out[order] = np.minimum(q, 1.0)
    return out


def estimate(
    run: RunTables, window: int = 101, permutations: int = 20, max_pursuit: int = 200, seed: int = 1
) -> pd.DataFrame | None:
    """Per sample of the plan: ``appearances``, ``steps``, ``effect``, ``excess``, ``z``, ``p``, ``q``, ``block``,
    ``content`` (module docstring; ``excess``: how far the sample's own loss ran above what its steps expect of it,
    its step effect over its token share, or for a suspect the pursuit did not take :func:`_group_excess`); None
    when the run is too short to say anything (fewer than 50 logged values)."""
    rows = run.written_rows(run.loss_key)
    steps = rows[STEP].to_numpy(np.int64)
    loss = rows[run.loss_key].to_numpy(np.float64, na_value=np.nan)
    ok = np.isfinite(loss) & (loss > 0)
    steps, loss = steps[ok], loss[ok]
    if len(steps) < 50:
        return None
    y = np.log(loss)
    win = min(window, max(5, len(y) // 4) | 1)
    # the trend is not known at the run's start (a centred median lags a steep warm-up descent): those rows are left
    # out, as the spike rule leaves its warm-up to a rule of its own
    start = min(win // 2, len(y) // 10)
    stride = membership_stride(run.plan_view.n_rows())
    # a logged step left out leaves out its window's plan steps too (they map to no kept row)
    kept = np.arange(start, len(y), stride)
    w, ids, counts = _membership(run, steps[kept])
    if w.shape[1] == 0:
        return None
    clusters = _sample_clusters(run, ids)
    early = content_evidence(run.samples, ids, seed=seed) if clusters is not None and len(ids) <= CONTENT_ALL else None
    if early is not None:
        # a sample whose tokens are foreign to its cluster is no sample of it (the clustering may put noise rows with
        # a content type of a broad vocabulary): its cluster's level does not predict its loss
        clusters[early.foreign(ids)] = np.nan
    noise = None
    if clusters is not None and win >= MIN_HALF_WINDOW:
        # each content type's level, and the length's effect, refitted on the rows around each step: the types
        # learn at different speeds, and a length-grouped sampler moves the length fast
        local = np.column_stack([cluster_token_shares(w, clusters), w @ _log_lengths(run, ids)])
        e, noise = local_residuals(y[kept], local, half_window=win)
        composition = None
    else:
        e = (y - rolling_median(y, win))[kept]
        composition = composition_log_factor(run, steps, loss)
        composition = composition[kept] if composition is not None else None
    steps = steps[kept]
    x = _covariates(run, steps, w, ids, composition)
    judged = ids
    tags_only = e - x @ _huber(x, e)  # the residuals of the tags' fit alone
    if len(ids) > CONTENT_ALL:  # past this many samples, the content of those whose steps ran high is read
        marginal = (w > 0).astype(np.float64).T @ tags_only
        judged = ids[np.argsort(-marginal)[:CONTENT_ALL]]
    content = early if early is not None else content_evidence(run.samples, judged, seed=seed)
    flagged = np.isin(ids, np.fromiter(content.reasons, dtype=np.int64, count=len(content.reasons)))
    # noise varies by step (a batch of few tokens is noisier): every row is weighted by its noise scale, so a
    # sample that sits in noisy steps does not pass for a harmful one
    scale = _noise_scale(run, steps, w, ids, tags_only)
    if noise is not None:  # and by the run's phase (its early descent is noisier than its plateau)
        scale = scale * relative_noise(noise)
    e, x = e / scale, x / scale[:, None]
    w = sp.diags(1.0 / scale) @ w
    w = w.tocsr()
    beta = np.zeros(w.shape[1])
    gamma = np.zeros(x.shape[1])
    for _ in range(3):  # the tags' fit and the sample effects, each with the other held
        gamma = _huber(x, e - w @ beta)
        beta = _pursuit(w, e - x @ gamma, max_pursuit, first=flagged)
    r = e - x @ gamma
    sigma = _robust_sd(r - w @ beta)
    z = _scores(w, r, beta, flagged, sigma)
    rng = np.random.default_rng(seed)
    wt, csc, norms2 = _views(w)
    norms = np.sqrt(np.where(norms2 > 0, norms2, np.inf))
    r_final = r - w @ beta
    # a few million null scores are plenty: past that, fewer re-assignments of the residuals
    rounds = max(1, min(permutations, -(-NULL_SIZE // max(len(ids), 1))))
    null = np.concatenate([(wt @ rng.permutation(r_final)) / (sigma * norms) for _ in range(rounds)])
    p = _null_p(np.sort(null[np.isfinite(null)]), z)
    q = np.ones(len(p))
    for family in (flagged, ~flagged):  # stratified by the content evidence: each family's false discoveries <= q
        q[family] = benjamini_hochberg(p[family])
    shared = _shared_by_batch(w, r / sigma, z, candidates=(q <= 0.5) & ~flagged)
    once = _one_appearance_carries(w, r / sigma, candidates=(q <= 0.5) & ~flagged)
    q = np.where(shared | once, 1.0, q)
    near = q <= 0.5  # the samples worth naming: their steps and blocks (the rest stay empty)
    block = _blocks(w, near)
    effect = np.zeros(len(ids))
    excess = np.zeros(len(ids))
    for b in np.unique(block[beta > 0]):  # back in log-loss units: what its block adds to its steps' loss
        members = np.flatnonzero(block == b) if np.count_nonzero(block == b) > 1 else np.array([b])
        rows = csc.indices[csc.indptr[b] : csc.indptr[b + 1]]
        col = np.zeros(len(rows))
        share = np.zeros(len(rows))
        for j in members:  # a block's samples have the same steps, so their columns line up row by row
            token_share = csc.data[csc.indptr[j] : csc.indptr[j + 1]] * scale[rows]
            col += token_share * beta[j]
            share += token_share
        effect[members] = float(np.mean(np.expm1(col))) if len(col) else 0.0
        # the excess of the sample's own loss over what its steps expect of it, had it carried the block's effect
        # alone: what it adds to a step over its token share there (a block's samples share one step's tokens)
        own = share / len(members)
        excess[members] = float(np.mean(np.expm1(col) / own)) if len(col) else 0.0
    untaken = near & (effect == 0) & (z >= UNTAKEN_MIN_Z)
    excess[untaken] = _group_excess(w, r_final, beta, scale, near, untaken)
    step_lists: list[list[int] | None] = [None] * len(ids)
    for j in np.flatnonzero(near):
        step_lists[j] = steps[csc.indices[csc.indptr[j] : csc.indptr[j + 1]]].tolist()
    out = pd.DataFrame(
        {
            SAMPLE_ID: ids,
            "appearances": counts,
            "steps": step_lists,
            "effect": effect,
            "excess": excess,
            "z": z,
            "p": p,
            "q": q,
            "block": np.bincount(block, minlength=len(ids))[block],
            "content": flagged,
            "batch_level": shared,
        }
    )
    out.attrs["stride"], out.attrs["max_entries"] = stride, MAX_ENTRIES
    return out


def _log_lengths(run: RunTables, ids: np.ndarray) -> np.ndarray:
    """Each sample's log token count (0 where unknown or under 1 token)."""
    smp = run.samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID)
    return np.log(np.maximum(np.nan_to_num(smp[N_TOKENS].reindex(ids).to_numpy(np.float64), nan=1.0), 1.0))


def _sample_clusters(run: RunTables, ids: np.ndarray) -> np.ndarray | None:
    """Each sample's content cluster (NaN where it has none), or None when the samples carry no clusters."""
    if CLUSTER not in run.samples.columns:
        return None
    smp = run.samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID)
    return pd.to_numeric(smp[CLUSTER].reindex(ids), errors="coerce").to_numpy(np.float64)


def _group_excess(
    w: sp.csr_matrix, left: np.ndarray, beta: np.ndarray, scale: np.ndarray, near: np.ndarray, which: np.ndarray
) -> np.ndarray:
    """The excess of each sample of ``which`` (samples the pursuit did not take): the log-loss its steps kept after
    the effects of the samples outside ``near`` (``left`` is what they kept after every taken sample's; the effects
    of the taken ``near`` samples are put back), over the token share the ``near`` samples hold there together,
    averaged over its appearances: what each of a step's suspect samples adds had they carried its excess together,
    as a block's samples do.

    The pursuit stops its family at a score chance reaches among that family and credits a step's excess to the
    first suspect it takes, so it can leave out a sample the false-discovery limit still finds: a corrupted row first
    consumed before the model had learnt anything (one of its two steps did not rise), or one of several corrupted
    samples packed into the same batches."""
    cols = np.flatnonzero(near)
    sub = w[:, cols]
    kept = left + sub @ beta[cols]
    together = np.asarray(sub.sum(axis=1)).ravel()
    wc = _views(w)[1]
    out = []
    for j in np.flatnonzero(which):
        rows = wc.indices[wc.indptr[j] : wc.indptr[j + 1]]
        if not len(rows):
            out.append(0.0)
            continue
        out.append(float(np.mean(np.expm1(kept[rows] * scale[rows]) / (together[rows] * scale[rows]))))
    return np.asarray(out, dtype=np.float64)


def membership_stride(n_rows: int, max_entries: int | None = None) -> int:
    """One logged step in how many the estimate keeps: 1 while the plan's logged rows fit :data:`MAX_ENTRIES`,
    else the fewest that fit."""
    limit = MAX_ENTRIES if max_entries is None else max_entries
    return max(1, -(-int(n_rows) // max(int(limit), 1)))


def _views(w: sp.csr_matrix) -> tuple[sp.csr_matrix, sp.csc_matrix, np.ndarray]:
    """The transposed (CSR) and column (CSC) forms of ``w`` and its columns' squared norms, made once per matrix
    (the pursuit and the scores read them many times; converting a 10M-entry matrix costs a quarter second)."""
    cached = getattr(w, "_forensics_views", None)
    if cached is None:
        wc = w.tocsc()
        cached = (w.T.tocsr(), wc, np.asarray(w.multiply(w).sum(axis=0)).ravel())
        w._forensics_views = cached
    return cached


def _null_p(null: np.ndarray, z: np.ndarray) -> np.ndarray:
    """One-sided p-values of ``z`` against the sorted null scores: their share at or above it, and past the null's
    99.9th percentile its Gaussian tail scaled to that share (a null of a few million scores cannot resolve the
    p-values Benjamini-Hochberg needs over millions of samples)."""
    n = len(null)
    if not n:
        return np.ones(len(z))
    from statistics import NormalDist

    order = np.argsort(z, kind="stable")  # sorted queries: searchsorted walks the null in order (10x faster)
    at = np.empty(len(z), np.int64)
    at[order] = np.searchsorted(null, z[order], side="left")
    p = (1.0 + n - at) / (1.0 + n)
    cut = null[min(n - 1, int(0.999 * n))]
    mu, sd = float(np.mean(null)), max(float(np.std(null)), 1e-12)
    dist = NormalDist()
    tail0 = max(1.0 - dist.cdf((cut - mu) / sd), 1e-300)
    far = np.isfinite(z) & (z > cut)
    if far.any():
        sf = np.array([1.0 - dist.cdf((v - mu) / sd) for v in z[far]])
        p[far] = np.minimum(p[far], 0.001 * np.maximum(sf, 1e-300) / tail0)
    return np.where(np.isfinite(z), p, 1.0)


def _one_appearance_carries(
    w: sp.csr_matrix, r: np.ndarray, candidates: np.ndarray, floor: float = ONCE_FLOOR
) -> np.ndarray:
    """Samples whose evidence one appearance carries: with its largest contribution left out, its score is below
    ``floor`` (or it appeared once). A harmful sample raises the loss each time it comes back; a clean one that sat
    in one step of an excursion with no data cause (a grad-norm-led event decaying over many steps) does not.

    The candidates are taken together, those with the same number of appearances as the rows of one array, and
    each row summed as numpy sums one sample's values alone (the same order, so the same bits as a loop)."""
    wc = _views(w)[1]
    out = np.zeros(w.shape[1], bool)
    cand = np.flatnonzero(candidates)
    seen = np.diff(wc.indptr)[cand]
    out[cand[seen < 2]] = True
    for m in np.unique(seen[seen >= 2]):
        js = cand[seen == m]
        at = wc.indptr[js][:, None] + np.arange(m)
        vals = wc.data[at]
        terms = vals * r[wc.indices[at]]
        rest = np.ones(at.shape, bool)
        rest[np.arange(len(js)), np.argmax(terms, axis=1)] = False  # its largest contribution, left out
        norm = np.sqrt((vals[rest].reshape(len(js), m - 1) ** 2).sum(axis=1))
        with np.errstate(divide="ignore", invalid="ignore"):
            out[js] = (norm <= 0) | (terms[rest].reshape(len(js), m - 1).sum(axis=1) / norm < floor)
    return out


#: The most (candidate, batch-mate) pairs :func:`_shared_by_batch` holds at once.
MATES_AT_ONCE = 4_000_000


def _shared_by_batch(
    w: sp.csr_matrix, r: np.ndarray, z: np.ndarray, candidates: np.ndarray, share: float = 0.5
) -> np.ndarray:
    """Samples whose excess their batch-mates share: the median score of the other samples of its steps (each on
    the run's residuals alone) reaches half its own. Such an excess is the batch's, a tag effect (long QA batches
    that are harder), not the sample's; a corrupted sample's random batch-mates score near 0.

    A candidate's batch-mates are one row of a sparse product (its steps' samples), the medians one sort of every
    row's scores; candidates go in groups of at most :data:`MATES_AT_ONCE` pairs (a plan of large batches)."""
    a = (w > 0).astype(np.float64).tocsr()
    counts = np.asarray(a.sum(axis=0)).ravel()
    marginal = (a.T @ r) / np.sqrt(np.maximum(counts, 1.0))
    out = np.zeros(len(z), bool)
    cand = np.flatnonzero(candidates & (z > 2.0))
    if not len(cand):
        return out
    ac = a.tocsc()
    bound = (ac.T @ np.diff(a.indptr).astype(np.float64))[cand]  # at most this many mates each: its steps' sizes
    group = np.cumsum(bound) // MATES_AT_ONCE
    for g in np.unique(group):
        js = cand[group == g]
        mates = (ac[:, js].T.tocsr() @ a).tocsr()  # row i: the samples that share a step with js[i]
        row = np.repeat(np.arange(len(js)), np.diff(mates.indptr))
        other = mates.indices != js[row]
        row, score = row[other], marginal[mates.indices[other]]
        n = np.bincount(row, minlength=len(js))
        order = np.lexsort((score, row))
        ranked = score[order]
        start = np.r_[0, np.cumsum(n)[:-1]]
        lo, hi = start + (n - 1) // 2, start + n // 2
        filled = n > 0
        median = np.full(len(js), np.nan)
        median[filled] = (ranked[lo[filled]] + ranked[hi[filled]]) / 2  # np.median's: its middle, or its two's mean
        odd = filled & (n % 2 == 1)
        median[odd] = ranked[lo[odd]]
        nan_in = np.bincount(row, weights=np.isnan(score), minlength=len(js)) > 0  # np.median's NaN: never >= share
        out[js] = filled & ~nan_in & (median >= share * marginal[js])
    return out


def _scores(w: sp.csr_matrix, r: np.ndarray, beta: np.ndarray, flagged: np.ndarray, sigma: float) -> np.ndarray:
    """Each sample's score with its co-members' effects removed: a sample without content evidence after every
    selected one (its own effect put back); one with content evidence after the samples without any, and sharing
    its steps' excess with the other such samples by a non-negative ridge fit (two corrupted samples of one batch
    do not explain each other away)."""
    wt, wcols, norms2 = _views(w)
    norms = np.sqrt(np.where(norms2 > 0, norms2, np.inf))
    z = (wt @ (r - w @ beta) + norms2 * beta) / (sigma * norms)
    if not flagged.any():
        return z
    r_flag = r - w @ np.where(flagged, 0.0, beta)
    marginal = (wt @ r_flag) / (sigma * norms)
    chosen = np.flatnonzero(flagged & (marginal > 1.0))
    z = np.where(flagged, marginal, z)
    if len(chosen):
        wc = wcols[:, chosen]
        lam = RIDGE * float(np.median(norms2[chosen]))
        b = nnls_normal((wc.T @ wc).toarray() + lam * np.eye(len(chosen)), wc.T @ r_flag)
        rest = r_flag - wc @ b
        z[chosen] = (wt[chosen] @ rest + norms2[chosen] * b) / (sigma * norms[chosen])
    return z


def _membership(run: RunTables, steps: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """The logged steps x samples matrix of token shares (a logged value covers its window's steps), built a plan
    chunk at a time (:meth:`forensics.detect.plan_view.PlanView.chunks`): only the entries are held."""
    smp = run.samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID)[N_TOKENS]
    every = max(1, int(run.logging_steps))
    rows, sids = [], []
    for chunk in run.plan_view.chunks([STEP, SAMPLE_ID]):
        pstep = chunk[STEP].to_numpy(np.int64)
        # plan step -> the logged row whose window holds it (the first logged step at or after it, within the window)
        row = np.searchsorted(steps, pstep, side="left")
        inside = row < len(steps)
        inside[inside] &= steps[row[inside]] - pstep[inside] < every
        rows.append(row[inside])
        sids.append(chunk[SAMPLE_ID].to_numpy(np.int64)[inside])
    r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    sid = np.concatenate(sids) if sids else np.zeros(0, np.int64)
    del rows, sids
    tokens = smp.reindex(sid).to_numpy(np.float64)
    t = np.where(np.isfinite(tokens) & (tokens > 0), tokens, 1.0)
    ids, col = np.unique(sid, return_inverse=True)
    total = np.bincount(r, weights=t, minlength=len(steps))
    w = sp.csr_matrix((t / total[r], (r, col)), shape=(len(steps), len(ids)))
    w.sum_duplicates()
    counts = np.diff(w.tocsc().indptr).astype(np.int64)
    return w, ids, counts


def composition_log_factor(run: RunTables, steps: np.ndarray, loss: np.ndarray) -> np.ndarray | None:
    """The log of what each logged step's composition predicts its loss to be over the run's trend (the spike
    detector's causal expectation, :mod:`forensics.detect.evidence.expected_loss`: fitted on earlier steps only, so a
    step's own excess never predicts itself, and a rare group predicts nothing, so a dozen harmful samples cannot
    explain themselves away); None without tags or when a logged value covers several steps (as the detector)."""
    if run.tags is None or int(run.logging_steps) > 1:
        return None
    from forensics.detect.evidence.expected_loss import CompositionExpectation

    exp = CompositionExpectation(run.tags)
    if not exp.owner_:
        return None
    return np.log(exp.factors(steps, loss))


def _covariates(
    run: RunTables, steps: np.ndarray, w: sp.csr_matrix, ids: np.ndarray, composition: np.ndarray | None = None
) -> np.ndarray:
    """Intercept, mean log sample length, log samples per step, shares of the large clusters, and the log of what the
    step's composition predicts (:func:`composition_log_factor`) when there is one: a sample is judged against what
    its steps' batches predict, not only their trend and tags."""
    smp = run.samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID)
    m = w @ _log_lengths(run, ids)
    m = m - np.mean(m)
    n_samples = np.asarray((w > 0).sum(axis=1)).ravel().astype(np.float64)
    cols = [np.ones(len(steps)), m, np.log(np.maximum(n_samples, 1.0))]
    if CLUSTER in smp.columns:
        clusters = smp[CLUSTER].reindex(ids).to_numpy()
        shares = pd.Series(clusters).value_counts(normalize=True)
        for c in shares.index[shares >= COVARIATE_CLUSTER_SHARE][1:]:  # the largest is the intercept's
            cols.append(w @ (clusters == c).astype(np.float64))
    if run.tags is not None and "steps_since_cluster_seen" in run.tags.columns:
        # the loss is higher when a cluster comes back after a gap (forgetting): a tag effect, not a sample's
        gap = run.tags.set_index(STEP)["steps_since_cluster_seen"].reindex(steps)
        cols.append(np.log1p(pd.to_numeric(gap, errors="coerce").fillna(0.0).clip(lower=0).to_numpy(np.float64)))
    if composition is not None:
        cols.append(composition)
    x = np.column_stack(cols)
    keep = [0] + [k for k in range(1, x.shape[1]) if np.std(x[:, k]) > 1e-12]
    return x[:, keep]


def _noise_scale(
    run: RunTables, steps: np.ndarray, w: sp.csr_matrix, ids: np.ndarray, r: np.ndarray, bins: int = 10
) -> np.ndarray:
    """Each step's noise scale relative to the run's, as a smooth function of its tokens: the robust SDs of the
    residuals per token decile, fitted by a line in log-log (Theil-Sen, slope clipped to [-1, 0]: more tokens never
    make a mean noisier), so that a decile made partly of corrupted steps cannot inflate its own scale."""
    smp = run.samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID)
    tokens = smp[N_TOKENS].reindex(ids).to_numpy(np.float64)
    per_step = (w > 0).astype(np.float64) @ np.nan_to_num(tokens, nan=0.0)
    if not (per_step > 0).all() or np.ptp(per_step) == 0:
        return np.ones(len(steps))
    edges = np.unique(np.quantile(per_step, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, per_step, side="right") - 1, 0, len(edges) - 2)
    xs, ys = [], []
    for b in np.unique(which):
        sel = which == b
        if sel.sum() >= 20:
            xs.append(float(np.log(np.median(per_step[sel]))))
            ys.append(float(np.log(_robust_sd(r[sel]))))
    if len(xs) < 3:
        return np.ones(len(steps))
    xa, ya = np.asarray(xs), np.asarray(ys)
    pairs = [(ya[j] - ya[i]) / (xa[j] - xa[i]) for i in range(len(xa)) for j in range(i + 1, len(xa)) if xa[j] != xa[i]]
    slope = float(np.clip(np.median(pairs), -1.0, 0.0)) if pairs else 0.0  # Theil-Sen: the median pairwise slope
    intercept = float(np.median(ya - slope * xa))
    logs = intercept + slope * np.log(per_step)
    return np.clip(np.exp(logs - np.median(logs)), 0.25, 4.0)


def _robust_sd(r: np.ndarray) -> float:
    """:func:`forensics.stats.robust_sd` of the finite values (at least 1e-9; 1 when there are none)."""
    r = r[np.isfinite(r)]
    return robust_sd(r, floor=1e-9) if len(r) else 1.0


#: The largest condition number of a fit's normal equations solved as they are (below it they lose at most ~6 of
#: 16 digits); past it, or singular, the fit takes numpy's SVD least squares (a tag column with no steps, collinear
#: tags).
NORMAL_COND = 1e10


def _least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares coefficients of ``y`` on the few tag columns ``x``: by the normal equations (a fit of the
    full demo's 52K steps on 8 tags: 0.5 ms against 3 ms for the SVD, ~90 fits an audit), else as
    ``np.linalg.lstsq`` (minimum norm) when they are ill-conditioned (:data:`NORMAL_COND`)."""
    gram = x.T @ x
    if len(gram) and np.linalg.cond(gram) < NORMAL_COND:
        return np.linalg.solve(gram, x.T @ y)
    return np.linalg.lstsq(x, y, rcond=None)[0]


def _huber(x: np.ndarray, y: np.ndarray, iterations: int = 20, keep: float = TRIM_KEEP) -> np.ndarray:
    """Huber-weighted least squares, then trimmed: refitted on the ``keep`` share of steps it fits best until that
    set stops changing (least trimmed squares' concentration steps). The trimming is what a few corrupted steps at
    the end of the length range cannot pull (a high-leverage point draws a Huber fit towards itself)."""
    gamma = _huber_weighted(x, y, iterations)
    ok = np.isfinite(y)
    xs, ys = x[ok], y[ok]
    h = max(x.shape[1] + 1, int(keep * len(ys)))
    chosen = None
    for _ in range(10):
        r = np.abs(ys - xs @ gamma)
        idx = np.sort(np.argpartition(r, h - 1)[:h])
        if chosen is not None and np.array_equal(idx, chosen):
            break
        chosen = idx
        gamma = _least_squares(xs[idx], ys[idx])
    return gamma


def _huber_weighted(x: np.ndarray, y: np.ndarray, iterations: int = 20) -> np.ndarray:
    """Huber-weighted least squares (iteratively reweighted)."""
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    gamma = _least_squares(x, y)
    for _ in range(iterations):
        r = y - x @ gamma
        s = _robust_sd(r)
        a = np.abs(r) / (HUBER_C * s)
        wts = np.where(a <= 1, 1.0, 1.0 / np.maximum(a, 1e-12))
        sw = np.sqrt(wts)
        new = _least_squares(x * sw[:, None], y * sw)
        if np.allclose(new, gamma, atol=1e-10):
            break
        gamma = new
    return gamma


def _pursuit(w: sp.csr_matrix, r: np.ndarray, max_pursuit: int, first: np.ndarray | None = None) -> np.ndarray:
    """Non-negative pursuit of the sample effects (module docstring): the sample whose steps hold the most excess
    is taken, all taken samples' effects are refitted together (non-negative least squares), and again; samples
    with content evidence (``first``) are taken first, the rest only for what those leave.

    The greedy order can be fooled where a sample is consumed only a few times: a clean sample whose batches each held
    a different corrupted one carries as much excess as they do, and taken first it leaves each of them one step.
    So the content family's choice is then improved by exchanges (:data:`EXCHANGE_TRIALS` at most): each taken
    sample is left out and the pursuit completed without it, and the result kept when it explains the steps better at
    the pursuit's own price of a sample (its squared stopping score: the least gain for which it takes one)."""
    from statistics import NormalDist

    sigma = _robust_sd(r)
    wt, wc, norms2 = _views(w)
    norms = np.sqrt(np.where(norms2 > 0, norms2, np.inf))

    # a score a clean sample reaches by chance over the samples of its family (a Gaussian's: the stopping rule);
    # the content family is judged among its own, as its false discoveries are (the q-values are stratified)
    def chance(n: int) -> float:
        return NormalDist().inv_cdf(1.0 - 0.05 / max(n, 1))

    def refit(taken: list[int]) -> tuple[np.ndarray, np.ndarray]:
        if not taken:
            return np.zeros(0), r.copy()
        cols = wc[:, taken]
        fit = nnls_normal((cols.T @ cols).toarray(), cols.T @ r)
        return fit, r - cols @ fit

    def complete(taken: list[int], allowed: np.ndarray, stop: float, left_out: int = -1):
        taken = list(taken)
        fit, resid = refit(taken)
        while len(taken) < max_pursuit:
            score = (wt @ resid) / (sigma * norms)
            score[taken] = -np.inf
            score[~allowed] = -np.inf
            if left_out >= 0:
                score[left_out] = -np.inf
            j = int(np.argmax(score))
            if not score[j] >= stop:
                break
            taken.append(j)
            fit, resid = refit(taken)
        kept = [k for k, f in zip(taken, fit) if f > 0]  # a sample the joint fit left at 0 explains nothing
        if len(kept) < len(taken):
            fit, resid = refit(kept)
        return kept, fit, resid

    taken: list[int] = []
    if first is not None and first.any():
        stop = chance(int(first.sum()))
        taken, _, resid = complete([], first, stop)
        price = stop**2

        def cost(res: np.ndarray, n: int) -> float:
            return float(res @ res) / sigma**2 + price * n

        best, trials = cost(resid, len(taken)), 0
        for _ in range(EXCHANGE_ROUNDS):
            better = False
            for j in list(taken):
                if j not in taken or trials >= EXCHANGE_TRIALS:
                    continue
                trials += 1
                trial, _, resid = complete([k for k in taken if k != j], first, stop, left_out=j)
                if cost(resid, len(trial)) < best - 1e-9:
                    taken, best, better = trial, cost(resid, len(trial)), True
            if not better:
                break
    taken, fit, _ = complete(taken, np.ones(w.shape[1], bool), chance(w.shape[1]))
    beta = np.zeros(w.shape[1])
    beta[taken] = fit
    return beta


def _blocks(w: sp.csr_matrix, near: np.ndarray) -> np.ndarray:
    """For each sample: its block, the first sample (itself for the others) of those that share exactly its set of
    steps, computed for the samples of ``near``. The run cannot tell a block's samples apart: their effect is the
    block's (the pursuit credits one of them, which one float noise decides). Two samples with the same steps share
    their first step, so only those are compared."""
    csc = (w > 0).tocsc()
    out = np.arange(w.shape[1], dtype=np.int64)
    first = np.full(w.shape[1], -1, np.int64)
    nonempty = np.diff(csc.indptr) > 0
    first[nonempty] = csc.indices[csc.indptr[:-1][nonempty]]
    for j in np.flatnonzero(near & nonempty):
        mine = csc.indices[csc.indptr[j] : csc.indptr[j + 1]]
        same = [
            k
            for k in np.flatnonzero(first == first[j])
            if np.array_equal(csc.indices[csc.indptr[k] : csc.indptr[k + 1]], mine)
        ]
        out[same] = same[0]
    return out
