"""The verdict: one sentence that says what the audit found, for the summary, the report and the dashboard.

It lives with the findings model (not in the report), reads findings.json only, and words each kind as the registry
of finding kinds (:mod:`forensics.detect.kinds`) says.
"""

from __future__ import annotations

from typing import Any


def _share(value: Any) -> str:
    return f"{100 * float(value):.1f}%" if isinstance(value, (int, float)) else str(value)


def verdict(findings: dict, loss_key: str | None = None) -> str:
    """One sentence naming the main cause when the evidence supports one; else what was found, or an all-clear that
    says what was judged (never a green all-clear over metrics that could not be judged)."""
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict)]
    run = findings.get("run") or {}
    loss = loss_key or run.get("loss_key") or "the loss"
    if not causes:
        return _all_clear(findings, loss)
    batch = [c for c in causes if c.get("kind") == "batch"]
    main = causes[0]
    if len(batch) > 1 and all((c.get("details") or {}).get("recurs") for c in batch) and main in batch:
        firsts = sorted(c["events"][0] for c in batch)
        returns = sorted(s for c in batch for s in c["events"][1:])
        d = [c.get("details") or {} for c in batch]
        who = "near-duplicate samples" if all(x.get("near_duplicates") for x in d) else "the same samples"
        how = " by a plan built once and only reordered" if all(x.get("static_plan") for x in d) else ""
        text = (f"{len(batch)} batches of {who}, packed together{how}, caused the {loss} spikes at steps "
                f"{_list(firsts)} and spiked again when they came back at steps {_list(returns)}")
        rest = len(causes) - len(batch)
        return text + (f"; {rest} other cause{'s' if rest > 1 else ''} below." if rest else ".")
    text = str(main.get("summary") or "").rstrip(".")
    rest = len(causes) - 1
    return text + (f"; {rest} other cause{'s' if rest > 1 else ''} below." if rest else ".")


def facts(findings: dict) -> list[str]:
    """The facts under the verdict: every cause's summary, then the run-level measures."""
    out = [str(c.get("summary")) for c in findings.get("causes") or [] if isinstance(c, dict) and c.get("summary")]
    osc = findings.get("oscillation") or {}
    if isinstance(osc, dict) and osc.get("bucket_variance_share") is not None:
        out.append(f"{_share(osc['bucket_variance_share'])} of the detrended loss variance is explained by the "
                   "batch's length bucket (expected jumpiness of bucketed batches, not spikes).")
    pf = findings.get("plan")
    if isinstance(pf, dict) and pf.get("static") is not None:
        out.append("The batch composition is static across epochs." if pf["static"] else
                   "The batch composition varies across epochs.")
    return out


def _all_clear(findings: dict, loss: str) -> str:
    run = findings.get("run") or {}
    unjudged = run.get("not_judged") or []
    analysed = run.get("analysed_metrics") or [loss]
    info = [f for f in findings.get("findings") or [] if isinstance(f, dict) and f.get("severity") != "critical"]
    if unjudged:
        names = ", ".join(str(u.get("metric")) for u in unjudged)
        return f"No spike found, but not every metric could be judged ({names}: too few values); nothing is cleared."
    text = f"No spike and no NaN/inf in {', '.join(map(str, analysed))} over {run.get('steps', 0):,} steps"
    if info:
        text += f" ({len(info)} lesser finding{'s' if len(info) > 1 else ''} recorded)"
    return text + "."


def _list(steps: list[int]) -> str:
    s = [str(x) for x in steps]
    return s[0] if len(s) == 1 else ", ".join(s[:-1]) + " and " + s[-1]
