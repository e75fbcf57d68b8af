"""The audit on the family of real Trainer runs whose loss moves with each batch's content (fixtures/hf_family.py).

Per member: causes at critical and warning; for a corrupted twin, the steps holding corrupted samples that no cause
at warning or above covers, the other causes at warning or above, and how many of the first cause's top suspects
(as many as corrupted samples) are corrupted; the shares of the detrended loss variance the bucket and the whole
composition explain. Run: ``PYTHONPATH=. python bench/bench_composition_family.py`` (builds the family on first use,
~2 minutes on one core, then cached by content).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pandas as pd

from fixtures.hf_family import family_member, members
from forensics.cli import main

LOUD = ("critical", "warning")


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
    top = first["suspect_samples"][:len(case.corrupt_ids)] if first and case.corrupt_ids else []
    osc = f["oscillation"]
    return {"critical": sum(c["severity"] == "critical" for c in f["causes"]),
            "warning": sum(c["severity"] == "warning" for c in f["causes"]),
            "missed": len(bad - covered), "other_loud": sum(1 for c in loud if not set(c["steps"]) & bad),
            "top_corrupt": f"{len(set(top) & set(case.corrupt_ids))}/{len(case.corrupt_ids)}",
            "bucket_share": osc.get("bucket_variance_share"),
            "composition_share": osc.get("composition_variance_share")}


def main_bench() -> None:
    tmp = Path(tempfile.mkdtemp())
    print(f"{'member':28s} crit warn missed other top  bucket compos")
    for m in members():
        r = measure(family_member(m), tmp / f"{m.name}.json")
        print(f"{m.name:28s} {r['critical']:4d} {r['warning']:4d} {r['missed']:6d} {r['other_loud']:5d} "
              f"{r['top_corrupt'] if m.corrupt else '-':5s} {r['bucket_share'] or 0:.2f}   "
              f"{r['composition_share'] or 0:.2f}")


if __name__ == "__main__":
    main_bench()
