"""Bench: the gate's classification table at 2K, 12K, 200K and 1M samples, with the real samplers.

Every row is a sampler or builder run for 2 epochs on the same samples and judged by ``check_plan(plan, samples)``,
as a user's recorded plan would be (the token budget and batch size are read off the plan). The rows, and what the
gate must say about each:

- pass: HF's ``LengthGroupedSampler`` with a fresh generator seed per epoch (``transformers.trainer_pt_utils``: the
  Trainer's ``group_by_length``; mega-batches of 50 batches, fewer when the dataset would hold under 4), lhotse's
  ``DynamicBucketingSampler`` with ``set_epoch`` (a ``CutSet`` of in-memory cuts whose durations are the lengths),
  bucketed shuffles with 6, 16 and 64 quantile buckets, a random shuffle;
- fail: a plan built once and reordered (``static_sorted``), a builder re-seeded identically each epoch, lhotse
  without ``set_epoch``, HF's sampler with one fixed generator seed, shuffle-then-sort where ties are few (the
  lognormal and bimodal mixes), and HF's algorithm with one mega-batch covering the whole dataset, which *is*
  shuffle-then-sort. Where ties are many (lengths in multiples of 64) a sort regroups the ties like a bucketed shuffle
  with one bucket per length; the table prints its verdict and the gate states why (a note or the failure's words).

Batch shapes per size (``SHAPES``): the packers use the story's token budget 16,384 with ``max_batch_size`` B, HF a
fixed batch of B, lhotse ``max_duration`` 16,384 (a sum of durations, lhotse's own measure) and ``max_cuts`` B; B is
8 at 2K (HF's default per-device batch), 16 at 12K, 64 at 200K and 1M (the story's). A length grouping can only
regroup when its groups hold several batches: 64 buckets of 2K samples hold 31 samples each, so B = 64 would put each
short bucket in one batch that repeats every epoch (the gate fails that, rightly, on identical batches).

    python3 bench/bench_gate_classification.py                       # 2K, 12K, 200K, 1M: prints a markdown table
    python3 bench/bench_gate_classification.py --sizes 2000 12000    # a quick subset
    python3 bench/bench_gate_classification.py --ratios              # retention as a multiple of the reference

Needs ``transformers`` and ``lhotse`` (``pip install -e '.[test]'``); a row whose package is missing is skipped and
said so. The 1M lhotse rows iterate its sampler 3 times (about 2 minutes each on one core).

What it measured is docs/commands/check-plan.md: the classification table, and with ``--ratios`` the table of
retention as a multiple of the reference, which is what the gate's constants (``MULTIPLE``, ``CAP``, the two floors
of :mod:`forensics.plan.gate.limits`) were chosen from. A change to the limits reruns both and updates that page.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_pair_retention import lengths_of  # noqa: E402

from forensics.plan.builders import (  # noqa: E402
    bucketed_shuffle,
    capped_lengths,
    random_shuffle,
    shuffle_then_sort,
    static_sorted,
)
from forensics.plan.gate import GateResult, check_plan  # noqa: E402
from forensics.plan.step_mapping import batches_to_plan  # noqa: E402

TOKEN_BUDGET = 16_384
SHAPES = {2_000: 8, 12_000: 16, 200_000: 64, 1_000_000: 64}
"""Batch size B per dataset size (see the module docstring)."""
MIXES = ("lognormal", "bimodal", "ties64")
MIX_NAMES = {"lognormal": "lognormal", "bimodal": "bimodal QA/code", "ties64": "multiples of 64"}
EPOCHS = 2

Epochs = list[list[list[int]]]  # per epoch, the batches as lists of sample ids


def batch_size_for(n: int) -> int:
    """B for a dataset of ``n`` samples: the shape of the nearest size in ``SHAPES`` below or at ``n``."""
    keys = sorted(SHAPES)
    return SHAPES[max([k for k in keys if k <= n], default=keys[0])]


def make_samples(mix: str, n: int) -> pd.DataFrame:
    """``n`` samples of a length mix (``bench_pair_retention.lengths_of``), seeded by ``n``."""
    return pd.DataFrame(
        {
            "sample_id": np.arange(n, dtype=np.int64),
            "n_tokens": lengths_of(mix, n, np.random.default_rng(n)).astype(np.int32),
        }
    )


# --- the samplers --------------------------------------------------------------------------------------------------
def _by_builder(fn: Callable, samples: pd.DataFrame, b: int, seed: int, epoch_of=lambda e: e) -> Epochs:
    return [fn(samples, epoch_of(e), seed, token_budget=TOKEN_BUDGET, max_batch_size=b) for e in range(EPOCHS)]


def quantile_boundaries(samples: pd.DataFrame, k: int) -> list[int]:
    """``k`` buckets of (about) equal counts; equal lengths never straddle a boundary, so ties can merge buckets."""
    q = np.unique(np.quantile(capped_lengths(samples), np.linspace(0, 1, k + 1)).astype(int))
    return [0] + [int(x) for x in q[1:-1] if x > 0] + [8192]


def hf_length_grouped(
    samples: pd.DataFrame, b: int, seed: int, fixed: bool = False, mega_batch_mult: int | None = None
) -> Epochs:
    """HF's ``LengthGroupedSampler`` (or ``get_length_grouped_indices`` with ``mega_batch_mult``), its indices cut
    into batches of ``b`` as the DataLoader does. ``fixed``: the same generator seed every epoch; else a generator
    seeded per epoch (what the Trainer's global torch RNG gives: a fresh permutation each epoch)."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices

    lengths = capped_lengths(samples).tolist()
    ids = samples["sample_id"].to_numpy(np.int64)
    out = []
    for epoch in range(EPOCHS):
        gen = torch.Generator().manual_seed(seed if fixed else seed * 1_000_003 + epoch)
        if mega_batch_mult is None:
            idx = np.fromiter(iter(LengthGroupedSampler(b, lengths=lengths, generator=gen)), dtype=np.int64)
        else:
            idx = np.asarray(get_length_grouped_indices(lengths, b, mega_batch_mult, generator=gen), dtype=np.int64)
        out.append([ids[idx[i : i + b]].tolist() for i in range(0, len(idx), b)])
    return out


_LHOTSE: dict[tuple, dict[str, Epochs]] = {}


def lhotse_runs(samples: pd.DataFrame, b: int, seed: int) -> dict[str, Epochs]:
    """lhotse's ``DynamicBucketingSampler`` (shuffle, 10 buckets, ``max_duration`` = the token budget, ``max_cuts``
    B) over in-memory cuts with durations = lengths. One sampler object: iterated once (epoch 0), again without
    ``set_epoch`` (what a loop that forgets it gets), then after ``set_epoch(1)``."""
    key = (id(samples), len(samples), b, seed)
    if key in _LHOTSE:
        return _LHOTSE[key]
    from lhotse import CutSet, MonoCut
    from lhotse.dataset.sampling import DynamicBucketingSampler

    lens = capped_lengths(samples).tolist()
    ids = samples["sample_id"].to_numpy(np.int64).tolist()
    cuts = CutSet.from_cuts(MonoCut(id=str(i), start=0.0, duration=float(n), channel=0) for i, n in zip(ids, lens))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lhotse warns that the cuts have no recordings: they need none here
        sampler = DynamicBucketingSampler(
            cuts, max_duration=float(TOKEN_BUDGET), max_cuts=b, num_buckets=10, shuffle=True, seed=seed
        )

        def epoch() -> list[list[int]]:
            return [[int(c.id) for c in batch] for batch in sampler]

        first = epoch()
        again = epoch()
        sampler.set_epoch(1)
        second = epoch()
    _LHOTSE.clear()  # one sample set at a time: 1M cuts are big
    _LHOTSE[key] = {"set_epoch": [first, second], "no_set_epoch": [first, again]}
    return _LHOTSE[key]


@dataclass(frozen=True)
class Row:
    """One sampler of the table: ``run(samples, B, seed)`` gives its epochs; ``expect`` the verdict the gate must give
    ("pass"/"fail"; "ties" where it depends on how many samples share each length: fail on the lognormal and
    bimodal mixes, stated either way on multiples of 64); ``kind`` the failure kind the gate must name."""

    name: str
    run: Callable[[pd.DataFrame, int, int], Epochs]
    expect: str
    kind: str | None = None
    needs: str | None = None


def _reseeded(samples: pd.DataFrame, b: int, seed: int) -> Epochs:
    return _by_builder(bucketed_shuffle, samples, b, seed, epoch_of=lambda e: 0)


ROWS = [
    Row(
        "HF LengthGroupedSampler, seeded per epoch",
        lambda s, b, seed: hf_length_grouped(s, b, seed),
        "pass",
        needs="transformers",
    ),
    Row(
        "lhotse DynamicBucketingSampler + set_epoch",
        lambda s, b, seed: lhotse_runs(s, b, seed)["set_epoch"],
        "pass",
        needs="lhotse",
    ),
    *(
        Row(
            f"bucketed shuffle, {k} buckets",
            lambda s, b, seed, k=k: [
                bucketed_shuffle(
                    s, e, seed, boundaries=quantile_boundaries(s, k), token_budget=TOKEN_BUDGET, max_batch_size=b
                )
                for e in range(EPOCHS)
            ],
            "pass",
        )
        for k in (6, 16, 64)
    ),
    Row("random shuffle", lambda s, b, seed: _by_builder(random_shuffle, s, b, seed), "pass"),
    Row(
        "static_sorted: built once, reordered",
        lambda s, b, seed: _by_builder(static_sorted, s, b, seed),
        "fail",
        "built_once",
    ),
    Row("builder re-seeded identically", _reseeded, "fail", "reseeded"),
    Row(
        "lhotse without set_epoch",
        lambda s, b, seed: lhotse_runs(s, b, seed)["no_set_epoch"],
        "fail",
        "reseeded",
        needs="lhotse",
    ),
    Row(
        "HF sampler, one fixed generator seed",
        lambda s, b, seed: hf_length_grouped(s, b, seed, fixed=True),
        "fail",
        "reseeded",
        needs="transformers",
    ),
    Row(
        "shuffle then sort", lambda s, b, seed: _by_builder(shuffle_then_sort, s, b, seed), "ties", "shuffle_then_sort"
    ),
    Row(
        "HF algorithm, one mega-batch = whole dataset",
        lambda s, b, seed: hf_length_grouped(s, b, seed, mega_batch_mult=-(-len(s) // b)),
        "ties",
        "shuffle_then_sort",
        needs="transformers",
    ),
]


def available(row: Row) -> bool:
    if row.needs is None:
        return True
    try:
        __import__(row.needs)
    except ImportError:
        return False
    return True


def judge(row: Row, samples: pd.DataFrame, b: int, seed: int = 1) -> GateResult:
    """Run a row's sampler on ``samples`` and judge its plan as a recorded plan: ``check_plan(plan, samples)``."""
    plan = batches_to_plan(row.run(samples, b, seed))
    return check_plan(plan, samples, source=row.name)


def expected(row: Row, mix: str) -> str | None:
    """The verdict the gate must give on ``mix`` (None: stated, not prescribed)."""
    if row.expect == "ties":
        return None if mix == "ties64" else "fail"
    return row.expect


# --- the table ------------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=sorted(SHAPES))
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=MIXES)
    ap.add_argument("--rows", nargs="+", help="only rows whose name contains one of these words")
    ap.add_argument("--skip", nargs="+", help="leave out rows whose name contains one of these words")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ratios", action="store_true", help="add retention / reference to each row")
    args = ap.parse_args()
    rows = [
        r
        for r in ROWS
        if (not args.rows or any(w.lower() in r.name.lower() for w in args.rows))
        and not any(w.lower() in r.name.lower() for w in args.skip or [])
    ]
    skipped = [r.name for r in rows if not available(r)]
    rows = [r for r in rows if available(r)]
    print(
        "| sampler | mix | samples | batch size | pair retention | limit | verdict |"
        + (" x reference |" if args.ratios else "")
    )
    print("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if args.ratios else ""))
    mismatches = []
    for n in args.sizes:
        b = batch_size_for(n)
        for mix in args.mixes:
            samples = make_samples(mix, n)
            for row in rows:
                t = time.perf_counter()
                r = judge(row, samples, b, args.seed)
                secs = time.perf_counter() - t
                verdict = "pass" if r.passed else f"fail ({', '.join(r.failure_kinds)})"
                want = expected(row, mix)
                if want and (want == "pass") != r.passed or (want == "fail" and row.kind not in r.failure_kinds):
                    mismatches.append(f"{row.name} / {mix} / {n}: {verdict}, expected {want} ({row.kind})")
                if r.notes:
                    verdict += " (sorted as a whole; ties regrouped)"
                ratio = (
                    f" {r.pair_retention[0] / r.threshold.reference_pair_retention:.2f} |"
                    if args.ratios and r.threshold.reference_pair_retention
                    else (" |" if args.ratios else "")
                )
                print(
                    f"| {row.name} | {MIX_NAMES[mix]} | {n:,} | {b} | {r.pair_retention[0]:.5f} | "
                    f"{r.threshold.pair_retention:.5f} | {verdict} |{ratio}",
                    flush=True,
                )
                print(f"  {row.name} {mix} {n}: {secs:.1f} s", file=sys.stderr, flush=True)
            _LHOTSE.clear()
    if skipped:
        print(f"\nskipped (package not installed): {', '.join(skipped)}")
    if mismatches:
        print("\nrows whose verdict differs from the expected one:\n" + "\n".join(f"- {m}" for m in mismatches))
        sys.exit(1)


if __name__ == "__main__":
    main()
