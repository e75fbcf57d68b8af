"""The verdict: one sentence that says what the audit found, for the summary, the report and the dashboard.

It lives with the findings model (not in the report), reads findings.json only, and words each kind as the registry
of finding kinds (:mod:`forensics.detect.kinds`) says.
"""

from __future__ import annotations

from typing import Any

from forensics.detect.rules.composition import plan_words
from forensics.schema.words import counted, plural


def _share(value: Any) -> str:
    return f"{100 * float(value):.1f}%" if isinstance(value, (int, float)) else str(value)


def verdict(findings: dict, loss_key: str | None = None) -> str:
    """One sentence naming the main cause when the evidence supports one; else what was found, or an all-clear that
    says what was judged (never a green all-clear over metrics that could not be judged)."""
    for key in ("verdict", "summary"):
        text = findings.get(key)
        if isinstance(text, str) and text.strip():
            return text.strip()
    # only a cause at warning or above is named: what is info (explained, recorded) never is the verdict
    causes = [c for c in findings.get("causes") or [] if isinstance(c, dict) and c.get("severity") != "info"]
    run = findings.get("run") or {}
    loss = loss_key or run.get("loss_key") or "the loss"
    if not causes:
        if "causes" not in findings:
            return _listing(findings, loss_key)
        return _all_clear(findings, loss)
    batch = [c for c in causes if c.get("kind") == "batch"]
    main = causes[0]
    if len(batch) > 1 and all((c.get("details") or {}).get("recurs") for c in batch) and main in batch:
        firsts = sorted(c["events"][0] for c in batch)
        returns = sorted(s for c in batch for s in c["events"][1:])
        d = [c.get("details") or {} for c in batch]
        who = "near-duplicate samples" if all(x.get("near_duplicates") for x in d) else "the same samples"
        words = plan_words(findings.get("plan"))
        how = f" by a plan {words}" if words and all(x.get("static_plan") for x in d) else ""
        text = (
            f"{counted(len(batch), 'batch')} of {who}, packed together{how}, caused the {loss} spikes at steps "
            f"{_list(firsts)} and spiked again when they came back at steps {_list(returns)}"
        )
        rest = len(causes) - len(batch)
        return text + (f"; {counted(rest, 'other cause')} below." if rest else ".")
    text = str(main.get("summary") or "").rstrip(".")
    rest = len(causes) - 1
    return text + (f"; {counted(rest, 'other cause')} below." if rest else ".")


def facts(findings: dict) -> list[str]:
    """The facts under the verdict: every cause's summary, then the run-level measures."""
    out = [str(c.get("summary")) for c in findings.get("causes") or [] if isinstance(c, dict) and c.get("summary")]
    osc = findings.get("oscillation") or {}
    if isinstance(osc, dict) and osc.get("bucket_variance_share") is not None:
        out.append(
            f"{_share(osc['bucket_variance_share'])} of the detrended loss variance is explained by the "
            "batch's length bucket (expected jumpiness of bucketed batches, not spikes)."
        )
    pf = findings.get("plan")
    if isinstance(pf, dict) and pf.get("static") is not None:
        out.append(
            f"The batch plan is {plan_words(pf)}." if pf["static"] else "The batch composition varies across epochs."
        )
    return out


def _all_clear(findings: dict, loss: str) -> str:
    run = findings.get("run") or {}
    unjudged = run.get("not_judged") or []
    analysed = run.get("analysed_metrics") or [loss]
    info = [f for f in findings.get("findings") or [] if isinstance(f, dict) and f.get("severity") == "info"]
    if unjudged:
        names = ", ".join(str(u.get("metric")) for u in unjudged)
        return f"No spike found, but not every metric could be judged ({names}: too few values); nothing is cleared."
    spikes = findings.get("spikes") or []
    if spikes:
        text = (
            f"No fault found in {', '.join(map(str, analysed))} over {run.get('steps', 0):,} steps: "
            f"{counted(len(spikes), 'spike')} explained or not followed by the loss"
        )
    else:
        text = f"No spike and no NaN/inf in {', '.join(map(str, analysed))} over {run.get('steps', 0):,} steps"
    if info:
        text += f" ({counted(len(info), 'finding')} recorded as info)"
    return text + "."


def _list(steps: list[int]) -> str:
    s = [str(x) for x in steps]
    return s[0] if len(s) == 1 else ", ".join(s[:-1]) + " and " + s[-1]


def _num(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _listing(findings: dict, loss_key: str | None = None) -> str:
    """The facts in one sentence, for findings without causes (written by hand, or by an older version)."""
    parts = []
    spikes = [s for s in findings.get("spikes") or [] if isinstance(s, dict) and s.get("step") is not None]
    if spikes:
        by_metric: dict[str, list[dict]] = {}
        for s in spikes:
            by_metric.setdefault(str(s.get("metric") or loss_key or "loss"), []).append(s)
        for metric, items in sorted(by_metric.items(), key=lambda kv: kv[0] != (loss_key or "")):
            steps = ", ".join(str(int(s["step"])) for s in sorted(items, key=lambda s: int(s["step"]))[:6])
            more = " …" if len(items) > 6 else ""
            where = ""
            buckets = {s.get("bucket") for s in items}
            clusters = {s.get("cluster_name") for s in items}
            if len(buckets) == 1 and None not in buckets:
                where = f" in bucket {_num(items[0]['bucket'])}"
                if len(clusters) == 1 and items[0].get("cluster_name"):
                    where += f" / '{items[0]['cluster_name']}'"
            elif None not in buckets:
                where = f" across buckets {', '.join(_num(b) for b in sorted(buckets))}"
            parts.append(f"{len(items)} {metric} {plural('spike', len(items))} ({steps}{more}){where}")
    nonfinite = findings.get("nonfinite") or []
    if nonfinite:
        parts.append(counted(len(nonfinite), "non-finite value"))
    pf = findings.get("plan")
    if isinstance(pf, dict) and pf.get("static") is not None:
        parts.append(
            "batch composition is static across epochs" if pf["static"] else "batch composition varies across epochs"
        )
    osc = findings.get("oscillation") or {}
    if isinstance(osc, dict):
        if osc.get("detected"):
            parts.append("the loss oscillates")
        if osc.get("bucket_variance_share") is not None:
            parts.append(f"jumpiness {_share(osc['bucket_variance_share'])} explained by bucket")
    if not spikes and not nonfinite:
        parts.insert(0, "no spike and no NaN/inf found")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "."
