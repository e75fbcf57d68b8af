"""The detect stage: rules that turn metrics and tags into findings, and the causes and verdict over them.

The folders say where each thing lives: ``spikes/`` (the spike rule: kernel, detector, the one driver the audit, the
live loop and ``watch`` call), ``rules/`` (every other rule, one per module, and the registry that builds them),
``evidence/`` (what the rules weigh: suspect samples, grad-norm precedence, bucket jumpiness), ``causes/`` (findings
grouped into causes, the verdict); beside them the protocol (:mod:`~forensics.detect.base`), the parameter
constraints (:mod:`~forensics.detect.params`), the findings model (:mod:`~forensics.detect.findings`) and the
registry of finding kinds (:mod:`~forensics.detect.kinds`).

- :class:`Finding`, :class:`Findings`: the one findings model (``findings.json``).
- :class:`SpikeDetector`, :func:`detect_spikes`, :class:`SpikeDriver`: spikes, level shifts, non-finite steps.
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

from forensics.detect.base import Rule, RunTables
from forensics.detect.evidence.jumpiness import JumpinessDetector, bucket_variance_share, group_offsets
from forensics.detect.evidence.precedence import precedence
from forensics.detect.evidence.suspects import Suspect, attach_suspects, rank_all, rank_suspects
from forensics.detect.findings import FINDINGS_VERSION, Finding, Findings
from forensics.detect.metric_detector import MetricDetector
from forensics.detect.rules.attribution import attribute
from forensics.detect.rules.forgetting import forgetting_signature
from forensics.detect.rules.nonfinite import NonfiniteDetector, nonfinite_findings
from forensics.detect.rules.oscillation import detect_oscillation
from forensics.detect.rules.recurrence import batch_recurrence, recurrence_report, sample_enrichment
from forensics.detect.spikes import SpikeDetector, SpikeDriver, detect_spikes
from forensics.detect.tags import attach_tags
from forensics.stats import detrend, eta_squared, variance_share

__all__ = [
    "FINDINGS_VERSION",
    "Finding",
    "Findings",
    "JumpinessDetector",
    "MetricDetector",
    "NonfiniteDetector",
    "Rule",
    "RunTables",
    "SpikeDetector",
    "SpikeDriver",
    "Suspect",
    "attach_suspects",
    "attach_tags",
    "attribute",
    "batch_recurrence",
    "bucket_variance_share",
    "detect_oscillation",
    "detect_spikes",
    "detrend",
    "eta_squared",
    "forgetting_signature",
    "group_offsets",
    "nonfinite_findings",
    "precedence",
    "rank_all",
    "rank_suspects",
    "recurrence_report",
    "sample_enrichment",
    "variance_share",
]
