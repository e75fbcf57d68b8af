"""The experiments' numbers -> one verdict per step, with its confidence and the sentences that justify it.

**Reproduction first.** A replay says something about the run only when it gives back the loss the run logged at
that step. The eval-mode replay is tried first; when it misses and the model has dropout (the logged loss of a
training step is taken with dropout on: GPT-2's default is 0.1), the batch is replayed in train mode over several
dropout seeds, and the logged value is reproduced when it lies within the tolerance plus :data:`SEED_Z` times the
seeds' spread of their mean. ``mode`` says which mode reproduced it.

**Then the comparison**, always suspect and controls in one mode (eval by default, so every number is
deterministic): the same checkpoint, K same-bucket control batches (z against them) and K of other buckets.

Order of the rules (the first that holds wins):

0. ``nondeterministic``: the same forward (the same dropout seed in train mode) run twice, or on the second
   device/dtype given, disagrees beyond tolerance: nothing else can be concluded until that is fixed.
1. ``misaligned``: no mode reproduces the logged loss and a neighbour's batch (s-1 or s+1) does, clearly better:
   the metrics and the plan are joined one step off.
2. ``not-reproduced``: no mode reproduces it and no neighbour explains it; the evidence names what was tried and
   what the other batches replayed at that checkpoint say differs (their own losses reproduced: this batch's tokens
   are not what the run fed; not reproduced either: the checkpoint, the padding or the loss definition).
3. ``data``: the batch is high against same-bucket controls (z >= :data:`Z_HIGH` and :data:`DATA_RISE` over their
   mean) at every checkpoint tried.
4. ``state``: at the checkpoint just before the spike the suspect and its controls are high alike (z below
   :data:`Z_HIGH`, both >= :data:`STATE_RISE` above their values at the earlier checkpoints), and at the earlier
   checkpoints the suspect is normal.
5. ``composition``: every sample is normal (no top suspects, z below :data:`Z_HIGH`), but one update on the batch
   raises the loss of the clusters it does not hold by at least :data:`COMPOSITION_MIN` of that loss, by
   :data:`COMPOSITION_RATIO` times what one update on a mixed batch of the same size does, and by
   :data:`COMPOSITION_MIN` more than it (a homogeneous batch always pulls a little: one update on it moving the other
   clusters by half a percent is what every batch of a bucketed plan does, not a spike's cause).
6. ``normal``: the batch's loss lies within its controls' spread (|z| <= :data:`Z_NORMAL`), and its gradient norm,
   when it was probed, is not above theirs (z <= :data:`Z_NORMAL`; a gradient lower than its bucket's pulled less,
   which is no sign of harm): nothing in this batch explains a spike.
7. ``inconclusive`` otherwise.

**A checkpoint after the step.** With no checkpoint at or before step s, the nearest one after it is used (``checkpoint
= "after"``): the model has trained on this batch since, so a batch that is still high against its controls there is
``data`` all the more (it can only have been learned down), while a batch that looks normal there may have been
learned: ``normal`` then carries a lower confidence and says so. Reproduction is not checked there (a state after the
step is not the one that logged it), and ``state`` and ``composition`` need the state before the step, so they are
not concluded from a later checkpoint.

Tolerance of reproduction: relative :data:`RTOL_EXACT` at the step's own checkpoint (replay on another device, dtype
or kernel is not bit-exact). When the checkpoint is d updates away from the step, the parameters moved: steps up to d
updates from this checkpoint (and from the earlier ones) are replayed at those checkpoints too (``calibration``), and
their largest relative error at a distance <= d, times :data:`DRIFT_FACTOR`, is added (capped at :data:`RTOL_MAX`): a
run that learns fast gets a wide tolerance, a settled one a tight one, both measured rather than assumed. That drift is
an ordinary batch's; a suspect whose own loss moved k times as much as its controls' between the earlier checkpoint
and its own (:func:`sensitivity`: tokens the model never saw move with every update) is allowed k times it.
Misalignment must be clear and hold both ways: the step misses by at least :data:`MISALIGN_MISS` times its
tolerance, batch s+o reproduces the loss logged at s, and batch s the loss logged at s-o.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from forensics.schema.words import counted

Z_HIGH = 3.0
#: |z| at or below this: within the controls' spread (about 95% of batches drawn like the controls, with K = 8).
Z_NORMAL = 2.0
DATA_RISE = 0.3
MISALIGN_MISS = 2.0
#: Relative change of the other clusters' loss (a share of their loss before the update).
COMPOSITION_MIN = 0.02
COMPOSITION_RATIO = 2.0
STATE_RISE = 0.2
RTOL_EXACT = 0.02
DRIFT_FACTOR = 1.5
RTOL_MAX = 0.3
#: A neighbour must match at least this many times better than the step itself to call the join misaligned.
NEIGHBOUR_MARGIN = 3.0
#: A train-mode replay reproduces the logged loss within the tolerance plus this many SDs of its dropout seeds (the
#: logged value is one draw of the dropout masks; its mean over a few seeds is an estimate).
SEED_Z = 3.0
#: The suspect moves at most this many times faster than its controls (:func:`sensitivity`), and their relative
#: move counts as at least this much (a settled run's controls barely move).
SENSITIVITY_MAX = 10.0
SENSITIVITY_FLOOR = 0.01
#: How sure each verdict is, by how it was reached (``after``: at a checkpoint after the step).
CONFIDENCE = {
    ("data", "every"): 0.95,
    ("data", "one"): 0.85,
    ("data", "after"): 0.8,
    ("normal", "before"): 0.9,
    ("normal", "after"): 0.6,
    ("state", "before"): 0.8,
    ("composition", "before"): 0.7,
    ("misaligned", None): 0.9,
    ("not-reproduced", None): 0.8,
    ("nondeterministic", None): 0.95,
    ("inconclusive", None): 0.3,
}


def tolerance(
    logged: float, distance: int, calibration: list[tuple[int, float]] | None = None, sensitivity: float = 1.0
) -> float:
    """The largest |replayed - logged| still counted as reproduced, ``distance`` updates from the checkpoint;
    ``calibration`` holds (distance, relative error) of the steps between the checkpoint and the suspect, and
    ``sensitivity`` how many times faster than they the suspect's own loss moves (:func:`sensitivity`)."""
    distance = abs(distance)
    drift = max((e for d, e in (calibration or []) if 0 < d <= distance), default=0.0) if distance > 0 else 0.0
    rtol = min(RTOL_MAX, RTOL_EXACT + DRIFT_FACTOR * drift * max(1.0, sensitivity))
    return rtol * max(abs(logged), 1e-6)


