"""One replayed step's numbers -> its replay.json entry: losses, controls, per-sample rows, probes, the verdict.

Per sample (most suspect first): its loss, the batch's loss without it (leave-one-out) and its signals; the samples
above the controls' per-sample range (mean + :data:`SAMPLE_Z` SDs) are the top suspects, and the batch's loss
without all of them is ``leave_out``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from forensics.replay.forward import batch_loss
from forensics.replay.probes import composition_harm
from forensics.replay.session import ReplaySession, StepPlan
from forensics.replay.signals import signals
from forensics.replay.verdicts import Measured, TrainReplay, decide, zscore

#: A sample is a "top suspect" when its loss is this many SDs above the same-bucket controls' per-sample losses.
SAMPLE_Z = 3.0


def step_result(
    ses: ReplaySession,
    p: StepPlan,
    probed: dict[str, Any],
    train: TrainReplay | None,
    doc_freq: np.ndarray,
    n_docs: int,
    offset: int,
) -> dict[str, Any]:
    """The replay.json entry of ``p``'s step (docs/commands/replay.md)."""
    s, ck, denom = p.step, p.ck, ses.denom
    log = ses.logged.get(s)
    log = None if log is None or not math.isfinite(log) else log

    def loss(c: int, t: int) -> float:
        return batch_loss(ses.losses(c, t), denom)

    suspect = ses.losses(ck, s)
    replayed = batch_loss(suspect, denom)
    same = [loss(ck, t) for t in p.same]
    other = [loss(ck, t) for t in p.other]
    z = zscore(replayed, same)
    neighbours, match, dist, own = {}, {}, {}, {}
    for off, (t, nck) in p.neigh.items():
        r = loss(nck, t)
        neighbours[off] = r
        if log is not None:
            match[off] = abs(r - log)
            dist[off] = t - nck  # updates between the neighbour batch and its checkpoint
        lt = ses.logged.get(t)
        # a neighbour no farther from its checkpoint than the suspect: its own loss checks the checkpoint and loss
        if lt is not None and math.isfinite(lt) and lt != 0 and abs(t - nck) <= max(abs(s - ck), 1):
            own[off] = abs(r - lt) / abs(lt)
            if train is not None and (nck, t, ses.seeds[0]) in ses.cache:
                rt = float(np.mean([batch_loss(ses.cache[(nck, t, k)], denom) for k in ses.seeds]))
                train.neighbour_own_error[off] = abs(rt - lt) / abs(lt)
    calibration = []
    for base, t in p.cal:
        lt = ses.logged.get(t)
        if lt is not None and math.isfinite(lt) and lt != 0:
            calibration.append({"checkpoint_step": base, "step": t, "replayed": loss(base, t), "logged": lt})
    reverse = {}
    for off in p.neigh:
        lr_ = ses.logged.get(s - int(off))
        if lr_ is not None and math.isfinite(lr_):
            reverse[off] = lr_
    earlier = []
    for e in p.earlier:
        er = loss(e, s)
        es = [loss(e, t) for t in p.same]
        earlier.append(
            {
                "checkpoint_step": e,
                "replayed": er,
                "z": zscore(er, es),
                "controls_mean": float(np.mean(es)) if es else None,
            }
        )
    rows, leave_out = _samples(ses, p, suspect, same, doc_freq, n_docs)
    g = probed.get("gradient")
    m = Measured(
        step=s,
        checkpoint_step=ck,
        logged=log,
        replayed=replayed,
        neighbours=neighbours,
        neighbour_logged_match=match,
        neighbour_distance=dist,
        neighbour_own_error=own,
        z=z,
        controls_mean=float(np.mean(same)) if same else None,
        earlier=earlier,
        leave_out=leave_out,
        step_offset=ses.step_offset,
        calibration=[
            (abs(c["step"] - c["checkpoint_step"]), abs(c["replayed"] - c["logged"]) / abs(c["logged"]))
            for c in calibration
        ],
        reverse_logged=reverse,
        after=p.after,
        train=train,
        dropout=ses.dropout,
        compared_in_train=ses.compare_seeds != [None],
        gradient_z=(g or {}).get("z"),
    )
    if "determinism" in probed:
        m.determinism = probed["determinism"]
    if "update_probe" in probed and ses.samples is not None:
        col = "cluster" if "cluster" in ses.samples.columns else "source"
        cl = dict(zip(ses.samples["sample_id"].tolist(), ses.samples[col].astype(str).tolist(), strict=False))
        m.composition = composition_harm(probed["update_probe"], {cl[i] for i in ses.index.samples_of[s] if i in cl})
    v = decide(m)
    evidence = v.evidence
    if g and g.get("z") is not None and v.verdict != "nondeterministic":
        same_g = g["controls"]["same_bucket"]
        evidence.insert(
            len(evidence) - 1,
            f"Its gradient norm is {g['suspect']:.3g} against {np.mean(same_g):.3g} "
            f"for its bucket's controls (z = {g['z']:.1f}).",
        )
    if rows and v.verdict == "data":
        evidence.insert(
            len(evidence) - 1,
            "Most suspect samples: "
            + ", ".join(
                f"{r['sample_id']} (loss {r['loss']:.3g}, repeat run {r['signals']['repeat_run']}, rare tokens "
                f"{r['signals']['rare_token_share']:.0%})"
                for r in rows[:3]
            )
            + ".",
        )
    out: dict[str, Any] = {
        "step": s,
        "logged_step": s + offset,
        "verdict": v.verdict,
        "confidence": v.confidence,
        "mode": v.mode,
        "checkpoint_step": ck,
        "checkpoint": "after" if p.after else "before",
        "logged": log,
        "replayed": train.mean if v.mode == "train" and train is not None else replayed,
        "neighbours": {k: neighbours.get(k) for k in ("-1", "+1")},
        "bucket": ses.index.bucket_of.get(s),
        "controls": {
            "same_bucket": same,
            "other_buckets": other,
            "z": z,
            "same_bucket_steps": p.same,
            "other_bucket_steps": p.other,
            "mode": "train" if m.compared_in_train else "eval",
        },
        "samples": rows,
        "evidence": evidence,
    }
    if m.compared_in_train:
        per_seed = [batch_loss(ses.cache[(ck, s, k)], denom) for k in ses.seeds]
        out["seeds"], out["spread"] = list(ses.seeds), float(np.std(per_seed, ddof=1))
    elif train is not None:
        out["seeds"], out["spread"] = list(train.seeds), train.spread
        out["replayed_eval"], out["replayed_train"] = replayed, train.mean
    if earlier:
        out["earlier"] = [{k: e[k] for k in ("checkpoint_step", "replayed", "z")} for e in earlier]
    if leave_out:
        out["leave_out"] = leave_out
    if calibration:
        out["calibration"] = calibration
    for key in ("gradient", "update_probe", "determinism"):
        if key in probed:
            out[key] = probed[key]
    return out


