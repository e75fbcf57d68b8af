"""Triage on real Trainer runs: how quiet a clean run comes out and how short and right a corrupted one's story is.

For every case of :mod:`fixtures.hf_cases` (real HF ``Trainer`` runs of a tiny GPT-2 on CPU, built once and cached)
it audits the output folder as a new user would (``forensics audit OUTPUT_DIR``, no flag) and prints per case:
causes by severity, the lines of the terminal summary, the steps holding corrupted samples and how many of them a
critical cause covers, how many other causes are at warning or above, where the corrupted samples rank in the
suspects of the causes that hold them, and the harmful samples listed (corrupted / clean). The baseline is the same
table for the tool at the start of the wave (printed by an older checkout of this script).

    python3 bench/bench_triage.py [--cases clean_grouped,static_corrupt,...] [--json out.json] [--write-docs]

``--write-docs`` writes the table into docs/accuracy.md between its markers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _docs import markdown_table, provenance, write_section  # noqa: E402

from fixtures.hf_cases import CASES, hf_case  # noqa: E402
from forensics.cli import main  # noqa: E402


def audit(case_dir: Path, out: Path) -> tuple[dict, list[str]]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        code = main(["audit", str(case_dir), "--no-html", "--json", str(out)])
    if code == 2:
        raise SystemExit(f"audit of {case_dir} failed")
    return json.loads(out.read_text()), buf.getvalue().splitlines()


def measure(name: str) -> dict:
    import pandas as pd

    case = hf_case(name, load_observed=False)
    with tempfile.TemporaryDirectory() as tmp:
        findings, lines = audit(case.out, Path(tmp) / "f.json")
    causes = findings.get("causes") or []
    sev = {s: sum(c["severity"] == s for c in causes) for s in ("critical", "warning", "info")}
    plan = pd.read_parquet(case.out / "plan")
    corrupt = set(case.corrupt_ids)
    steps = sorted(plan[plan["sample_id"].isin(corrupt)]["step"].unique().tolist())
    holding = [c for c in causes if corrupt & set(c.get("suspect_samples") or [])]
    covered = {s for c in causes if c["severity"] == "critical" for s in c.get("steps") or []}
    others = [c for c in causes if c not in holding and c["severity"] in ("critical", "warning")]
    ranks = []
    for c in holding:
        sus = c.get("suspect_samples") or []
        ranks.append(sorted(i + 1 for i, s in enumerate(sus) if s in corrupt))
    harmful = findings.get("harmful_samples")
    return {
        "case": name,
        "causes": len(causes),
        **sev,
        "summary_lines": len(lines),
        "corrupt_steps": len(steps),
        "in_critical": sum(s in covered for s in steps),
        "other_warning_or_above": len(others),
        "ranks": ranks[:4],
        "harmful": None
        if harmful is None
        else [sum(h["sample_id"] in corrupt for h in harmful), sum(h["sample_id"] not in corrupt for h in harmful)],
        "verdict": findings.get("verdict", "")[:160],
    }


#: How the docs name each case of :data:`fixtures.hf_cases.CASES`.
LABELS = {
    "clean_grouped": "clean, HF length-grouped sampler",
    "static_corrupt": "static sorted batches, 12 near-duplicates",
    "accum2_repaired": "grad accumulation 2, poisoned micro-batch re-paired",
    "grouped_longest_corrupt": "length-grouped, the 10 longest corrupted",
    "random_corrupt": "random sampler, 10 of 2,010 corrupted",
    "random_accum2_corrupt": "random sampler, grad accumulation 2",
}


def docs_table(rows: list[dict]) -> str:
    """The docs' table: one row per case, as the audit tells it."""
    body = [
        [
            LABELS.get(r["case"], r["case"]),
            f"{r['critical']} / {r['warning']} / {r['info']}",
            r["summary_lines"],
            f"{r['in_critical']} of {r['corrupt_steps']}" if r["corrupt_steps"] else "-",
            "-" if r["harmful"] is None else f"{r['harmful'][0]} / {r['harmful'][1]}",
        ]
        for r in rows
    ]
    header = [
        "run",
        "causes (critical / warning / info)",
        "summary lines",
        "corrupted steps in a critical cause",
        "harmful samples listed (corrupted / clean)",
    ]
    return f"{provenance()}\n\n{markdown_table(header, body)}"


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    args = ap.parse_args()
    rows = [measure(n) for n in args.cases.split(",") if n]
    cols = (
        "case",
        "causes",
        "critical",
        "warning",
        "info",
        "summary_lines",
        "corrupt_steps",
        "in_critical",
        "other_warning_or_above",
        "harmful",
        "ranks",
    )
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
        print(f"   verdict: {r['verdict']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if args.write_docs:
        write_section("bench_triage", docs_table(rows))


if __name__ == "__main__":
    run()
