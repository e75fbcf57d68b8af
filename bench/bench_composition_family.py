"""The audit on the family of real Trainer runs whose loss moves with each batch's content (fixtures/hf_family.py).

Per member: causes at critical and warning; for a corrupted twin, the steps holding corrupted samples that no cause
at warning or above covers, the other causes at warning or above, and how many of the first cause's top suspects
(as many as corrupted samples) are corrupted; the shares of the detrended loss variance the bucket and the whole
composition explain; then the worst member's figures. Run: ``PYTHONPATH=. python bench/bench_composition_family.py``
(builds the family on first use, ~3 minutes on one core, then cached by content). ``--mix cut`` measures only the
members whose fitted buckets cut through a content type; ``--no-composition`` has the spike detector judge every
step against its length bucket's baseline alone, as it did before it judged steps against their composition (the
false alarms it is measured against; the harmful-samples estimate keeps the composition among its covariates);
``--write-docs`` measures both and writes the worst member of each mix into docs/accuracy.md between its markers.
``--seeds`` and ``--cut-seeds`` build the family over other seeds (members the tests never saw: their clean rows,
noise rows, content mix and sampler order are all drawn from the seed); ``--write-docs`` also measures the members of
:data:`HELD_OUT_SEEDS` and :data:`HELD_OUT_CUT_SEEDS` (their steps judged against their composition), so the page
says how the figures hold on runs nothing was tuned on.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
from pathlib import Path
from unittest import mock

import pandas as pd
from _docs import provenance, write_section

from fixtures.hf_family import CUT_SEEDS, SEEDS, family_member, members
from forensics.cli import main

LOUD = ("critical", "warning")
#: The seeds of the members no test reads: the figures of a family nothing was tuned on.
HELD_OUT_SEEDS, HELD_OUT_CUT_SEEDS = (3, 4, 5, 6, 7, 8, 9), (3, 4, 5, 6)


def measure(case, out: Path) -> dict:
    """One member's figures (module docstring)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(["audit", str(case.out), "--no-html", "--json", str(out)])
    f = json.loads(out.read_text())
    loud = [c for c in f["causes"] if c["severity"] in LOUD]
    plan = pd.read_parquet(case.out / "plan")
    bad = set(plan.loc[plan["sample_id"].isin(case.corrupt_ids), "step"].tolist())
    covered = set().union(*(set(c["steps"]) for c in loud)) if loud else set()
    first = next((c for c in loud if c["suspect_samples"]), None)
    top = first["suspect_samples"][: len(case.corrupt_ids)] if first and case.corrupt_ids else []
    osc = f["oscillation"]
    return {
        "critical": sum(c["severity"] == "critical" for c in f["causes"]),
        "warning": sum(c["severity"] == "warning" for c in f["causes"]),
        "missed": len(bad - covered),
        "other_loud": sum(1 for c in loud if not set(c["steps"]) & bad),
        "top_corrupt": f"{len(set(top) & set(case.corrupt_ids))}/{len(case.corrupt_ids)}",
        "bucket_share": osc.get("bucket_variance_share"),
        "composition_share": osc.get("composition_variance_share"),
    }


def worst(rows: list[tuple[str, bool, dict]]) -> dict:
    """The worst figure of each kind over the members: critical and warning causes of a clean member; missed
    corrupted steps, other causes at warning or above and the fewest corrupted samples among the top suspects of a
    corrupted twin (each with the member it came from)."""
    clean = [(n, r) for n, c, r in rows if not c]
    twins = [(n, r) for n, c, r in rows if c]
    out = {}
    for key, pool in (("critical", clean), ("warning", clean), ("missed", twins), ("other_loud", twins)):
        if pool:
            name, r = max(pool, key=lambda x: x[1][key])
            out[key] = (r[key], name)
    if twins:
        name, r = min(twins, key=lambda x: int(x[1]["top_corrupt"].split("/")[0]))
        out["top_corrupt"] = (r["top_corrupt"], name)
    return out


def short_of_targets(rows: list[tuple[str, bool, dict]]) -> list[str]:
    """The members short of the targets (a clean run: no critical cause, at most 2 warnings; a twin: every corrupted
    step in a loud cause, at most 2 other loud causes, its corrupted samples first), each with what it missed."""
    out = []
    for name, corrupt, r in rows:
        if corrupt:
            got, n = (int(v) for v in r["top_corrupt"].split("/"))
            missed = [
                f"{r['missed']} corrupted steps missed" if r["missed"] else "",
                f"{r['other_loud']} other loud causes" if r["other_loud"] > 2 else "",
                f"{got}/{n} corrupted first" if got < n else "",
            ]
        else:
            missed = [
                f"{r['critical']} critical" if r["critical"] else "",
                f"{r['warning']} warnings" if r["warning"] > 2 else "",
            ]
        if any(missed):
            out.append(f"{name} ({', '.join(m for m in missed if m)})")
    return out


