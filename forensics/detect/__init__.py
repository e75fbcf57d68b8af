"""The detect stage: rules that turn metrics and tags into findings, and the causes and verdict over them.

The folders say where each thing lives: ``spikes/`` (the spike rule: kernel, detector, the one driver the audit, the
live loop and ``watch`` call), ``rules/`` (every other rule, one per module, and the registry that builds them),
``evidence/`` (what the rules weigh: suspect samples, grad-norm precedence, bucket jumpiness), ``causes/`` (findings
grouped into causes, the verdict); beside them the protocol (:mod:`~forensics.detect.base`), the parameter
constraints (:mod:`~forensics.detect.params`), the findings model (:mod:`~forensics.detect.findings`) and the
registry of finding kinds (:mod:`~forensics.detect.kinds`).

Public names are imported lazily, so that ``import forensics.detect.findings`` (or a command that never detects)
does not pay for compiling or loading the numba inner loop.

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

Modules that moved keep their old import paths (``forensics.detect.oscillation`` is
``forensics.detect.rules.oscillation``): :data:`MOVED` maps them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

_EXPORTS = {
    "Finding": "findings", "Findings": "findings", "FINDINGS_VERSION": "findings",
    "Rule": "base", "RunTables": "base", "MetricDetector": "metric_detector",
    "SpikeDetector": "spikes", "detect_spikes": "spikes", "SpikeDriver": "spikes",
    "NonfiniteDetector": "rules.nonfinite", "nonfinite_findings": "rules.nonfinite",
    "JumpinessDetector": "evidence.jumpiness", "bucket_variance_share": "evidence.jumpiness",
    "variance_share": "evidence.jumpiness", "group_offsets": "evidence.jumpiness", "eta_squared": "evidence.jumpiness",
    "detrend": "evidence.jumpiness",
    "Suspect": "evidence.suspects", "rank_suspects": "evidence.suspects", "rank_all": "evidence.suspects",
    "attach_suspects": "evidence.suspects",
    "attach_tags": "tags",
    "detect_oscillation": "rules.oscillation", "forgetting_signature": "rules.forgetting",
    "recurrence_report": "rules.recurrence", "batch_recurrence": "rules.recurrence",
    "sample_enrichment": "rules.recurrence", "precedence": "evidence.precedence", "attribute": "rules.attribution",
}

#: Old module paths -> where the module lives now (the README of earlier versions showed the old ones).
MOVED = {
    "oscillation": "rules.oscillation", "forgetting": "rules.forgetting", "recurrence": "rules.recurrence",
    "attribution": "rules.attribution", "precedence": "evidence.precedence", "suspects": "evidence.suspects",
    "jumpiness": "evidence.jumpiness", "nonfinite": "rules.nonfinite", "verdict": "causes.verdict",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forensics.detect' has no attribute {name!r}")
    return getattr(importlib.import_module(f"forensics.detect.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import forensics.detect.oscillation`` gives the module at its new path (the same module object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        short = fullname.removeprefix(f"{__name__}.")
        if fullname.startswith(f"{__name__}.") and short in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(f"{__name__}.{MOVED[spec.name.removeprefix(f'{__name__}.')]}")

    def exec_module(self, module: Any) -> None:
        return None


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
