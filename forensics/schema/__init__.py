"""The tables every stage speaks (metrics, samples, plan, step tags), the case folder and the run configuration.

- :mod:`forensics.schema.tables`: column names, lossless casts, validation of the samples and plan tables;
- :mod:`forensics.schema.keys`: the one lookup of the loss, grad-norm, lr and throughput keys;
- :mod:`forensics.schema.config`: ``run.toml`` and its overrides, resolved once;
- :mod:`forensics.schema.case`: the case folder.
"""

from forensics.schema.case import Case, load_plan, load_samples, open_case
from forensics.schema.config import RunConfig, check_boundaries, load_run_toml, parse_boundaries, write_run_toml
from forensics.schema.keys import (
    GRAD_NORM_KEYS,
    LOSS_KEYS,
    LR_KEYS,
    TPS_KEYS,
    find_column,
    find_loss_key,
    grad_norm_column,
    lr_column,
    tokens_per_s_column,
)
from forensics.schema.tables import (
    BATCH_ID,
    CLUSTER,
    DEFAULT_BOUNDARIES,
    EPOCH,
    MAX_BATCH_SIZE,
    MAX_LEN,
    MICRO,
    N_TOKENS,
    PLAN_INT_COLUMNS,
    RANK,
    RANK_SPLITS,
    SAMPLE_ID,
    SOURCE,
    STEP,
    TEXT,
    TIMESTAMP,
    TOKEN_BUDGET,
    TOKEN_IDS,
    Rewind,
    alignment_warnings,
    cast_float,
    cast_int,
    last_write_wins,
    metric_columns,
    read_table,
    validate_plan,
    validate_samples,
)

__all__ = [n for n in dir() if not n.startswith("_")]