def sensitivity(replayed: float, controls_mean: float | None, earlier: list[dict]) -> float:
    """How many times faster than its same-bucket controls the suspect's loss moved between the nearest earlier
    checkpoint and its own (at least 1, at most :data:`SENSITIVITY_MAX`; 1 without an earlier checkpoint).

    The calibration steps are ordinary batches: an outlier batch (tokens the model never saw) moves more per update
    than they do, so the drift they measure is scaled by how much more it moved across the checkpoints before."""
    e = earlier[0] if earlier else None
    if not e or not e.get("replayed") or not e.get("controls_mean") or not controls_mean:
        return 1.0
    own = abs(replayed - e["replayed"]) / abs(e["replayed"])
    theirs = abs(controls_mean - e["controls_mean"]) / abs(e["controls_mean"])
    return min(SENSITIVITY_MAX, max(1.0, own / max(theirs, SENSITIVITY_FLOOR)))


def zscore(value: float | None, controls: list[float]) -> float | None:
    """z of ``value`` against ``controls`` (>= 2); the spread is floored at 5% of their mean so near-identical
    controls do not turn a tiny difference into a huge z."""
    xs = [c for c in controls if c is not None and math.isfinite(c)]
    if len(xs) < 2 or value is None or not math.isfinite(value):
        return None
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return (value - mean) / max(sd, 0.05 * abs(mean), 1e-6)


