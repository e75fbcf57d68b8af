"""The gate's result: the verdict, every measure behind it, and the JSON of docs/commands/check-plan.md."""

from __future__ import annotations

from dataclasses import dataclass, field

from forensics.plan.composition import EpochCoverage, EpochMix, PairComposition
from forensics.plan.gate.limits import Limits


@dataclass
class GateResult:
    """The gate's verdict and every measure behind it. ``static``: the composition check failed.
    ``epoch_padding_efficiency``: per epoch, the plan's real / padded tokens (with samples; the JSON's
    ``padding_efficiency``)."""

    passed: bool
    static: bool
    epochs: list[int]
    pairs: list[PairComposition]
    first_last: PairComposition
    coverage: list[EpochCoverage]
    threshold: Limits
    epoch_padding_efficiency: list[float] | None = None
    cluster_mix: list[EpochMix] | None = None
    failures: list[str] = field(default_factory=list)
    composition_failures: list[str] = field(default_factory=list)
    coverage_failures: list[str] = field(default_factory=list)
    padding_failures: list[str] = field(default_factory=list)
    failure_kinds: list[str] = field(default_factory=list)
    length_sorted: list[bool] | None = None
    notes: list[str] = field(default_factory=list)
    source: str = ""
    #: per epoch, its samples per batch (distinct samples / batches): "one batch" for a dropped last batch
    epoch_batch_size: list[float] | None = None
    #: the epochs whose missing samples are a dropped last partial batch (fewer than one batch, nothing repeated)
    dropped_last: list[int] = field(default_factory=list)

    @property
    def pair_retention(self) -> list[float]:
        return [p.pair_retention for p in self.pairs]

    @property
    def identical_batches(self) -> list[float]:
        return [p.identical_batches for p in self.pairs]

    @property
    def order_only(self) -> list[bool]:
        return [p.order_only for p in self.pairs]

    def to_json(self) -> dict:
        """The JSON of docs/commands/check-plan.md, plus per-epoch extras and the failure causes."""
        mix = self.cluster_mix
        return {
            "passed": self.passed,
            "static": self.static,
            "pair_retention": self.pair_retention,
            "pair_retention_first_last": self.first_last.pair_retention,
            "identical_batches": self.identical_batches,
            "identical_batches_first_last": self.first_last.identical_batches,
            "order_only": self.order_only,
            "order_only_first_last": self.first_last.order_only,
            "same_order": [p.same_order for p in self.pairs],
            "coverage": [c.to_json() for c in self.coverage],
            "threshold": self.threshold.to_json(),
            "epochs": self.epochs,
            "epoch_pairs": [[p.earlier, p.later] for p in self.pairs],
            "padding_efficiency": self.epoch_padding_efficiency,
            "cluster_entropy": [m.cluster_entropy for m in mix] if mix else None,
            "longest_dominant_run": [
                {"epoch": m.epoch, "steps": m.longest_dominant_run, "cluster": m.dominant_cluster} for m in mix
            ]
            if mix
            else None,
            "failures": self.failures,
            "failure_kinds": self.failure_kinds,
            "length_sorted": self.length_sorted,
            "notes": self.notes,
            "dropped_last": self.dropped_last,
            "source": self.source,
        }
