"""The class of a spike compared across runs: ``recurring``, ``vanished`` or ``unique`` (one decision rule).

A spike's data position (:mod:`forensics.compare.positions`) stands in each compared run in one of five states:

- ``spiked``: the run spiked there;
- ``echoed``: the run consumed the same data there and its loss rose by at least :data:`ECHO_SHARE` of the
  anchor spike's rise (each over its own run's local median), yet stayed under its own detector's threshold: the
  same spike, smaller (a real pair of reruns shows one at 4.54 against 4.56, just under a 1.5x ratio);
- ``held``: the run consumed the same data there (its plan holds mostly the same samples at that step, or the runs
  read the data in the same order: ``--same-order``) and did not spike;
- ``moved``: the run's plan shows the samples were *not* together there: consumed apart at other steps, or not at
  all (excluded), and the run did not spike;
- ``unknown``: the run has no plan and no ``--same-order`` says its order: only its step is known, and it did not
  spike at that step;
- ``unreached``: the run's metrics do not reach that step (a shorter run, a plan ahead of its metrics).

The rule, first match wins:

1. spiked (or echoed) in two runs or more: **recurring**, the same data spiked again, evidence of a data cause
   (runs that held the position and stayed quiet are not a veto: two runs agreeing by chance on one step is rare);
2. spiked in one run and another run ``held`` the same data without spiking: **unique**, the data alone does not
   make it spike (state, hardware, chance);
3. spiked in one run and another run's order ``moved`` the samples apart (or left them out) without spiking:
   **vanished**, the spike follows the order or the composition of the data;
4. otherwise (the other runs unknown or unreached): **unique**, one run only.
"""

from __future__ import annotations

from collections.abc import Mapping

SPIKED, ECHOED, HELD, MOVED, UNKNOWN, UNREACHED = "spiked", "echoed", "held", "moved", "unknown", "unreached"
STATES = (SPIKED, ECHOED, HELD, MOVED, UNKNOWN, UNREACHED)
#: A quiet run's rise at the same data, as a share of the anchor spike's rise, from which it is the same spike.
ECHO_SHARE = 0.5
RECURRING, VANISHED, UNIQUE = "recurring", "vanished", "unique"
CLASSES = (RECURRING, VANISHED, UNIQUE)
#: What each class says about the cause, in the words the summary and the report use.
MEANING = {
    RECURRING: "the same data spiked in several runs: evidence of a data cause",
    VANISHED: "gone where the order put the samples elsewhere: data order or composition",
    UNIQUE: "one run only: state, hardware or chance",
}


def classify(states: Mapping[str, str]) -> str:
    """The class of one data position from the state of every compared run (``{run: state}``; the module
    docstring's rule)."""
    bad = sorted(set(states.values()) - set(STATES))
    if bad:
        raise ValueError(f"unknown state {bad[0]!r}; expected one of {', '.join(STATES)}")
    spiked = sum(s in (SPIKED, ECHOED) for s in states.values())
    if spiked >= 2:
        return RECURRING
    if not any(s == SPIKED for s in states.values()):
        raise ValueError("a data position is classed only where some run spiked")
    if any(s == HELD for s in states.values()):
        return UNIQUE
    if any(s == MOVED for s in states.values()):
        return VANISHED
    return UNIQUE


def echoes(rise: float | None, anchor_rise: float | None) -> bool:
    """Whether a run that consumed the same data without spiking still rose there like the anchor spike: its rise
    over its local median is at least :data:`ECHO_SHARE` of the anchor's (None, or an anchor that did not rise:
    no)."""
    if rise is None or anchor_rise is None or anchor_rise <= 0:
        return False
    return rise >= ECHO_SHARE * anchor_rise