def spread(values: list[float]) -> float:
    """The sample SD of ``values`` (0 for fewer than two): the spread of a replay over dropout seeds."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@dataclass
class TrainReplay:
    """The batch replayed in train mode over dropout ``seeds``: their mean loss and its spread."""

    seeds: list[int]
    losses: list[float]
    calibration: list[tuple[int, float]] = field(default_factory=list)
    #: offset -> the neighbour batch's relative error against its own logged loss, in train mode too
    neighbour_own_error: dict[str, float] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return sum(self.losses) / len(self.losses)

    @property
    def spread(self) -> float:
        return spread(self.losses)


@dataclass
class Measured:
    """What the experiments measured for one step (inputs of :func:`decide`)."""

    step: int
    checkpoint_step: int
    logged: float | None
    replayed: float
    neighbours: dict[str, float | None]
    neighbour_logged_match: dict[str, float] = field(default_factory=dict)  # offset -> |R(s+o) - L(s)|
    neighbour_distance: dict[str, int] = field(default_factory=dict)
    #: offset -> relative error of the neighbour's batch against its own logged loss (|R(s+o) - L(s+o)| / L(s+o))
    neighbour_own_error: dict[str, float] = field(default_factory=dict)
    z: float | None = None
    controls_mean: float | None = None
    earlier: list[dict] = field(default_factory=list)  # {checkpoint_step, replayed, z, controls_mean}
    leave_out: dict | None = None  # {sample_ids, replayed, z}
    step_offset: int = 0
    calibration: list[tuple[int, float]] = field(default_factory=list)  # (distance, relative error)
    reverse_logged: dict[str, float] = field(default_factory=dict)  # offset o -> loss logged at s - o
    determinism: dict | None = None  # {max_abs_diff, equal, second?, train?}
    #: Other clusters' loss change after one update (suspect batch, mixed batch) and their loss before it.
    composition: tuple[float, float, float] | None = None
    #: The checkpoint is after the step (none at or before it): the model has trained on this batch since.
    after: bool = False
    #: The train-mode replay over dropout seeds (None: not run: reproduced in eval mode, or no dropout).
    train: TrainReplay | None = None
    #: The model's largest dropout probability (0: train mode cannot differ from eval mode).
    dropout: float = 0.0
    #: The comparisons were made in train mode (``--mode train``): ``replayed`` and the controls are seed means.
    compared_in_train: bool = False
    gradient_z: float | None = None


@dataclass
class Verdict:
    """A step's verdict, how sure it is, the mode that reproduced the logged loss, and the evidence sentences."""

    verdict: str
    confidence: float
    mode: str
    evidence: list[str]


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _where(m: Measured) -> str:
    d = abs(m.step - m.checkpoint_step)
    if m.after:
        return f"checkpoint {m.checkpoint_step}, {counted(d, 'update')} after the step (none is saved at or before it)"
    return f"checkpoint {m.checkpoint_step}"


def decide(m: Measured) -> Verdict:
    """The verdict of one step (module docstring)."""
    ev: list[str] = []
    det = m.determinism or {}
    bad = [d for d in (det, det.get("second") or {}, det.get("train") or {}) if d and not d.get("equal", True)]
    if bad:
        d = bad[0]
        where = (
            f" on {d['device']} ({d['dtype']})"
            if "device" in d
            else (" with the same dropout seed" if d is det.get("train") else " twice")
        )
        ev.append(
            f"The same forward{where} disagrees with itself by up to {d['max_abs_diff']:.3g} per sample: "
            "replays cannot be compared with the log until the forward is deterministic (an unseeded random "
            "source in the model, a nondeterministic kernel)."
        )
        return _verdict("nondeterministic", None, "train" if m.compared_in_train else "eval", ev)
    mode, reproduced, tol = _reproduction(m, ev)
    if not reproduced:
        return _not_reproduced(m, mode, tol, ev)
    return _compare(m, mode, ev)


def _verdict(name: str, how: str | None, mode: str, ev: list[str]) -> Verdict:
    return Verdict(name, CONFIDENCE.get((name, how), CONFIDENCE.get((name, None), 0.5)), mode, ev)


