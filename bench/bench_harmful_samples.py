"""The run-level harmful-samples estimate: how often what it lists is clean, and what it costs.

- ``--fdr``: every run of the developers' labelled corpus (forensics/datasets/corpus.py, ``--size``) through the
  estimate (the ``samples`` rule on the run's own tables); a listed sample is *clean* when no label names it (the
  corpus labels the samples it corrupted). The listed-clean rate over all listed samples is compared with the
  false-discovery limit asked (q = 0.05): the target is within 2x.
- ``--cost``: a 100K-step case with a 10M-row plan (100 samples per step): its whole audit (reading, tagging, every
  rule) with and without the estimate, in one process; the target is at most 30% more.

    python3 bench/bench_harmful_samples.py [--fdr] [--cost] [--size quick|full]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from forensics.detect.base import RunTables  # noqa: E402
from forensics.detect.rules.harmful_samples import HarmfulSamplesRule  # noqa: E402


def fdr(size: str) -> None:
    from forensics.datasets.corpus import corpus_specs, iter_corpus

    listed = clean = 0
    rows = []
    for run in iter_corpus(corpus_specs(size)):
        labelled = {int(i) for lab in run.labels.spikes for i in lab.sample_ids}
        tables = RunTables(
            metrics=run.metrics,
            loss_key="train/loss",
            analysed=["train/loss"],
            tags=run.tags,
            plan=run.plan,
            samples=run.samples,
        )
        rule = HarmfulSamplesRule()
        rule.detect(tables)
        ids = [r["sample_id"] for r in rule.section_ or []]
        n_clean = sum(i not in labelled for i in ids)
        listed += len(ids)
        clean += n_clean
        rows.append((run.name, len(ids), n_clean, len(labelled)))
    print(f"{'run':<40}{'listed':>8}{'clean':>8}{'labelled':>10}")
    for name, n, c, lab in rows:
        print(f"{name:<40}{n:>8}{c:>8}{lab:>10}")
    rate = clean / listed if listed else 0.0
    print(f"\nlisted {listed}, clean {clean}: listed-clean rate {rate:.3f} (asked q = 0.05; target <= 0.10)")


def cost(n_steps: int = 100_000, per_step: int = 100, n_samples: int = 2_000_000, seed: int = 0) -> None:
    """The whole audit of a case folder (reading, tagging, every rule) with and without the estimate."""
    import tempfile

    import forensics.detect.rules as registry
    from forensics.pipeline.audit import run_audit
    from forensics.schema import open_case

    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        case = Path(tmp)
        steps = np.repeat(np.arange(n_steps, dtype=np.int64), per_step)
        pd.DataFrame({"step": steps, "sample_id": rng.integers(0, n_samples, len(steps)).astype(np.int64)}).to_parquet(
            case / "plan.parquet", index=False
        )
        pd.DataFrame(
            {
                "sample_id": np.arange(n_samples, dtype=np.int64),
                "n_tokens": rng.integers(100, 2000, n_samples).astype(np.int32),
            }
        ).to_parquet(case / "samples.parquet", index=False)
        loss = 2.0 + np.exp(-np.arange(n_steps) / 5000) + 0.02 * rng.standard_normal(n_steps)
        pd.DataFrame(
            {"step": np.arange(n_steps), "loss": loss, "grad_norm": 1.0 + 0.05 * rng.standard_normal(n_steps)}
        ).to_parquet(case / "metrics.parquet")
        (case / "run.toml").write_text("boundaries = [0, 500, 1000, 1500, 2000]\n")
        times = {}
        builtin = registry.BUILTIN_RULES
        for label, rules in (("without", tuple(r for r in builtin if "harmful_samples" not in r)), ("with", builtin)):
            registry.BUILTIN_RULES = rules
            t0 = time.perf_counter()
            run_audit(open_case(case))
            times[label] = time.perf_counter() - t0
        registry.BUILTIN_RULES = builtin
    extra = times["with"] / times["without"] - 1.0
    print(
        f"audit without the estimate {times['without']:.1f} s, with it {times['with']:.1f} s: +{100 * extra:.0f}% "
        f"(target <= 30%) on {n_steps:,} steps and a {n_steps * per_step:,}-row plan"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fdr", action="store_true")
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--size", default="quick")
    args = ap.parse_args()
    if args.fdr or not args.cost:
        fdr(args.size)
    if args.cost or not args.fdr:
        cost()


if __name__ == "__main__":
    main()