def docs_table(figures: dict[str, dict], n_members: int, short: list[str] | None = None) -> str:
    """The docs' table: per setting (composition off / on), the worst member's figures."""
    lines = [
        f"The worst member of each mix, {n_members} runs in all. {provenance()}",
        "",
        "| steps judged against | clean: most critical causes | clean: most warnings | twin: most corrupted "
        "steps missed | twin: most other loud causes | twin: fewest corrupted in top 12 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, w in figures.items():
        cells = [
            f"{w[k][0]} ({w[k][1]})" if k in w else "-"
            for k in ("critical", "warning", "missed", "other_loud", "top_corrupt")
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if short is not None:
        lines += ["", f"Short of the targets, steps judged against their composition: {'; '.join(short) or 'none'}."]
    return "\n".join(lines)


def run_family(chosen: list, composition: bool, tmp: Path) -> list[tuple[str, bool, dict]]:
    """Audit each member (its steps judged against their composition or, when not ``composition``, their bucket)
    and print its row."""
    from forensics.detect.spikes.driver import SpikeDriver

    off = mock.patch.object(SpikeDriver, "_composed", lambda self, metric, det: False)
    rows = []
    print(f"steps judged against their {'composition' if composition else 'length bucket alone'}")
    print(f"{'member':38s} crit warn missed other top  bucket compos")
    for m in chosen:
        with off if not composition else contextlib.nullcontext():
            r = measure(family_member(m), tmp / f"{m.name}.json")
        rows.append((m.name, m.corrupt, r))
        print(
            f"{m.name:38s} {r['critical']:4d} {r['warning']:4d} {r['missed']:6d} {r['other_loud']:5d} "
            f"{r['top_corrupt'] if m.corrupt else '-':5s} {r['bucket_share'] or 0:.2f}   "
            f"{r['composition_share'] or 0:.2f}"
        )
    w = worst(rows)
    print("worst: " + ", ".join(f"{k} {v} ({name})" for k, (v, name) in w.items()))
    return rows


def main_bench(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mix", choices=("all", "overlap", "cut"), default="all")
    ap.add_argument("--no-composition", action="store_true", help="only the bucket-baseline setting")
    ap.add_argument("--write-docs", action="store_true", help="both settings, written into docs/accuracy.md")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS), help="the overlap mix's seeds")
    ap.add_argument("--cut-seeds", type=int, nargs="+", default=list(CUT_SEEDS), help="the cut mix's seeds")
    args = ap.parse_args(argv)
    if args.write_docs and (args.seeds != list(SEEDS) or args.cut_seeds != list(CUT_SEEDS)):
        ap.error("--write-docs writes the figures of the tested family: leave --seeds and --cut-seeds out")
    family = members(tuple(args.seeds), tuple(args.cut_seeds))
    chosen = [m for m in family if args.mix in ("all", m.mix)]
    tmp = Path(tempfile.mkdtemp())
    settings = [False, True] if args.write_docs else [not args.no_composition]
    figures = {}
    mix_of = {m.name: m.mix for m in chosen}
    for composition in settings:
        rows = run_family(chosen, composition, tmp)
        label = "its composition" if composition else "its length bucket alone"
        for mix in dict.fromkeys(mix_of.values()):
            of_mix = [r for r in rows if mix_of[r[0]] == mix]
            figures[f"{label} ({mix} mix, {len(of_mix)} runs)"] = worst(of_mix)
    n_runs = len(chosen)
    if args.write_docs:
        short = short_of_targets(rows)  # the last setting's rows: the composition's
        held_out = [m for m in members(HELD_OUT_SEEDS, HELD_OUT_CUT_SEEDS) if args.mix in ("all", m.mix)]
        rows = run_family(held_out, True, tmp)
        short += short_of_targets(rows)
        for mix in dict.fromkeys(m.mix for m in held_out):
            of_mix = [r for r, m in zip(rows, held_out) if m.mix == mix]
            seeds = HELD_OUT_SEEDS if mix == "overlap" else HELD_OUT_CUT_SEEDS
            named = ", ".join(map(str, seeds))
            figures[f"its composition, seeds {named} that no test reads ({mix} mix, {len(of_mix)} runs)"] = worst(
                of_mix
            )
        n_runs += len(held_out)
        write_section("bench_composition_family", docs_table(figures, n_runs, short))


if __name__ == "__main__":
    main_bench()