def _reproduction(m: Measured, ev: list[str]) -> tuple[str, bool, float | None]:
    """Which mode reproduces the logged loss (eval first, then train over dropout seeds), and the tolerance."""
    first = "train" if m.compared_in_train else "eval"
    if m.logged is None:
        ev.append(f"No logged loss at step {m.step}: reproduction not checked.")
        return first, True, None
    if m.after:
        ev.append(
            f"Step {m.step}'s batch replayed at {_where(m)} gives {_f(m.replayed)} ({_f(m.logged)} logged); "
            "a state after the step is not the one that logged it, so reproduction is not checked."
        )
        return first, True, None
    dist = m.step - m.checkpoint_step
    sens = sensitivity(m.replayed, m.controls_mean, m.earlier)
    tol = tolerance(m.logged, dist, m.calibration, sens)
    label = "in train mode (the mean over dropout seeds)" if m.compared_in_train else "in eval mode"
    ev.append(
        f"Step {m.step}'s batch replayed at {_where(m)} {label} gives {_f(m.replayed)} against {_f(m.logged)} "
        f"logged (tolerance {_f(tol)})."
    )
    if abs(m.replayed - m.logged) <= tol:
        return first, True, tol
    t = m.train
    if t is not None and not m.compared_in_train:
        ttol = tolerance(m.logged, dist, t.calibration or m.calibration, sens)
        ok = abs(t.mean - m.logged) <= ttol + SEED_Z * t.spread
        ev.append(
            f"In train mode (dropout {m.dropout:g} on, as the run trained) over {len(t.seeds)} seeds it gives "
            f"{_f(t.mean)} (spread {_f(t.spread)})"
            + (
                ": the logged loss is reproduced in train mode; the "
                "comparisons below are in eval mode, suspect and "
                "controls alike."
                if ok
                else "."
            )
        )
        if ok:
            return "train", True, ttol
    return first, False, tol


def _not_reproduced(m: Measured, mode: str, tol: float | None, ev: list[str]) -> Verdict:
    err = abs(m.replayed - m.logged) if m.logged is not None else 0.0
    best = min(m.neighbour_logged_match.items(), key=lambda kv: kv[1], default=None)
    if best is not None and tol is not None:
        off, nerr = best
        ntol = tolerance(m.logged, m.neighbour_distance.get(off, 0), m.calibration)
        back = m.reverse_logged.get(off)
        back_ok = back is None or abs(m.replayed - back) <= tolerance(back, m.step - m.checkpoint_step, m.calibration)
        if nerr <= ntol and nerr * NEIGHBOUR_MARGIN < err and back_ok and err >= MISALIGN_MISS * tol:
            o = int(off)
            ev.append(
                f"The batch of step {m.step + o} reproduces the loss logged at step {m.step} "
                f"({_f(m.neighbours.get(off))})"
                + (
                    f", and step {m.step}'s batch the loss logged at step {m.step - o} ({_f(back)})"
                    if back is not None
                    else ""
                )
                + f": metrics and plan are joined {abs(o)} step off; "
                f"set step_offset = {m.step_offset - o} (now {m.step_offset})."
            )
            return _verdict("misaligned", None, mode, ev)
    tried = "eval mode" + (
        f" and train mode over {len(m.train.seeds)} dropout seeds"
        if m.train is not None
        else (" (the model has no dropout, so train mode cannot differ)" if m.dropout == 0 else "")
    )
    ev.append(f"No mode reproduces it ({tried}), and neither neighbour's batch (s-1, s+1) gives the logged value.")
    # what the other batches replayed near it say, in the mode that came closest (train mode when it ran)
    src = m.train if m.train is not None else m
    others = list(src.neighbour_own_error.values()) + [e for _, e in src.calibration]
    rel = err / max(abs(m.logged or 0.0), 1e-6)
    rel_tol = (tol or 0.0) / max(abs(m.logged or 0.0), 1e-6)
    if others and max(others) <= max(rel_tol, RTOL_EXACT):
        ev.append(
            f"The other batches replayed near it reproduce their own logged losses (within {max(others):.1%}, "
            f"this one misses by {rel:.0%}), so the checkpoint, the padding and the loss definition are the "
            f"run's: the tokens of step {m.step}'s batch differ from what the run fed at that step (or the plan "
            "names other samples for it)."
        )
    elif others:
        ev.append(
            f"The other batches replayed near it miss their own logged losses too (by up to {max(others):.1%}): "
            "the checkpoint is not the state those steps saw, or the padding or the loss definition (run.toml "
            "pad_id, pad_side, loss_denominator) differ from the run's."
        )
    else:
        ev.append(
            "No other batch near it could be checked: the checkpoint, the tokens, the padding or the loss "
            "definition differ from the run's."
        )
    return _verdict("not-reproduced", None, mode, ev)


