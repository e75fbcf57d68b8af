"""The forgetting signature: does a content cluster's loss grow with the steps since the model last trained on it?

A plan that keeps one kind of content away for a while (a static plan groups code with code, QA with QA) lets the
model drift away from it; when it comes back, its steps cost more. Per cluster ``c`` present at step ``s``::

    x_c(s) = log1p(gap_c(s) / tau)      gap_c(s) = s minus the last earlier step whose batch held any sample of c

and the forgetting slope is the loss added per unit of ``x``. The log scale is natural: the first few steps away
matter most, and with ``tau`` equal to a model's time constant the slope is that model's scale.

**Model** (one least-squares fit over every step; a step holds several clusters, each weighted by its token share)::

    loss(s) = trend(s) + sum_c a_c share_c(s) + sum_k g_k bucket_share_k(s) + sum_c b_c share_c(s) x_c(s) + noise

- ``a_c`` is cluster ``c``'s difficulty and ``g_k`` the offset of length bucket ``k`` (one bucket is the reference),
  fitted jointly with the slopes ``b_c``: subtracting per-bucket offsets first would let them soak up part of the
  forgetting, since buckets and clusters travel together in a length-sorted plan.
- ``trend`` is a centred rolling median (``window`` steps) of the loss *minus the fitted composition*, refitted
  ``iterations`` times (backfitting). A rolling median of the raw loss would be biased: when a cluster has been away
  long, the steps around it hold other clusters, whose levels move the median.
- Steps excluded: non-finite values, the spans of the given spikes plus ``exclude_after`` steps (aftershocks), steps
  where a cluster appears for the first time (no gap), and residuals beyond ``outlier_sd`` robust SDs.
- Standard errors are heteroscedasticity-robust (HC1: steps with fewer tokens are noisier); the 95% confidence
  interval uses the t distribution.

The verdict (``detected``) is a positive common slope (one ``b`` shared by all clusters) whose 95% interval lies
above 0; per-cluster rows carry their own ``b_c`` and interval. Shares are token shares (lengths capped at
``max_len``), from the plan and samples (``cluster_column`` of the samples: ``cluster`` from tagging, or any label
such as ``source``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.params import at_least, positive
from forensics.detect.plan_view import FramePlan, PlanView
from forensics.errors import ForensicsError
from forensics.plan.buckets import bucket_index
from forensics.schema import CLUSTER, DEFAULT_BOUNDARIES, MAX_LEN, N_TOKENS, SAMPLE_ID, STEP, find_loss_key
from forensics.stats import robust_sd, rolling_median, steps_since_seen, t_ppf, t_sf

if TYPE_CHECKING:
    from scipy import sparse

CLUSTER_NAME = "cluster_name"
BUCKET = "bucket"


def _spans(spikes: Iterable[Finding | Mapping[str, Any]]) -> list[tuple[int, int]]:
    out = []
    for s in spikes:
        start = s.step if isinstance(s, Finding) else s["step"]
        end = s.end_step if isinstance(s, Finding) else s.get("end_step")
        out.append((int(start), int(end if end is not None else start)))
    return out


class _Design:
    """Per-step token shares of clusters and buckets, and each cluster's gap, as sparse columns over the steps."""

    def __init__(
        self,
        plan: pd.DataFrame | PlanView,
        samples: pd.DataFrame,
        cluster_column: str,
        boundaries: Sequence[int],
        max_len: int,
    ):
        if isinstance(plan, pd.DataFrame):
            for col in (STEP, SAMPLE_ID):
                if col not in plan.columns:
                    raise ForensicsError(f"plan: missing column '{col}' (map (epoch, batch_id) plans to steps first)")
            plan = FramePlan(plan)
        for col in (SAMPLE_ID, N_TOKENS, cluster_column):
            if col not in samples.columns:
                raise ForensicsError(f"samples: missing column '{col}' needed for the forgetting signature")
        smp = samples.drop_duplicates(SAMPLE_ID).set_index(SAMPLE_ID)
        tokens = np.minimum(smp[N_TOKENS].to_numpy(np.int64), max_len).astype(np.float64)
        cluster_values, cluster_code = np.unique(smp[cluster_column].to_numpy(), return_inverse=True)
        if BUCKET in smp.columns and cluster_column != BUCKET:
            bucket = smp[BUCKET].to_numpy(np.int64)
        else:
            bucket = bucket_index(tokens.astype(np.int64), boundaries)
        bucket_values, bucket_code = np.unique(bucket, return_inverse=True)
        # token sums per (step, cluster) and (step, bucket), a plan chunk at a time (integer tokens: exact sums)
        c_parts, b_parts = [], []
        for chunk in plan.chunks([STEP, SAMPLE_ID]):
            pos = smp.index.get_indexer(chunk[SAMPLE_ID].to_numpy(np.int64))
            if (pos < 0).any():
                few = ", ".join(map(str, np.unique(chunk[SAMPLE_ID].to_numpy()[pos < 0])[:5]))
                raise ForensicsError(
                    f"plan: {int((pos < 0).sum())} rows name samples not in the samples table, e.g. {few}"
                )
            step = chunk[STEP].to_numpy(np.int64)
            c_parts.append(_pair_sums(step, cluster_code[pos], tokens[pos], len(cluster_values)))
            b_parts.append(_pair_sums(step, bucket_code[pos], tokens[pos], len(bucket_values)))
        c_step_value, c_all, c_tok = _combined(c_parts, len(cluster_values))
        b_step_value, b_all, b_tok = _combined(b_parts, len(bucket_values))
        self.step_values = np.unique(c_step_value)
        n = len(self.step_values)
        c_step = np.searchsorted(self.step_values, c_step_value)
        b_step = np.searchsorted(self.step_values, b_step_value)
        total = np.bincount(c_step, weights=c_tok, minlength=n)
        # the clusters and buckets the plan holds, in value order, coded densely
        present_c, c_lab = np.unique(c_all, return_inverse=True)
        present_b, b_lab = np.unique(b_all, return_inverse=True)
        self.labels = cluster_values[present_c]
        self.names = _names(smp, cluster_column, self.labels)
        self.buckets = bucket_values[present_b]
        gap = steps_since_seen(c_step, c_lab, self.step_values)
        self.first_seen = np.zeros(n, dtype=bool)
        self.first_seen[c_step[gap.isna()]] = True
        self.c_step, self.c_lab = c_step, c_lab
        self.c_share = c_tok / np.maximum(total[c_step], 1.0)
        self.gap = gap.to_numpy(dtype=np.float64, na_value=np.nan)
        self.b_step, self.b_lab = b_step, b_lab
        self.b_share = b_tok / np.maximum(total[b_step], 1.0)

    def matrices(self, rows: np.ndarray, tau: float, per_cluster: bool) -> tuple[sparse.csr_matrix, list[str]]:
        """The design for the steps at positions ``rows`` (into ``step_values``): composition columns, then the
        forgetting column(s); names say what each column is."""
        from scipy import sparse  # lazily: only an audit with a plan needs scipy

        n = len(self.step_values)
        k, kb = len(self.labels), len(self.buckets)
        x = np.log1p(np.where(np.isfinite(self.gap), self.gap, 0.0) / tau)
        cols_s = sparse.csr_matrix((self.c_share, (self.c_step, self.c_lab)), shape=(n, k))
        keep_b = self.b_lab > 0  # bucket 0 (the lowest present) is the reference level
        cols_b = sparse.csr_matrix(
            (self.b_share[keep_b], (self.b_step[keep_b], self.b_lab[keep_b] - 1)), shape=(n, max(kb - 1, 0))
        )
        fx = self.c_share * x
        if per_cluster:
            cols_f = sparse.csr_matrix((fx, (self.c_step, self.c_lab)), shape=(n, k))
            f_names = [f"forget:{c}" for c in range(k)]
        else:
            cols_f = sparse.csr_matrix((fx, (self.c_step, np.zeros(len(fx), np.int64))), shape=(n, 1))
            f_names = ["forget"]
        names = [f"share:{c}" for c in range(k)] + [f"bucket:{b}" for b in range(1, kb)] + f_names
        return sparse.hstack([cols_s, cols_b, cols_f], format="csr")[rows], names


