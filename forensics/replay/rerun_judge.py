"""The judging half of the segment re-run (:mod:`forensics.replay.rerun`): two passes over a segment -> replay.json's
``rerun`` object (reproduced, deterministic, the replaced batch, the jumps, the first group to move, the class).

Every threshold is a named constant below, with its reasoning; the class itself is decided in one place,
:func:`forensics.replay.cause_class.cause_class`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from forensics.replay.cause_class import ClassEvidence, action, cause_class
from forensics.replay.checkpoints import Checkpoint
from forensics.stats import robust_sd

#: Reproduced: the re-run loss within this relative error of the logged one, or 3x the segment's worst before it.
REPRO_REL = 0.02
#: Deterministic: two re-runs agree to this relative error at every step.
DETERMINISM_REL = 1e-6
#: A jump: a value this many times the median of the segment's earlier steps (the update ratio; g^2/v, a maximum
#: over entries and far noisier, 100x).
JUMP = 3.0
G2V_JUMP = 100.0
#: An epsilon-share jump: the share rose by this much (it is a 0-1 share, near 0 in a healthy run).
EPS_SHARE_RISE = 0.1
#: The replaced batch removed the spike when less than this share of the step's excess over the baseline is left.
GONE_SHARE = 0.5
#: A step is a spike (worth a class, worth replacing its batch) when its loss exceeds the segment's baseline by
#: more than this relative margin and by more than NOISE_Z times the run's own step-to-step loss noise
#: (:func:`loss_noise`): a clean run's largest steps sit within a few of its noise units (the tiny clean fixture run's
#: largest rise is 2.1 of them), a planted fault's spike tens of them.
SPIKE_MIN_REL = 0.05
NOISE_Z = 4.0
#: Logged losses before the suspect needed to measure the noise (fewer: the relative margin alone decides).
NOISE_MIN_STEPS = 8
#: Logits past the range: the attention logit this many times, the log-sum-exp this many times the earlier maximum.
ATTN_GROWTH, LSE_GROWTH = 2.0, 1.5
#: A crash line within this many steps of the suspect is near it.
CRASH_WINDOW = 50


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def loss_noise(logged: dict[int, float], before: int) -> float:
    """One step's loss noise in the run's logged losses before step ``before``: the robust SD of the differences of
    consecutive steps' losses, over sqrt(2) (a difference holds two steps' noise). Differences, not values: the
    descent of the loss is a trend, not noise. 0.0 when fewer than :data:`NOISE_MIN_STEPS` finite pairs."""
    diffs = [
        logged[s] - logged[s - 1]
        for s in sorted(logged)
        if s < before and s - 1 in logged and math.isfinite(logged[s]) and math.isfinite(logged[s - 1])
    ]
    if len(diffs) < NOISE_MIN_STEPS:
        return 0.0
    d = np.asarray(diffs)
    return robust_sd(d) / math.sqrt(2.0)


def spike_margin(baseline: float, noise: float) -> float:
    """How far above ``baseline`` a loss must be to be a spike (:data:`SPIKE_MIN_REL`, :data:`NOISE_Z`)."""
    return max(SPIKE_MIN_REL * abs(baseline), NOISE_Z * noise)


def _jumps(records: list[dict[str, Any]], upto: int) -> list[tuple[int, str, str, float]]:
    """(step, group, signal, factor) of every jump at a step <= ``upto`` against the segment's earlier steps."""
    out = []
    for j in range(1, len(records)):
        rec = records[j]
        if rec["step"] > upto:
            break
        for g, sig in rec["groups"].items():
            earlier = [r["groups"][g] for r in records[:j] if g in r["groups"]]
            if not earlier:
                continue
            for key, limit in (("update_ratio", JUMP), ("g2_over_v_max", G2V_JUMP)):
                base = float(np.median([e[key] for e in earlier]))
                if math.isfinite(sig[key]) and base > 0 and sig[key] >= limit * base:
                    out.append((rec["step"], g, key, sig[key] / base))
                elif not math.isfinite(sig[key]):
                    out.append((rec["step"], g, key, math.inf))
            rise = sig["eps_share"] - max(e["eps_share"] for e in earlier)
            if rise >= EPS_SHARE_RISE:
                out.append((rec["step"], g, "eps_share", rise))
    return out


def _first_group(jumps: list[tuple[int, str, str, float]]) -> tuple[str, int, float] | None:
    """The first group whose update ratio jumped: the earliest step, then the largest factor, then the name."""
    ur = [(s, g, f) for s, g, k, f in jumps if k == "update_ratio"]
    if not ur:
        return None
    s, g, f = min(ur, key=lambda x: (x[0], -x[2], x[1]))
    return g, s, f


def _cause_detail(findings: dict[str, Any] | None, step: int, key: str) -> dict[str, Any] | None:
    """The ``details[key]`` of the findings.json cause that holds ``step`` (the first such cause that has it)."""
    for c in (findings or {}).get("causes") or []:
        if not isinstance(c, dict) or step not in (c.get("steps") or []):
            continue
        found = (c.get("details") or {}).get(key)
        if isinstance(found, dict):
            return found
    return None


