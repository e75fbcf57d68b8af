"""Samples that hurt each time they come back: a run-level estimate of each sample's effect on the loss, from the plan.

A step must clear the spike thresholds before a step-by-step rule suspects anything; real corrupted data rarely does
(a sample that lifts its step's loss 1.2-1.5x, 3 times, each time beside other batch-mates). The plan says which
samples every step consumed, so the run can be asked directly which samples the loss went up with.

**The residual.** For every logged step, ``y = log(loss)`` less what the rows around it say of a step of its
content: a robust fit of ``y`` on a linear trend, the step's token shares of the large content clusters (a sample
whose tokens are foreign to its cluster counts in none: its cluster's level does not predict it) and its mean log
sample length, made on the ``window`` logged values either side of it
(:mod:`forensics.detect.evidence.local_reference`). The types of a run learn at different speeds, so the gap between
their losses moves; refitted locally, each type's level follows its own learning curve. A whole-run fit against a
centred median (which follows whichever type a length-grouped sampler is serving) put an easy type's ordinary batch
0.3 above its reference or 0.7 below, by its neighbours. Each step is then weighted by the noise of its phase (the
local fit's robust SD: an early descent is noisier than a plateau) and by its tokens. What the step's tags still
explain (its mean log sample length, its log number of samples, its shares of the large clusters) is fitted robustly
(Huber weights) *together* with the sample effects below, and trimmed (refitted on the 80% of steps it fits best),
so that a bucket or cluster made mostly of corrupted batches cannot absorb them. Without content clusters the
reference is a centred rolling median of ``y``, and the tags include the log of what the step's composition predicts
(the spike detector's causal expectation, :mod:`forensics.detect.evidence.expected_loss`).

**The effects.** Each step's residual is shared among its samples by their token share ``w`` (a value logged over a
window of ``logging_steps`` steps holds the union of their samples; grad accumulation and ranks come through the
plan's step mapping): ``r_s = sum_i w_si b_i + noise``. The effects are estimated sparsely and non-negatively by
greedy pursuit: the sample whose steps' residuals are highest (the score ``z_i = sum_s w_si r_s / (sigma
sqrt(sum_s w_si^2))``) is taken, its effect removed from its steps, and the scores of its co-members recomputed, so a
clean batch-mate of a corrupted sample does not borrow its evidence. The greedy order is then corrected by exchanges
(a clean sample whose batches each held a different corrupted one scores as they do: each taken sample is left out
and the pursuit completed without it, kept when that explains the steps better). Samples that were always in the
same steps (a static batch) cannot be told apart by the run and are judged as one block.

**The false-discovery limit.** The null comes from the run itself: the final residuals re-assigned to steps at random
(``permutations`` times) give each sample's score distribution under "no effect"; the p-values are its tail, the
q-values Benjamini-Hochberg's over every sample of the plan.

**An effect that matters.** Significance alone lists a clean sample a little harder than its batch (a repetitive row
at 6% above its 4-sample steps, twice, is q < 0.002 on a quiet run). A sample is listed only when, besides
``q <= q``, its own loss ran at least ``min_excess`` (0.5) above what its steps expect of it: its ``excess``, the
share it added to its steps' loss over its token share there (a block's samples each over their share of the block).

``harmful_samples`` lists those, most harmful first (:func:`most_harmful_first`), each ``{sample_id, appearances,
steps, logged_steps, effect, excess, z, q, reason}``; ``effect`` is the mean share of the step loss the sample added
above what the step's trend, tags and composition expect. One ``harmful_samples`` finding carries them (cause kind
``samples``): a strongly odd text or several samples whose appearances agree are its second line of evidence
(:func:`corroborated`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.evidence.content import ContentEvidence, content_evidence
from forensics.detect.findings import INFO, Finding
from forensics.detect.params import at_least, fraction, positive
from forensics.schema import N_TOKENS, SAMPLE_ID, STEP
from forensics.schema.steps import steps_list
from forensics.schema.words import counted

__all__ = ["HarmfulSamplesRule", "corroborated", "listed_samples", "most_harmful_first"]

#: The least excess of a sample's own loss over what its steps' trend, tags and composition expect of it (its step
#: effect over its token share) for it to be listed: 0.5, its loss at least 1.5x what its steps predict for it. A
#: clean sample of a harder kind than its batch predicts runs 0.2-0.25 above it (a repetitive motif row at 6% of a
#: 4-sample step); a noise row runs 0.8-2 above its steps, a static plan's corrupted block 1-2 (fixtures/hf_family.py).
MIN_EXCESS = 0.5
#: The content score (:mod:`forensics.detect.evidence.content`) from which a sample's own text is a second line of
#: evidence that makes its cause critical: 2, one signal at twice the flagging robust SDs or two signals. A noise,
#: repetition or near-duplicate row scores 3 or more; a clean row of a real Trainer run whose tokens were a little more
#: varied than its cluster's (5 robust SDs: 1.25) was listed once, and a flag that weak is a reason to look, not proof.
STRONG_CONTENT = 2.0


def listed_samples(est: pd.DataFrame, q: float, min_excess: float = MIN_EXCESS, limit: int = 50) -> pd.DataFrame:
    """The rows of the estimate the rule lists: a false-discovery q-value at most ``q`` *and* an effect that matters
    (``excess`` at least ``min_excess``: a significant but small excess is a sample a little harder than its batch,
    not one that hurts), those with content evidence first, then by score; at most ``limit``."""
    chosen = est[(est["q"] <= q) & (est["excess"] >= min_excess)]
    return chosen.sort_values(["content", "z", SAMPLE_ID], ascending=[False, False, True], kind="stable").head(limit)


def corroborated(rows: list[dict], content: ContentEvidence) -> bool:
    """Whether the listed samples (``sample_id``, ``appearances``: how many of its steps the estimate judged) carry
    a second line of evidence beside the loss: among those judged twice or more, one whose own text is strongly odd
    (content score at least :data:`STRONG_CONTENT`), or several (their appearances all agree). A sample whose other
    appearances fell before the trend was known was judged once: one hot step is no recurrence."""
    repeated = [x for x in rows if x["appearances"] >= 2]
    return len(repeated) >= 2 or any(content.score(x["sample_id"]) >= STRONG_CONTENT for x in repeated)


def most_harmful_first(rows: list[dict], content: ContentEvidence) -> list[dict]:
    """``rows`` (listed samples: ``sample_id``, ``steps``, ``content``, ``effect``, ``z``) in the order they are named.

    Content evidence first, and of it a text unlike every cluster first: a block of samples the run cannot tell apart
    (always in the same steps: a static plan's batch) holds the noise row and its clean batch-mates, whose own
    oddities (a repetitive motif, a templated near-duplicate) are those of their content type. Within each of those
    classes, one sample per block before any block's second: a block is one piece of evidence that one of its samples
    hurts, and its likeliest carrier is the sample with the rarest tokens (the text a model predicts worst). Then by
    effect (a block's samples share it, and its score up to float noise), rarity, score and id."""
    blocks: dict[tuple[int, ...], list[dict]] = {}
    for x in rows:
        blocks.setdefault(tuple(x["steps"]), []).append(x)
    place: dict[int, int] = {}
    for members in blocks.values():
        members.sort(key=lambda x: (-round(content.rarity(x["sample_id"]), 6), x["sample_id"]))
        place.update({x["sample_id"]: k for k, x in enumerate(members)})
    return sorted(
        rows,
        key=lambda x: (
            not x["content"],
            x["sample_id"] not in content.unlike,
            place[x["sample_id"]],
            -round(x["effect"], 9),
            -round(content.rarity(x["sample_id"]), 6),
            -round(x["z"], 6),
            x["sample_id"],
        ),
    )


class HarmfulSamplesRule(Rule):
    """The ``harmful_samples`` section and finding (module docstring).

    Parameters: ``q`` 0.05 (the false-discovery limit), ``window`` 101 (logged values either side of a step that its
    reference is fitted on; without clusters, the rolling median's length), ``permutations`` 20 (random
    re-assignments of the residuals for the null), ``max_pursuit`` 200 (samples the greedy pursuit may take),
    ``max_listed`` 50, ``seed`` 1, ``min_excess`` 0.5 (:data:`MIN_EXCESS`).
    """

    name = "samples"
    needs_plan = True
    section_name = "harmful_samples"
    parameter_constraints = {
        "q": fraction(),
        "window": positive("int"),
        "permutations": positive("int"),
        "max_pursuit": positive("int"),
        "max_listed": positive("int"),
        "seed": at_least(0, "int"),
        "min_excess": at_least(0),
    }
    required_columns = {"plan": (STEP, SAMPLE_ID), "samples": (SAMPLE_ID, N_TOKENS)}

    def __init__(
        self,
        q: float = 0.05,
        window: int = 101,
        permutations: int = 20,
        max_pursuit: int = 200,
        max_listed: int = 50,
        seed: int = 1,
        min_excess: float = MIN_EXCESS,
    ) -> None:
        self.q = q
        self.min_excess = min_excess
        self.window = window
        self.permutations = permutations
        self.max_pursuit = max_pursuit
        self.max_listed = max_listed
        self.seed = seed

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        self.section_ = []
        if not run.has_plan:
            return []
        self.check_inputs(run)
        # the estimator needs scipy's sparse matrices: imported only when a plan is there to estimate from
        from forensics.detect.evidence.sample_effects import estimate

        est = estimate(
            run, window=self.window, permutations=self.permutations, max_pursuit=self.max_pursuit, seed=self.seed
        )
        if est is None:
            return []
        if est.attrs.get("stride", 1) > 1:
            held, stride = est.attrs["max_entries"], est.attrs["stride"]
            self.warnings_.append(
                f"harmful samples: the plan holds more than {held:,} rows up to the metrics' last "
                f"step; estimated on one logged step in {stride}"
            )
        listed = listed_samples(est, self.q, self.min_excess, self.max_listed)
        if listed.empty:
            return []
        content = content_evidence(run.samples, listed[SAMPLE_ID].tolist())
        last = int(run.metrics[STEP].max())
        plan = run.plan_view.rows_holding(listed[SAMPLE_ID])
        plan = plan[plan[SAMPLE_ID].isin(listed[SAMPLE_ID]) & (plan[STEP] <= last)]
        consumed = plan.groupby(SAMPLE_ID)[STEP].apply(lambda x: sorted(set(int(v) for v in x))).to_dict()
        rows = []
        for r in listed.itertuples():
            sid = int(r.sample_id)
            steps = consumed.get(sid) or [int(s) for s in r.steps]  # every step that consumed it
            reason = (
                f"consumed {r.appearances} times (steps {steps_list(steps, run.logged_offset)}); the loss was "
                f"{100 * r.effect:.0f}% above what its trend, tags and composition expect each time it was "
                f"there on average, its own loss ~{100 * r.excess:.0f}% above what they expect of it "
                f"(z = {r.z:.1f}, q = {r.q:.2g})"
            )
            if r.block > 1:
                reason += (
                    f"; always in the same steps as {r.block - 1} other sample(s), which the run cannot tell apart"
                )
            said = list(content.reasons.get(sid, []))
            if said:
                reason += "; " + "; ".join(said)
            rows.append(
                {
                    "sample_id": sid,
                    "appearances": len(steps),
                    "steps": steps,
                    "logged_steps": [s + run.logged_offset for s in steps],
                    "effect": float(r.effect),
                    "excess": float(r.excess),
                    "z": float(r.z),
                    "q": float(r.q),
                    "reason": reason,
                    "content": said,
                }
            )
        rows = most_harmful_first(rows, content)
        self.section_ = rows
        all_steps = sorted({s for x in rows for s in x["steps"]})
        judged = [{"sample_id": int(r.sample_id), "appearances": int(r.appearances)} for r in listed.itertuples()]
        support = {"critical": True} if corroborated(judged, content) else {}
        n = len(rows)
        ids = ", ".join(str(x["sample_id"]) for x in rows[:8]) + (" ..." if n > 8 else "")
        summary = (
            f"{counted(n, 'sample')} ({ids}) raised the loss each time they were consumed (steps "
            f"{steps_list(all_steps, run.logged_offset, limit=8)}): the loss was on average "
            f"{100 * float(np.mean([x['effect'] for x in rows])):.0f}% above what the steps' trend and tags "
            f"expect there (false-discovery limit q <= {self.q:g})."
        )
        return [
            Finding(
                kind="harmful_samples",
                step=all_steps[0],
                end_step=all_steps[-1],
                metric=run.loss_key,
                value=float(n),
                severity=INFO,
                suspect_samples=[x["sample_id"] for x in rows],
                evidence=[summary] + [f"sample {x['sample_id']}: {x['reason']}" for x in rows[:3]],
                details={
                    "steps": all_steps,
                    "support": support,
                    "count": n,
                    "confidence": float(1.0 - min(x["q"] for x in rows)),
                },
            )
        ]