def _pair_sums(
    step: np.ndarray, code: np.ndarray, weights: np.ndarray, n_codes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct (step, code) pairs, sorted by step then code, with the summed weights."""
    key = step.astype(np.int64) * max(n_codes, 1) + code
    uniq, inv = np.unique(key, return_inverse=True)
    sums = np.bincount(inv, weights=weights)
    return uniq // max(n_codes, 1), uniq % max(n_codes, 1), sums


def _combined(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_codes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chunks' (step, code) sums as one set of pairs (a step may span chunks)."""
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    step, code, sums = (np.concatenate(x) for x in zip(*parts))
    return _pair_sums(step, code, sums, n_codes)


def _names(smp: pd.DataFrame, column: str, labels: np.ndarray) -> list[str]:
    if column == CLUSTER and CLUSTER_NAME in smp.columns:
        names = smp[[CLUSTER, CLUSTER_NAME]].drop_duplicates(CLUSTER).set_index(CLUSTER)[CLUSTER_NAME]
        return [str(names.get(c, c)) for c in labels]
    return [str(c) for c in labels]


def _ols(X: sparse.csr_matrix, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Least squares with HC1 (heteroscedasticity-robust) covariance; min-norm where columns are collinear."""
    from scipy import sparse  # lazily: only an audit with a plan needs scipy

    xtx = (X.T @ X).toarray()
    inv = np.linalg.pinv(xtx)
    beta = inv @ (X.T @ y)
    e = y - X @ beta
    rank = int(np.linalg.matrix_rank(xtx))
    dof = max(len(y) - rank, 1)
    meat = (X.T @ X.multiply(e[:, None] ** 2)).toarray() if sparse.issparse(X) else X.T @ (X * e[:, None] ** 2)
    meat = np.asarray(meat)
    cov = inv @ meat @ inv * len(y) / dof
    return beta, cov, dof


def forgetting_signature(
    metrics: pd.DataFrame,
    plan: pd.DataFrame | PlanView,
    samples: pd.DataFrame,
    *,
    metric: str | None = None,
    cluster_column: str = CLUSTER,
    tau: float = 1.0,
    window: int = 101,
    iterations: int = 4,
    spikes: Iterable[Finding | Mapping[str, Any]] = (),
    exclude_after: int = 5,
    outlier_sd: float = 6.0,
    boundaries: Sequence[int] = DEFAULT_BOUNDARIES,
    max_len: int = MAX_LEN,
    min_steps: int = 20,
) -> dict[str, Any]:
    """The forgetting signature of a run (model and verdict in the module docstring), JSON-ready.

    Keys: ``detected``, ``slope`` (loss per unit of ``log1p(gap / tau)``, common to all clusters), ``se``, ``ci95``
    ``[low, high]``, ``p_value``, ``n_steps`` (steps fitted), ``tau``, ``x`` (the regressor in words),
    ``clusters`` (one row per cluster: ``cluster``, ``cluster_name``, ``n_steps`` present with a gap, ``mean_share``,
    ``median_gap``, ``max_gap``, ``slope``, ``se``, ``ci95``, ``p_value``, ``detected``), ``effect_at_max_gap`` (the
    loss the common slope adds at the longest gap compared with a gap of 1 step), ``metric``, ``window``,
    ``evidence`` and ``next_step``.

    ``plan`` needs ``step`` and ``sample_id`` (or is a view of a plan too large to load:
    :mod:`forensics.detect.plan_view`, read a chunk at a time); ``samples`` ``sample_id``, ``n_tokens`` and
    ``cluster_column`` (its ``bucket`` column is used when present, else lengths are bucketed with
    ``boundaries``). ``spikes``: findings or
    ``{"step", "end_step"}`` dicts whose spans (plus ``exclude_after`` steps) are left out.
    """
    metric = metric or find_loss_key(metrics.columns)
    if metric not in metrics.columns:
        raise ForensicsError(f"metrics: missing column '{metric}'")
    if not tau > 0:
        raise ForensicsError(f"forgetting: tau must be > 0; got {tau}")
    design = _Design(plan, samples, cluster_column, boundaries, max_len)
    steps = design.step_values
    m_steps = metrics[STEP].to_numpy(np.int64)
    m_order = np.argsort(m_steps, kind="stable")
    idx = np.searchsorted(m_steps[m_order], steps)
    idx_c = np.minimum(idx, max(len(m_steps) - 1, 0))
    hit = (m_steps[m_order][idx_c] == steps) if len(m_steps) else np.zeros(len(steps), bool)
    y = np.full(len(steps), np.nan)
    y[hit] = metrics[metric].to_numpy(np.float64, na_value=np.nan)[m_order][idx_c[hit]]
    base = np.isfinite(y) & ~design.first_seen
    for a, b in _spans(spikes):
        base &= ~((steps >= a) & (steps <= b + exclude_after))
    x_desc = f"log1p(steps since the cluster was last trained / {tau:g})"
    out: dict[str, Any] = {
        "detected": False,
        "slope": None,
        "se": None,
        "ci95": None,
        "p_value": None,
        "n_steps": 0,
        "tau": float(tau),
        "x": x_desc,
        "clusters": [],
        "effect_at_max_gap": None,
        "metric": metric,
        "window": int(window),
        "cluster_column": cluster_column,
        "evidence": [],
        "next_step": None,
    }
    labelled = design.labels.astype(str) != "-1"
    if base.sum() < max(min_steps, 3 * len(design.labels) + len(design.buckets)) or labelled.sum() < 1:
        out["evidence"].append(
            f"too few steps with a known gap to fit the forgetting signature "
            f"({int(base.sum())} steps, {len(design.labels)} clusters)."
        )
        return out
    all_rows = np.arange(len(steps))
    X_all, names = design.matrices(all_rows, tau, per_cluster=True)
    fitted = np.zeros(len(steps))
    used = base.copy()
    beta = cov = None
    dof = 1
    for _ in range(max(int(iterations), 1)):
        adjusted = np.where(np.isfinite(y), y - fitted, np.nan)
        trend = rolling_median(adjusted, window)
        r = y - trend
        beta, cov, dof = _ols(X_all[np.flatnonzero(used)], r[used])
        fitted = X_all @ beta
        e = r - fitted
        sd = robust_sd(e[base])
        used = base & (np.abs(e - np.median(e[base])) <= outlier_sd * sd) if sd > 0 else base.copy()
    X_common, cnames = design.matrices(all_rows, tau, per_cluster=False)
    rows = np.flatnonzero(used)
    b_c, cov_c, dof_c = _ols(X_common[rows], r[rows])
    t_crit = float(t_ppf(0.975, dof_c))
    slope, se = float(b_c[-1]), float(np.sqrt(max(cov_c[-1, -1], 0.0)))
    p = float(2 * t_sf(abs(slope / se), dof_c)) if se > 0 else float("nan")
    max_gap = float(np.nanmax(design.gap)) if np.isfinite(design.gap).any() else 1.0
    out.update(
        {
            "slope": slope,
            "se": se,
            "ci95": [slope - t_crit * se, slope + t_crit * se],
            "p_value": p,
            "n_steps": int(len(rows)),
            "detected": bool(se > 0 and slope - t_crit * se > 0),
            "effect_at_max_gap": slope * (np.log1p(max_gap / tau) - np.log1p(1.0 / tau)),
        }
    )
    out["clusters"] = _cluster_rows(design, used, beta, cov, dof, names)
    out["evidence"] = _evidence(out, max_gap)
    if out["detected"]:
        out["next_step"] = (
            f"Clusters come back after gaps of up to {max_gap:.0f} steps and cost more then: mix "
            "clusters inside batches or interleave them (a bucketed shuffle keeps each cluster within "
            "a few steps); the effect is small next to a spike but adds jumpiness."
        )
    return out


def _cluster_rows(
    design: _Design, used: np.ndarray, beta: np.ndarray, cov: np.ndarray, dof: int, names: list[str]
) -> list[dict[str, Any]]:
    t_crit = float(t_ppf(0.975, dof))
    present = used[design.c_step] & np.isfinite(design.gap)
    df = pd.DataFrame({"c": design.c_lab[present], "share": design.c_share[present], "gap": design.gap[present]})
    g = df.groupby("c")
    agg = pd.DataFrame(
        {"n": g.size(), "share": g["share"].mean(), "median_gap": g["gap"].median(), "max_gap": g["gap"].max()}
    )
    out = []
    for c, label in enumerate(design.labels):
        j = names.index(f"forget:{c}")
        b, se = float(beta[j]), float(np.sqrt(max(cov[j, j], 0.0)))
        n = int(agg["n"].get(c, 0))
        ok = n > 0 and se > 0
        out.append(
            {
                "cluster": label.item() if isinstance(label, np.generic) else label,
                "cluster_name": design.names[c],
                "n_steps": n,
                "mean_share": float(agg["share"].get(c, np.nan)),
                "median_gap": float(agg["median_gap"].get(c, np.nan)),
                "max_gap": float(agg["max_gap"].get(c, np.nan)),
                "slope": b if ok else None,
                "se": se if ok else None,
                "ci95": [b - t_crit * se, b + t_crit * se] if ok else None,
                "p_value": float(2 * t_sf(abs(b / se), dof)) if ok else None,
                "detected": bool(ok and b - t_crit * se > 0),
            }
        )
    return out


def _evidence(out: dict[str, Any], max_gap: float) -> list[str]:
    lo, hi = out["ci95"]
    ev = [
        f"Measured: how much higher {out['metric']} is when a cluster comes back after a longer gap since it was "
        f"last trained, on a log scale of the gap in units of tau = {out['tau']:g} steps (x = {out['x']}): "
        f"{out['slope']:+.3g} per unit of x (95% CI {lo:+.3g} to {hi:+.3g}, p = {out['p_value']:.2g}, "
        f"{out['n_steps']} steps; the trend, cluster and bucket levels fitted jointly)."
    ]
    ev.append(
        f"At the longest gap ({max_gap:.0f} steps) that is {out['effect_at_max_gap']:+.3g} over a gap of 1 step."
        if out["detected"]
        else "No forgetting signature: the interval does not lie above 0."
    )
    rows = sorted((c for c in out["clusters"] if c["slope"] is not None), key=lambda c: -c["n_steps"])
    if rows:
        ev.append(
            "Per cluster: "
            + "; ".join(
                f"{c['cluster']} '{c['cluster_name']}' {c['slope']:+.3g} ({c['ci95'][0]:+.3g} to {c['ci95'][1]:+.3g}, "
                f"{c['n_steps']} steps, gaps up to {c['max_gap']:.0f})"
                for c in rows[:6]
            )
            + "."
        )
    return ev


class ForgettingRule(Rule):
    """The ``forgetting`` section: does the loss rise with the steps since a cluster was last trained?

    Parameters: ``tau`` 1.0 (the time scale in steps of ``log1p(gap / tau)``: 1 reads the gap in steps), ``window``
    101 (the rolling-median trend removed first), ``exclude_after`` 5 (steps after a spike left out, so spikes do not
    pose as forgetting), ``outlier_sd`` 6 (residuals beyond it left out), ``min_steps`` 20.
    """

    name = "forgetting"
    parameter_constraints = {
        "tau": positive(),
        "window": positive("int"),
        "exclude_after": at_least(0, "int"),
        "outlier_sd": positive(),
        "min_steps": positive("int"),
    }
    needs_plan = True
    section_name = "forgetting"

    def __init__(
        self, tau: float = 1.0, window: int = 101, exclude_after: int = 5, outlier_sd: float = 6.0, min_steps: int = 20
    ) -> None:
        self.tau = tau
        self.window = window
        self.exclude_after = exclude_after
        self.outlier_sd = outlier_sd
        self.min_steps = min_steps

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        self.warnings_: list[str] = []
        spikes = [f for f in found or [] if f.kind == "spike"]
        try:
            out = forgetting_signature(
                run.metrics,
                run.plan_view,
                run.samples,
                metric=run.loss_key,
                spikes=spikes,
                boundaries=run.boundaries or DEFAULT_BOUNDARIES,
                max_len=run.max_len,
                tau=self.tau,
                window=self.window,
                exclude_after=self.exclude_after,
                outlier_sd=self.outlier_sd,
                min_steps=self.min_steps,
            )
        except ForensicsError as exc:
            self.warnings_.append(f"forgetting signature not computed: {exc}")
            return []
        gate = run.sections.get("plan") if isinstance(run.sections.get("plan"), dict) else {}
        self.section_ = judge(out, run, static=gate.get("static"))
        return []


def judge(out: dict[str, Any], run: RunTables, static: bool | None) -> dict[str, Any]:
    """Whether the signature matters, in plain words: its size at the longest gap against the loss's own step-to-step
    noise, and what the plan already does about it (a plan whose composition varies keeps clusters close: a small
    value is expected there and is no alarm)."""
    noise = robust_sd(np.diff(run.metrics[run.loss_key].to_numpy(np.float64, na_value=np.nan)))
    effect = out.get("effect_at_max_gap")
    out["noise_sd"] = noise
    out["effect_vs_noise"] = effect / noise if effect is not None and noise and np.isfinite(noise) else None
    large = bool(out.get("detected") and out["effect_vs_noise"] is not None and out["effect_vs_noise"] >= 1.0)
    out["matters"] = bool(out.get("detected") and static and large)
    out["severity"] = "warning" if out["matters"] else "info"
    if not out.get("detected"):
        out["verdict"] = "No forgetting signature: the loss is not higher when a cluster comes back after a gap."
    elif not static:
        out["verdict"] = (
            f"A small forgetting signature ({effect:+.3g} at the longest gap), as expected on a plan "
            "whose batch composition already varies across epochs: nothing to change."
        )
        out["next_step"] = None
    else:
        size = (
            f"{out['effect_vs_noise']:.1f}x the loss's step-to-step noise"
            if out["effect_vs_noise"] is not None
            else "of unknown size"
        )
        out["verdict"] = (
            f"The loss is {effect:+.3g} higher when a cluster comes back after the longest gap, "
            f"{size}: "
            + (
                "it matters, and batches that mix clusters would remove it."
                if large
                else "small next to the noise; it adds jumpiness, not spikes."
            )
        )
    return out
