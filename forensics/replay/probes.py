"""Probes that go past the loss: determinism of the forward, the gradient norm, and a one-step update probe.

- determinism: the suspect batch forwarded again (and on a second device or dtype when given); the largest per-sample
  loss difference. Reproduction means nothing when the same forward disagrees with itself (dropout left on, a
  nondeterministic kernel), so that verdict comes first.
- gradient: the gradient norm of the suspect batch against same-bucket and other-bucket controls.
- update probe: with the checkpoint's optimizer state, one update on the suspect batch, and the change of loss on a
  probe set per cluster; against one update on a mixed batch of the same token count. A homogeneous batch that is
  harmless on its own can still pull the model away from the other clusters (the forgetting the story worries about).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from forensics.replay import _torch
from forensics.replay.forward import Forwarder, accumulate_grad, batch_loss

#: Same device and dtype: a deterministic forward agrees to float32 rounding of the summed losses.
TOL_SAME = 1e-5
#: Another dtype or device: bf16 autocast moves losses by up to ~1%.
TOL_OTHER_REL = 0.02
PROBE_PER_CLUSTER = 16


def determinism(
    fwd: Forwarder, seqs: list[np.ndarray], first: list, other: Forwarder | None, seed: int | None = None
) -> dict[str, Any]:
    """``{max_abs_diff, equal}`` of a second forward (the same dropout ``seed`` in train mode), and ``second`` with
    the other device/dtype when given."""
    again = fwd.losses(seqs, seed)
    diff = max((abs(a.mean - b.mean) for a, b in zip(first, again, strict=False) if a.count), default=0.0)
    out: dict[str, Any] = {"max_abs_diff": diff, "equal": bool(diff <= TOL_SAME * max(1.0, batch_loss(first)))}
    if other is not None:
        theirs = other.losses(seqs, seed)
        d2 = max((abs(a.mean - b.mean) for a, b in zip(first, theirs, strict=False) if a.count), default=0.0)
        out["second"] = {
            "device": other.device,
            "dtype": other.dtype,
            "max_abs_diff": d2,
            "equal": bool(d2 <= TOL_OTHER_REL * max(1.0, batch_loss(first))),
        }
    return out


def probe_sets(samples: pd.DataFrame | None, exclude: set[int], seed: int = 0) -> dict[str, list[int]]:
    """Up to :data:`PROBE_PER_CLUSTER` sample ids per cluster (``cluster`` column, else ``source``), seeded."""
    if samples is None:
        return {}
    col = "cluster" if "cluster" in samples.columns else ("source" if "source" in samples.columns else None)
    if col is None:
        return {}
    rng = np.random.default_rng(seed)
    out = {}
    for name, g in samples.groupby(col, sort=True):
        ids = [int(i) for i in g["sample_id"] if int(i) not in exclude]
        if ids:
            out[str(name)] = sorted(
                int(i) for i in rng.choice(ids, size=min(PROBE_PER_CLUSTER, len(ids)), replace=False)
            )
    return out


def mixed_batch(samples: pd.DataFrame, clusters_col: str, n_tokens: int, exclude: set[int], seed: int = 0) -> list[int]:
    """Samples drawn round-robin across clusters until they hold ``n_tokens`` tokens (the same size as the suspect)."""
    rng = np.random.default_rng(seed + 1)
    pools = [
        list(rng.permutation([int(i) for i in g["sample_id"] if int(i) not in exclude]))
        for _, g in samples.groupby(clusters_col, sort=True)
    ]
    lengths = dict(zip(samples["sample_id"].tolist(), samples["n_tokens"].tolist(), strict=False))
    out, total, k = [], 0, 0
    while total < n_tokens and any(pools):
        pool = pools[k % len(pools)]
        k += 1
        if pool:
            sid = int(pool.pop())
            out.append(sid)
            total += int(lengths[sid])
    return out


def _param_groups(module: Any, groups: list[dict]) -> list[list[Any]] | None:
    """The parameters of each saved group, in the order the run built them: one group over
    ``module.parameters()`` (a plain loop), or HF Trainer's two (weight decay, then none)."""
    params = [p for p in module.parameters() if p.requires_grad]
    sizes = [len(g.get("params", [])) for g in groups]
    if sizes == [len(params)]:
        return [params]
    if len(groups) == 2 and hasattr(module, "config"):
        tf = _torch.transformers()
        decay = set(tf.Trainer.get_decay_parameter_names(None, module))  # uses no Trainer state
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        split = [[p for n, p in named if n in decay], [p for n, p in named if n not in decay]]
        if [len(x) for x in split] == sizes:
            return split
    return None


def build_optimizer(module: Any, state: dict[str, Any]) -> Any | None:
    """The run's optimizer rebuilt from its saved state (AdamW/Adam or SGD, parameter groups as
    :func:`_param_groups` finds them); ``None`` when the state does not fit the model that way."""
    torch = _torch.torch()
    groups = state.get("param_groups") or []
    split = _param_groups(module, groups) if groups else None
    if split is None:
        return None
    g = groups[0]
    fresh = [{"params": ps} for ps in split]
    if "betas" in g:
        opt = torch.optim.AdamW(fresh, lr=g.get("lr", 1e-3))
    elif "momentum" in g:
        opt = torch.optim.SGD(fresh, lr=g.get("lr", 1e-3))
    else:
        return None
    flat = [p for ps in split for p in ps]
    for idx, st in (state.get("state") or {}).items():
        ref = st.get("exp_avg", st.get("momentum_buffer"))
        if ref is not None and (int(idx) >= len(flat) or tuple(ref.shape) != tuple(flat[int(idx)].shape)):
            return None
    try:
        opt.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError):
        return None
    return opt


def update_probe(
    fwd: Forwarder,
    opt_state: dict[str, Any],
    restore: Any,
    suspect: list[np.ndarray],
    mixed: list[np.ndarray],
    probes: dict[str, list[np.ndarray]],
    denominator: str,
) -> dict | None:
    """Per-cluster probe loss change after one update on ``suspect`` and, from the same state, on ``mixed``.

    ``restore()`` puts the checkpoint's weights back (called after each update).
    """
    module = fwd.model.module

    def probe_losses() -> dict[str, float]:
        return {c: batch_loss(fwd.losses(seqs), denominator) for c, seqs in probes.items()}

    before = probe_losses()
    out = {}
    for name, batch in (("per_cluster", suspect), ("mixed", mixed)):
        opt = build_optimizer(module, opt_state)
        if opt is None:
            return None
        was_training = module.training
        accumulate_grad(fwd, batch, denominator)
        opt.step()
        module.train(was_training)
        after = probe_losses()
        out[name] = {c: after[c] - before[c] for c in before}
        restore()
    out["before"] = before
    return out


def composition_harm(probe: dict, batch_clusters: set[str]) -> tuple[float, float, float] | None:
    """Mean probe-loss change on the clusters the batch does not hold after the suspect's update and after the mixed
    one, and their mean loss before either (the yardstick of a relative change)."""
    others = [c for c in probe["per_cluster"] if c not in batch_clusters]
    if not others:
        return None
    h = float(np.mean([probe["per_cluster"][c] for c in others]))
    m = float(np.mean([probe["mixed"][c] for c in others]))
    b = float(np.mean([probe["before"][c] for c in others])) if "before" in probe else math.nan
    return (h, m, b) if math.isfinite(h) and math.isfinite(m) and math.isfinite(b) and b > 0 else None
