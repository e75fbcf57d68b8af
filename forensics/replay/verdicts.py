"""The experiments' numbers -> one verdict per step, with the sentences that justify it.

Order of the rules (the first that holds wins):
0. ``nondeterministic``: the same forward run twice (or on the second device/dtype given) disagrees beyond
   tolerance: nothing else can be concluded from a replay until that is fixed (dropout left on, a kernel).
1. ``misaligned``: the step's batch does not reproduce the logged loss and a neighbour's batch (s-1 or s+1) does,
   clearly better: the metrics and the plan are joined one step off.
2. ``not-reproduced``: the replayed loss is off the logged one beyond tolerance and no neighbour explains it.
3. ``data``: the batch (or its top samples) is high against same-bucket controls (z >= :data:`Z_HIGH`) at every
   checkpoint tried.
4. ``state``: at the checkpoint just before the spike the suspect and its controls are high alike (z below
   :data:`Z_HIGH`, both >= :data:`STATE_RISE` above their values at the earlier checkpoints), and at the earlier
   checkpoints the suspect is normal.
5. ``composition``: every sample is normal (no top suspects, z below :data:`Z_HIGH`), but one update on the batch
   raises the loss of the clusters it does not hold by at least :data:`COMPOSITION_MIN` and
   :data:`COMPOSITION_RATIO` times what one update on a mixed batch of the same size does.
6. ``inconclusive`` otherwise.

Tolerance of reproduction: relative :data:`RTOL_EXACT` at the step's own checkpoint (replay on another device, dtype
or kernel is not bit-exact). When the checkpoint is d updates before the step, the parameters moved: steps up to d
updates after this checkpoint and after the earlier ones are replayed at those checkpoints too (``calibration``),
and their largest relative error at a distance <= d, times :data:`DRIFT_FACTOR`, is added (capped at
:data:`RTOL_MAX`): a run that learns fast gets a wide tolerance, a settled one a tight one, both measured rather than
assumed. Misalignment must be clear and hold both ways: the step misses by at least :data:`MISALIGN_MISS` times its
tolerance, batch s+o reproduces the loss logged at s, and batch s the loss logged at s-o.

``data`` also needs the batch to be clearly above its bucket in size (:data:`DATA_RISE` over the controls' mean), so a
batch that is merely unusual for its bucket (a mixed batch at a bucket boundary) does not count as a spike's cause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

Z_HIGH = 3.0
DATA_RISE = 0.3
MISALIGN_MISS = 2.0
COMPOSITION_MIN = 0.01
COMPOSITION_RATIO = 2.0
STATE_RISE = 0.2
RTOL_EXACT = 0.02
DRIFT_FACTOR = 1.5
RTOL_MAX = 0.3
#: A neighbour must match at least this many times better than the step itself to call the join misaligned.
NEIGHBOUR_MARGIN = 3.0


def tolerance(logged: float, distance: int, calibration: list[tuple[int, float]] | None = None) -> float:
    """The largest |replayed - logged| still counted as reproduced, ``distance`` updates after the checkpoint;
    ``calibration`` holds (distance, relative error) of the steps between the checkpoint and the suspect."""
    drift = max((e for d, e in (calibration or []) if 0 < d <= distance), default=0.0) if distance > 0 else 0.0
    rtol = min(RTOL_MAX, RTOL_EXACT + DRIFT_FACTOR * drift)
    return rtol * max(abs(logged), 1e-6)


def zscore(value: float, controls: list[float]) -> float | None:
    """z of ``value`` against ``controls`` (>= 2); the spread is floored at 5% of their mean so near-identical
    controls do not turn a tiny difference into a huge z."""
    xs = [c for c in controls if math.isfinite(c)]
    if len(xs) < 2 or not math.isfinite(value):
        return None
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return (value - mean) / max(sd, 0.05 * abs(mean), 1e-6)


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
    z: float | None = None
    controls_mean: float | None = None
    earlier: list[dict] = field(default_factory=list)  # {checkpoint_step, replayed, z, controls_mean}
    leave_out: dict | None = None  # {sample_ids, replayed, z}
    step_offset: int = 0
    calibration: list[tuple[int, float]] = field(default_factory=list)  # (distance, relative error)
    reverse_logged: dict[str, float] = field(default_factory=dict)  # offset o -> loss logged at s - o
    determinism: dict | None = None  # {max_abs_diff, equal, second?}
    composition: tuple[float, float] | None = None  # other clusters' loss change: (suspect update, mixed update)


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def decide(m: Measured) -> tuple[str, list[str]]:
    """The verdict of one step and its evidence sentences."""
    ev: list[str] = []
    det = m.determinism or {}
    bad = [d for d in (det, det.get("second") or {}) if d and not d.get("equal", True)]
    if bad:
        d = bad[0]
        where = f" on {d['device']} ({d['dtype']})" if "device" in d else " twice"
        ev.append(f"The same forward{where} disagrees with itself by up to {d['max_abs_diff']:.3g} per sample: "
                  "replays cannot be compared with the log until the forward is deterministic (dropout left on, "
                  "a nondeterministic kernel).")
        return "nondeterministic", ev
    err = None if m.logged is None else abs(m.replayed - m.logged)
    tol = None if m.logged is None else tolerance(m.logged, m.step - m.checkpoint_step, m.calibration)
    if m.logged is None:
        ev.append(f"No logged loss at step {m.step}: reproduction not checked.")
    else:
        ev.append(f"Step {m.step}'s batch replayed at checkpoint {m.checkpoint_step} gives {_f(m.replayed)} "
                  f"against {_f(m.logged)} logged (tolerance {_f(tol)}).")
    reproduced = err is None or err <= tol
    if not reproduced:
        best = min(m.neighbour_logged_match.items(), key=lambda kv: kv[1], default=None)
        if best is not None:
            off, nerr = best
            ntol = tolerance(m.logged, m.neighbour_distance.get(off, 0), m.calibration)
            back = m.reverse_logged.get(off)
            back_ok = back is None or abs(m.replayed - back) <= tolerance(back, m.step - m.checkpoint_step,
                                                                           m.calibration)
            if nerr <= ntol and nerr * NEIGHBOUR_MARGIN < err and back_ok and err >= MISALIGN_MISS * tol:
                o = int(off)
                ev.append(f"The batch of step {m.step + o} reproduces the loss logged at step {m.step} "
                          f"({_f(m.neighbours.get(off))})" + (f", and step {m.step}'s batch the loss logged at step "
                          f"{m.step - o} ({_f(back)})" if back is not None else "") +
                          f": metrics and plan are joined {abs(o)} step off; "
                          f"set step_offset = {m.step_offset - o} (now {m.step_offset}).")
                return "misaligned", ev
        ev.append("Neither neighbour (s-1, s+1) reproduces it either: the checkpoint, the tokens, the padding or "
                  "the loss definition differ from the run's.")
        return "not-reproduced", ev
    zs = [m.z] + [e.get("z") for e in m.earlier]
    if m.z is not None:
        ev.append(f"Against same-bucket controls at checkpoint {m.checkpoint_step} (mean {_f(m.controls_mean)}) "
                  f"the batch has z = {m.z:.1f}.")
    if m.earlier:
        ev.append("At earlier checkpoints: " + "; ".join(
            f"{e['checkpoint_step']}: {_f(e['replayed'])} (z {_f(e.get('z'))})" for e in m.earlier) + ".")
    if m.leave_out and m.leave_out.get("sample_ids"):
        lo = m.leave_out
        ev.append(f"Without its {len(lo['sample_ids'])} top samples the batch gives {_f(lo['replayed'])} "
                  f"(z {_f(lo.get('z'))}).")
    rise = m.replayed / m.controls_mean - 1 if m.controls_mean else 0.0
    if all(z is not None and z >= Z_HIGH for z in zs) and rise >= DATA_RISE:
        where = "at every checkpoint tried" if m.earlier else "at the only checkpoint before it"
        ev.append(f"The batch is high against its own bucket {where}: the data caused it.")
        return "data", ev
    if m.z is not None and m.z < Z_HIGH and m.earlier and m.controls_mean:
        suspect_rise = [m.replayed / e["replayed"] - 1 for e in m.earlier if e.get("replayed")]
        control_rise = [m.controls_mean / e["controls_mean"] - 1 for e in m.earlier if e.get("controls_mean")]
        if suspect_rise and control_rise and min(suspect_rise) >= STATE_RISE and min(control_rise) >= STATE_RISE \
                and all((e.get("z") or 0.0) < Z_HIGH for e in m.earlier):
            ev.append(f"At checkpoint {m.checkpoint_step} the suspect and its controls are high alike (+"
                      f"{min(suspect_rise):.0%} and +{min(control_rise):.0%} over the earlier checkpoints), and the "
                      "batch was normal before: the model state caused it, not the data.")
            return "state", ev
    if m.composition is not None and (m.z is None or m.z < Z_HIGH) and not (m.leave_out or {}).get("sample_ids"):
        harm, mixed = m.composition
        ev.append(f"One update on this batch changes the loss of the clusters it does not hold by {harm:+.3f}; one "
                  f"update on a mixed batch of the same size by {mixed:+.3f}.")
        if harm >= COMPOSITION_MIN and harm >= COMPOSITION_RATIO * max(mixed, 0.0) and harm - mixed >= COMPOSITION_MIN:
            ev.append("Each sample is normal, but the batch's composition pulls the model away from the other "
                      "clusters: rebuild batches so that each mixes clusters (bucketed shuffle).")
            return "composition", ev
    ev.append("Neither the batch against its bucket nor the state across checkpoints explains a spike here.")
    return "inconclusive", ev