def logged_numerics(findings: dict[str, Any] | None, step: int) -> dict[str, Any] | None:
    """What the audit read from the logs around ``step``: the ``details.numerics`` of the findings.json cause that
    holds it (a loss-scale drop, NaN iterations), or None. Read from findings.json, not from the metrics again: the
    audit's window around the spike is the one rule."""
    return _cause_detail(findings, step, "numerics")


def logged_signals(findings: dict[str, Any] | None, step: int) -> dict[str, Any] | None:
    """The update norm, params norm, z loss and zero-gradient count the audit read from the logs around ``step``:
    the ``details.logged_signals`` of the findings.json cause that holds it (present when one of them rose), or
    None; read from findings.json for the same reason as :func:`logged_numerics`."""
    return _cause_detail(findings, step, "logged_signals")


def _crash_near(findings: dict[str, Any] | None, step: int) -> str | None:
    for f in (findings or {}).get("findings") or []:
        if (
            isinstance(f, dict)
            and f.get("kind") == "crash"
            and f.get("step") is not None
            and abs(int(f["step"]) - step) <= CRASH_WINDOW
        ):
            what = (f.get("details") or {}).get("what")
            if what in ("ecc", "nccl"):
                return str(what)
    return None


def judge(
    suspect: int,
    ck: Checkpoint,
    first: Any,
    second: Any,
    logged: dict[int, float],
    logged_gn: dict[int, float],
    control: int | None,
    dropout: bool,
    findings: dict[str, Any] | None,
    logs: dict[str, Any] | None = None,
    signals: dict[str, Any] | None = None,
    case: str | None = None,
) -> dict[str, Any]:
    """The ``rerun`` object of replay.json for ``suspect`` from two passes over its segment; ``logs``: the numerics
    the run's logs hold around it (:func:`forensics.detect.evidence.log_numerics.log_numerics`); ``signals``: the
    update norm, params norm, z loss and zero-gradient count there
    (:func:`forensics.detect.evidence.log_signals.log_signals`); ``case``: the case folder its action's command
    names."""
    recs = first.records
    for r in recs:
        r["logged"] = logged.get(r["step"])
        if r["step"] in logged_gn:
            r["logged_grad_norm"] = logged_gn[r["step"]]
    at = next(r for r in recs if r["step"] == suspect)
    before = [r for r in recs if r["step"] < suspect]
    evidence: list[str] = []
    # reproduced
    log = logged.get(suspect)
    nonfinite = any(
        not math.isfinite(r["grad_norm"]) or not math.isfinite(r["loss"]) for r in recs if r["step"] <= suspect
    )
    if not math.isfinite(at["loss"]) or not math.isfinite(at["grad_norm"]):
        gn = logged_gn.get(suspect)
        reproduced = (log is not None and not math.isfinite(log)) or (gn is not None and not math.isfinite(gn))
        evidence.append(
            f"the re-run's loss or gradient at step {suspect} is not finite; the run logged "
            f"loss {log} and grad norm {gn}"
        )
    elif log is None or not math.isfinite(log):
        reproduced = None
    else:
        errs = [
            _rel(r["loss"], r["logged"])
            for r in before
            if r["logged"] is not None and math.isfinite(r["logged"]) and math.isfinite(r["loss"])
        ]
        tol = max(REPRO_REL, 3 * max(errs, default=0.0))
        reproduced = _rel(at["loss"], log) <= tol
        evidence.append(
            f"re-run from checkpoint {ck.step}: loss {at['loss']:.4g} at step {suspect} against the logged "
            f"{log:.4g} ({'reproduced' if reproduced else 'not reproduced'}; tolerance {tol:.2%})"
        )
    # deterministic
    diffs = [
        (_rel(a["loss"], b["loss"]), _rel(a["grad_norm"], b["grad_norm"]))
        for a, b in zip(first.records, second.records, strict=True)
        if math.isfinite(a["loss"])
        and math.isfinite(b["loss"])
        and math.isfinite(a["grad_norm"])
        and math.isfinite(b["grad_norm"])
    ]
    same_nan = all(
        math.isfinite(a["loss"]) == math.isfinite(b["loss"]) for a, b in zip(first.records, second.records, strict=True)
    )
    deterministic = bool(same_nan and all(max(d) <= DETERMINISM_REL for d in diffs))
    if not deterministic:
        evidence.append(
            "two re-runs from the same state disagree (max relative difference "
            f"{max((max(d) for d in diffs), default=math.nan):.2g})"
        )
    # a spike at all: the re-run's loss against the re-run's baseline, the logged one against the logged baseline
    finite_before = [r["loss"] for r in before if math.isfinite(r["loss"])]
    baseline = float(np.median(finite_before)) if finite_before else None
    logged_before = [r["logged"] for r in before if r["logged"] is not None and math.isfinite(r["logged"])]
    logged_base = float(np.median(logged_before)) if logged_before else None
    noise = loss_noise(logged, suspect)
    said = [
        v
        for v in (_is_spike(at["loss"], baseline, noise), None if log is None else _is_spike(log, logged_base, noise))
        if v is not None
    ]
    spike = True if any(said) else (False if said else None)
    if spike is False:
        evidence.append(
            f"no spike at step {suspect}: the loss (re-run {at['loss']:.4g}, logged "
            f"{'none' if log is None else format(log, '.4g')}) is no more than {NOISE_Z:g}x the run's "
            f"loss noise ({noise:.3g}) or {SPIKE_MIN_REL:.0%} above the segment's baseline "
            f"({'none' if baseline is None else format(baseline, '.4g')})"
        )
    # replaced
    spike_gone = None
    if first.replaced_loss is not None and baseline is not None:
        rl = first.replaced_loss
        if not math.isfinite(at["loss"]):
            spike_gone = math.isfinite(rl)
        elif at["loss"] - baseline > spike_margin(baseline, noise):
            spike_gone = bool(math.isfinite(rl) and rl - baseline <= GONE_SHARE * (at["loss"] - baseline))
        evidence.append(
            f"with the batch replaced by step {control}'s (same bucket): loss {rl:.4g} against "
            f"{at['loss']:.4g} and the segment's baseline {baseline:.4g}"
            + ("" if spike_gone is None else f" (spike {'gone' if spike_gone else 'persists'})")
        )
    # jumps and logits
    jumps = _jumps(recs, suspect)
    before_jumps = [j for j in jumps if j[0] < suspect]
    if before_jumps:
        s, g, k, f = min(before_jumps, key=lambda x: (x[0], -x[3], x[1]))
        evidence.append(
            f"{k} of {g} jumped at step {s}, before the spike ({f:.3g}x the segment's earlier steps)"
            if k != "eps_share"
            else f"eps_share of {g} rose by {f:.2f} at step {s}, before the spike"
        )
    fg = _first_group(jumps)
    if fg is not None:
        evidence.append(f"the first group whose update/weight ratio jumped: {fg[0]} at step {fg[1]} ({fg[2]:.3g}x)")
    past = False
    if before:
        a_prev = [r["max_attention_logit"] for r in before if r["max_attention_logit"] is not None]
        l_prev = [r["logsumexp"] for r in before if r["logsumexp"] is not None]
        if (
            a_prev
            and at["max_attention_logit"] is not None
            and at["max_attention_logit"] > ATTN_GROWTH * max(max(a_prev), 1e-6)
        ):
            past = True
            evidence.append(
                f"the largest attention logit reached {at['max_attention_logit']:.4g} "
                f"(earlier at most {max(a_prev):.4g})"
            )
        if l_prev and at["logsumexp"] is not None and at["logsumexp"] > LSE_GROWTH * max(max(l_prev), 1e-6):
            past = True
            evidence.append(
                f"the logits' log-sum-exp reached {at['logsumexp']:.4g} (earlier at most {max(l_prev):.4g})"
            )
    crash = _crash_near(findings, suspect)
    drop = bool(logs and logs.get("loss_scale_drop"))
    nan_logged = bool(logs and logs.get("nan_iterations"))
    if drop or nan_logged:
        evidence += [e for e in logs["evidence"] if "(numerics)" in e]
    update_rise = bool(signals and signals.get("optimizer"))
    numerics_rise = bool(signals and signals.get("numerics"))
    if update_rise or numerics_rise:
        evidence += [e for e in signals["evidence"] if e.endswith(("(optimizer).", "(numerics)."))]
    ev = ClassEvidence(
        nonfinite=nonfinite,
        spike=spike,
        loss_scale_drop=drop,
        nan_iterations=nan_logged,
        crash=crash,
        reproduced=reproduced,
        deterministic=deterministic,
        dropout=dropout,
        spike_gone=spike_gone,
        optimizer_jump=bool(before_jumps),
        logits_past_range=past,
        logged_update_rise=update_rise,
        logged_numerics_rise=numerics_rise,
    )
    cls, why = cause_class(ev)
    evidence.append(f"cause class {cls}: {why}" if cls else f"no cause class: {why}")
    return {
        "from_checkpoint": ck.step,
        "reproduced": reproduced,
        "deterministic": deterministic,
        "segment": recs,
        "replaced": {"loss": first.replaced_loss, "spike_gone": spike_gone, "control_step": control},
        "per_sample": first.per_sample,
        "first_group": fg[0] if fg else None,
        "cause_class": cls,
        "action": action(cls, suspect, ck.step, fg[0] if fg else None, case) if cls else None,
        "spike": spike,
        "evidence": evidence,
    }


def _is_spike(loss: float, baseline: float | None, noise: float) -> bool | None:
    """Whether ``loss`` is a spike over ``baseline`` (a non-finite loss is one); None without a baseline."""
    if not math.isfinite(loss):
        return True
    if baseline is None:
        return None
    return loss - baseline > spike_margin(baseline, noise)
