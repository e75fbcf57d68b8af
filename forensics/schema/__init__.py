"""The tables every stage speaks (metrics, samples, plan, step tags), the case folder and the run configuration.

- :mod:`forensics.schema.tables`: column names, lossless casts, validation of the samples and plan tables;
- :mod:`forensics.schema.batches`: which plan columns name a batch (one micro-batch on one rank);
- :mod:`forensics.schema.keys`: the one lookup of the loss, grad-norm, lr and throughput keys;
- :mod:`forensics.schema.flat_keys`: how a value logged under nested keys is named (``opt/lr``);
- :mod:`forensics.schema.config`: ``run.toml`` and its overrides, resolved once;
- :mod:`forensics.schema.case`: the case folder.
"""

from forensics.schema.batches import BATCH_BY_ID, BATCH_BY_STEP, batch_columns, batch_keys
from forensics.schema.case import Case, discover_metrics, load_plan, load_samples, open_case
from forensics.schema.config import (
    OPTIMAL,
    ConfigError,
    RunConfig,
    SourceSpec,
    check_boundaries,
    load_run_toml,
    parse_boundaries,
    parse_set,
    resolve_config,
    with_overrides,
    write_run_toml,
)
from forensics.schema.flat_keys import KEY_SEPARATOR, flatten_keys, nested_key
from forensics.schema.keys import (
    GRAD_NORM_KEYS,
    LOSS_KEYS,
    LR_KEYS,
    TPS_KEYS,
    KeyChoice,
    choose_key,
    find_column,
    find_loss_key,
    grad_norm_column,
    is_training_quantity,
    key_choices_section,
    key_line,
    lr_column,
    tokens_per_s_column,
)
from forensics.schema.tables import (
    ATYPICAL_CLUSTER,
    BATCH,
    BATCH_ID,
    BUCKET,
    CLUSTER,
    CLUSTER_NAME,
    DEFAULT_BOUNDARIES,
    EPOCH,
    MAX_BATCH_SIZE,
    MAX_LEN,
    METRIC_DTYPE,
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
    as_metrics,
    cast_float,
    cast_int,
    check_output,
    hive_parts,
    metric_array,
    metric_columns,
    metric_values,
    metrics_table,
    parse_float_cells,
    read_table,
    validate_plan,
    validate_samples,
    write_metrics,
    written,
)

__all__ = [n for n in dir() if not n.startswith("_")]
