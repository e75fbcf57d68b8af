"""The tagging stage: per-step tags (tokens, padding, length bucket, content cluster, entropy, run lengths).

- :func:`cluster_samples`: a content cluster per sample, from its text or a label column.
- :func:`tag_steps`: the tags table of a plan that has steps.
- :func:`tag_case`: both, plus the step mapping and the boundaries: what ``forensics tag`` and the audit call.
"""

from forensics.plan.optimal_boundaries import resolve_boundaries
from forensics.stats import run_lengths, steps_since_seen
from forensics.tagging.case import TagResult, batch_gap_warnings, tag_case, tag_case_folder, tag_run
from forensics.tagging.clusters import CLUSTER_NAME, ClusterInfo, TextClusterer, cluster_samples
from forensics.tagging.step_tags import TAG_COLUMNS, composition, tag_steps

__all__ = [
    "CLUSTER_NAME",
    "TAG_COLUMNS",
    "ClusterInfo",
    "TagResult",
    "TextClusterer",
    "batch_gap_warnings",
    "cluster_samples",
    "composition",
    "resolve_boundaries",
    "run_lengths",
    "steps_since_seen",
    "tag_case",
    "tag_case_folder",
    "tag_run",
    "tag_steps",
]