def _compare(m: Measured, mode: str, ev: list[str]) -> Verdict:
    zs = [m.z] + [e.get("z") for e in m.earlier]
    if m.z is not None:
        ev.append(
            f"Against same-bucket controls at checkpoint {m.checkpoint_step} (mean {_f(m.controls_mean)}) the "
            f"batch has z = {m.z:.1f}."
        )
    if m.earlier:
        ev.append(
            "At earlier checkpoints: "
            + "; ".join(f"{e['checkpoint_step']}: {_f(e['replayed'])} (z {_f(e.get('z'))})" for e in m.earlier)
            + "."
        )
    if m.leave_out and m.leave_out.get("sample_ids"):
        lo = m.leave_out
        ev.append(
            f"Without its {len(lo['sample_ids'])} top samples the batch gives {_f(lo['replayed'])} "
            f"(z {_f(lo.get('z'))})."
        )
    rise = m.replayed / m.controls_mean - 1 if m.controls_mean else 0.0
    if all(z is not None and z >= Z_HIGH for z in zs) and rise >= DATA_RISE:
        if m.after:
            ev.append(
                "The model had trained on this batch by then, which can only have lowered its loss, and it is "
                "still high against its own bucket: the data caused it."
            )
            return _verdict("data", "after", mode, ev)
        where = "at every checkpoint tried" if m.earlier else "at the only checkpoint before it"
        ev.append(f"The batch is high against its own bucket {where}: the data caused it.")
        return _verdict("data", "every" if m.earlier else "one", mode, ev)
    if not m.after and m.z is not None and m.z < Z_HIGH and m.earlier and m.controls_mean:
        suspect_rise = [m.replayed / e["replayed"] - 1 for e in m.earlier if e.get("replayed")]
        control_rise = [m.controls_mean / e["controls_mean"] - 1 for e in m.earlier if e.get("controls_mean")]
        if (
            suspect_rise
            and control_rise
            and min(suspect_rise) >= STATE_RISE
            and min(control_rise) >= STATE_RISE
            and all((e.get("z") or 0.0) < Z_HIGH for e in m.earlier)
        ):
            ev.append(
                f"At checkpoint {m.checkpoint_step} the suspect and its controls are high alike (+"
                f"{min(suspect_rise):.0%} and +{min(control_rise):.0%} over the earlier checkpoints), and the "
                "batch was normal before: the model state caused it, not the data."
            )
            return _verdict("state", "before", mode, ev)
    if (
        not m.after
        and m.composition is not None
        and (m.z is None or m.z < Z_HIGH)
        and not (m.leave_out or {}).get("sample_ids")
    ):
        harm, mixed, before = m.composition
        harm, mixed = harm / before, mixed / before
        ev.append(
            f"One update on this batch changes the loss of the clusters it does not hold by {harm:+.1%}; one "
            f"update on a mixed batch of the same size by {mixed:+.1%}."
        )
        if harm >= COMPOSITION_MIN and harm >= COMPOSITION_RATIO * max(mixed, 0.0) and harm - mixed >= COMPOSITION_MIN:
            ev.append(
                "Each sample is normal, but the batch's composition pulls the model away from the other "
                "clusters: rebuild batches so that each mixes clusters (bucketed shuffle)."
            )
            return _verdict("composition", "before", mode, ev)
    grad_ok = m.gradient_z is None or m.gradient_z <= Z_NORMAL
    if m.z is not None and abs(m.z) <= Z_NORMAL and grad_ok:
        what = "its loss" + (" and its gradient norm lie" if m.gradient_z is not None else " lies")
        if m.after:
            ev.append(
                f"At this later checkpoint {what} within its controls' spread (|z| <= {Z_NORMAL:g}); the model "
                "had trained on this batch by then and may have learned it, so this clears it less firmly than a "
                "checkpoint before the step would."
            )
            return _verdict("normal", "after", mode, ev)
        ev.append(
            f"{what[0].upper() + what[1:]} within its controls' spread (|z| <= {Z_NORMAL:g}) at the same "
            "checkpoint: nothing in this batch explains a spike."
        )
        return _verdict("normal", "before", mode, ev)
    ev.append(
        "Neither the batch against its bucket nor the state across checkpoints explains a spike here, and it is "
        "not within its controls' spread either."
    )
    return _verdict("inconclusive", None, mode, ev)