def _samples(
    ses: ReplaySession, p: StepPlan, suspect: list, same: list[float], doc_freq: np.ndarray, n_docs: int
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Per-sample rows, most suspect first, and the batch without its top suspects."""
    sids = ses.index.samples_of[p.step]
    extra = 1 if ses.denom == "labels" else 0
    total, count = sum(x.total for x in suspect), sum(x.count + extra for x in suspect)
    ctrl = [x.mean for t in p.same for x in ses.losses(p.ck, t) if x.count]
    thr = (float(np.mean(ctrl)) + SAMPLE_Z * float(np.std(ctrl))) if len(ctrl) >= 2 else math.inf
    order = sorted(range(len(sids)), key=lambda i: -(suspect[i].mean if suspect[i].count else -math.inf))
    rows = []
    for i in order:
        x = suspect[i]
        rest = count - x.count - extra
        rows.append(
            {
                "sample_id": int(sids[i]),
                "loss": x.mean,
                "n_tokens": int(len(ses.tokens[sids[i]])),
                "leave_one_out": (total - x.total) / rest if rest else None,
                "signals": signals(ses.tokens[sids[i]], x.tokens, doc_freq, n_docs),
            }
        )
    top = [i for i in order if suspect[i].count and suspect[i].mean > thr]
    leave_out = None
    if top and len(top) < len(sids):
        keep = set(top)
        rest_losses = [suspect[i] for i in range(len(sids)) if i not in keep]
        lr = batch_loss(rest_losses, ses.denom)
        leave_out = {"sample_ids": [int(sids[i]) for i in top], "replayed": lr, "z": zscore(lr, same)}
    return rows, leave_out
