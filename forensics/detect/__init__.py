"""The detect stage: rules that turn metrics and tags into findings (spikes, oscillation, recurrence, ...).

Public names are imported lazily, so that ``import forensics.detect.findings`` (or a command that never detects)
does not pay for compiling or loading the numba inner loop.

- :class:`Finding`, :class:`Findings`: the one findings model (``findings.json``).
- :class:`SpikeDetector`, :func:`detect_spikes`: spikes, level shifts, non-finite steps, per-bucket baselines.
- :class:`NonfiniteDetector`: NaN/inf steps alone.
- :class:`JumpinessDetector`, :func:`bucket_variance_share`, :func:`variance_share`, :func:`group_offsets`.
- :func:`rank_suspects`, :func:`attach_suspects`: suspect samples of spike batches.
- :func:`attach_tags`: copy bucket, cluster, epoch, ... of each finding's step onto it.
- :func:`detect_oscillation`: periodic swings of the loss and whether the bucket or cluster order drives them.
- :func:`forgetting_signature`: loss against steps since a cluster was last trained (slope with its CI).
- :func:`recurrence_report`, :func:`batch_recurrence`, :func:`sample_enrichment`: spike batches across epochs.
- :func:`precedence`: grad norm before, with or after the loss; lr and tokens/s around a spike.
- :func:`attribute`: each spike's bucket, cluster and samples, most likely first, with evidence and a next step.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Finding": "findings", "Findings": "findings", "FINDINGS_VERSION": "findings",
    "Detector": "base",
    "SpikeDetector": "spikes", "detect_spikes": "spikes",
    "NonfiniteDetector": "nonfinite", "nonfinite_findings": "nonfinite",
    "JumpinessDetector": "jumpiness", "bucket_variance_share": "jumpiness", "variance_share": "jumpiness",
    "group_offsets": "jumpiness", "eta_squared": "jumpiness", "detrend": "jumpiness",
    "Suspect": "suspects", "rank_suspects": "suspects", "rank_all": "suspects", "attach_suspects": "suspects",
    "attach_tags": "_tags",
    "detect_oscillation": "oscillation", "forgetting_signature": "forgetting",
    "recurrence_report": "recurrence", "batch_recurrence": "recurrence", "sample_enrichment": "recurrence",
    "precedence": "precedence", "attribute": "attribution",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forensics.detect' has no attribute {name!r}")
    return getattr(importlib.import_module(f"forensics.detect.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
