"""Re-run the optimizer steps up to a suspect step from the checkpoint before it, and say what class of cause the
step's spike has (docs/commands/replay.md, ``--rerun``).

From a checkpoint's weights and optimizer state (HF ``checkpoint-N/`` with ``optimizer.pt``, or a ``.pt`` holding
``optimizer``; loaded with ``torch.load(weights_only=True)``), each step of the segment runs as the trainer ran it:
the plan's batch of the step (gradient accumulation: one backward of the summed loss over every micro-batch, divided
by the step's label count as HF Trainer does), clipping at run.toml's ``max_grad_norm``, the logged learning rate of
the step (the checkpoint's own when none is logged), then the optimizer's step. Recorded at each step: the loss, the
pre-clip gradient norm, and per parameter group (:func:`param_group`) the gradient norm, the update/weight ratio,
Adam's share of second moments whose root is below epsilon (where epsilon, not the gradient, sets the step) and the
largest g^2/v (the new gradient against the bias-corrected running average of squares); the largest attention logit
(GPT-2 style ``c_attn`` modules) and the largest log-sum-exp of the output logits.

**The segment** starts at the last checkpoint at least :data:`MIN_LEAD` steps before the suspect (so that the jumps
of the steps before it have a baseline), else the last one at or before it. **Counterfactuals**: the loss of a
same-bucket control batch at the suspect's state (the nearest after the suspect first: the segment's state has not
just trained on it), which is the segment with only the suspect batch replaced (the steps before it are the same, so
its loss at the step is the control batch through that state); the segment run twice from the same
state (determinism); per-sample gradient norms of the suspect batch (micro-batches of one, each sample's mean loss).
The judging: :mod:`forensics.replay.rerun_judge`; the class: :mod:`forensics.replay.cause_class`.

Dropout: the RNG state the trainer saved (``rng_state.pth``) seeds torch's CPU generator for the segment (restored
afterwards: the caller's generators are untouched), but a re-run draws the same masks only when it consumes the
generator exactly as the trainer did; a model with dropout makes a miss inconclusive, and the class says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from forensics.errors import ForensicsError
from forensics.replay import _torch
from forensics.replay.batches import pad_batch
from forensics.replay.checkpoints import Checkpoint, apply_state, load_optimizer_state, load_state_dict, torch_load

#: Steps the segment should hold before the suspect (a baseline for the jumps before it).
MIN_LEAD = 2
#: HF Trainer's rule for the parameters without weight decay (its second optimizer group).
_NO_DECAY = (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
_BLOCK = re.compile(r"(?:^|\.)(?:h|layers|layer|blocks|block)\.(\d+)\.")


def param_group(name: str) -> str:
    """The group a parameter belongs to: ``embeddings``, ``block.N.attn``, ``block.N.mlp``, ``norms`` or ``head``."""
    low = name.lower()
    if re.search(r"(?:^|\.|_)(?:ln|norm|layernorm|rmsnorm)(?:_|\.|\d|$)", low) or "norm." in low:
        return "norms"
    m = _BLOCK.search(low)
    if m:
        return f"block.{m.group(1)}.{'attn' if 'attn' in low or 'attention' in low else 'mlp'}"
    if "emb" in low or re.search(r"(?:^|\.)w[tp]e\.", low):
        return "embeddings"
    return "head"


def _decay_names(module: Any) -> set[str]:
    torch = _torch.torch()
    out = set()
    for name, _ in module.named_parameters():
        owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
        if isinstance(owner, torch.nn.LayerNorm) or any(re.search(p, name.lower()) for p in _NO_DECAY):
            continue
        out.add(name)
    return out


def build_optimizer(module: Any, state: dict[str, Any], origin: Path) -> tuple[Any, list[str]]:
    """AdamW over ``module``'s parameters grouped as the saved state's groups (HF Trainer: weight decay, then none),
    with the saved state loaded; returns it and the parameter names in the state's order."""
    torch = _torch.torch()
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    groups = state.get("param_groups") if isinstance(state, dict) else None
    if not groups or not isinstance(state.get("state"), dict):
        raise ForensicsError(f"checkpoint {origin}: expected an optimizer state_dict with 'state' and 'param_groups'")
    if len(groups) == 1:
        split = [named]
    elif len(groups) == 2:
        decay = _decay_names(module)
        split = [[x for x in named if x[0] in decay], [x for x in named if x[0] not in decay]]
    else:
        raise ForensicsError(
            f"checkpoint {origin}: the optimizer has {len(groups)} parameter groups; the re-run "
            "knows one group or HF Trainer's two (weight decay, none)"
        )
    if [len(g["params"]) for g in groups] != [len(s) for s in split]:
        raise ForensicsError(
            f"checkpoint {origin}: the optimizer's groups hold {[len(g['params']) for g in groups]} "
            f"parameters, the model's {[len(s) for s in split]}"
        )
    flat = [x for s in split for x in s]
    saved = state["state"]
    for i, (n, p) in enumerate(flat):
        entry = saved.get(i, saved.get(str(i)))
        if isinstance(entry, dict) and "exp_avg_sq" not in entry:
            raise ForensicsError(
                f"checkpoint {origin}: the optimizer state holds no Adam moments (exp_avg_sq); the "
                "re-run replays Adam/AdamW only"
            )
        if isinstance(entry, dict) and tuple(entry["exp_avg_sq"].shape) != tuple(p.shape):
            raise ForensicsError(
                f"checkpoint {origin}: optimizer state {i} has shape "
                f"{tuple(entry['exp_avg_sq'].shape)}, parameter {n} {tuple(p.shape)}"
            )
    opt = torch.optim.AdamW([{"params": [p for _, p in s]} for s in split], lr=float(groups[0].get("lr", 1e-3)))
    opt.load_state_dict(state)
    return opt, [n for n, _ in flat]


class _AttentionLogits:
    """The largest pre-softmax attention logit of a forward, from the query/key projections of GPT-2 style attention
    modules (``c_attn`` with ``num_heads``/``head_dim``), causal and padding masks applied; None for other models.

    Cheap by construction (it runs in every layer of every step): the hooks stay for a whole segment and record only
    between :meth:`begin` and :meth:`result`; the mask is the same for every head, so the heads' maximum is taken
    first and masked once, with the mask built once per batch; the scale multiplies the maximum instead of every
    score (the same float: rounding is monotonic for a positive scale); each layer's maximum stays a tensor until
    :meth:`result`."""

    def __init__(self, module: Any) -> None:
        self._mask: Any = None
        self._blocked: Any = None
        self.tops: list[Any] = []
        self.active = False
        self.handles = [
            m.c_attn.register_forward_hook(self._hook(m))
            for m in module.modules()
            if hasattr(m, "c_attn")
            and hasattr(m, "num_heads")
            and hasattr(m, "head_dim")
            and not getattr(m, "is_cross_attention", False)
        ]

    def begin(self) -> None:
        """Record the forwards from now on (until :meth:`result`)."""
        self.tops, self.active = [], True

    def set_mask(self, mask: Any) -> None:
        """The padding mask of the next forward's batch (None: no padding)."""
        self._mask, self._blocked = mask, None

    def _blocked_of(self, t: int, device: Any) -> Any:
        torch = _torch.torch()
        if self._blocked is None or self._blocked.shape[-1] != t:
            ok = torch.ones(t, t, dtype=torch.bool, device=device).tril()
            if self._mask is not None:
                m = self._mask.bool().to(device)
                ok = ok & m[:, :, None] & m[:, None, :]
            self._blocked = ~ok
        return self._blocked

    def _hook(self, attn: Any):
        torch = _torch.torch()
        h, hd = int(attn.num_heads), int(attn.head_dim)
        scale = float(getattr(attn, "scaling", hd**-0.5 if getattr(attn, "scale_attn_weights", True) else 1.0))

        def hook(_mod, _inp, out):
            if not self.active:
                return
            with torch.no_grad():
                qkv = out.detach().float()
                b, t, _ = qkv.shape
                q = qkv[..., : h * hd].view(b, t, h, hd).transpose(1, 2)
                k = qkv[..., h * hd : 2 * h * hd].view(b, t, h, hd).transpose(1, 2)
                scores = q @ k.transpose(-1, -2)
                if scale <= 0:
                    scores = scores * scale
                heads = torch.where(self._blocked_of(t, qkv.device), -math.inf, scores.amax(dim=1))
                self.tops.append(heads.amax() * scale if scale > 0 else heads.amax())

        return hook

    def result(self) -> float | None:
        """The largest logit of the forwards since :meth:`begin` (-inf: every layer's was NaN or masked)."""
        self.active = False
        if not self.handles:
            return None
        value = -math.inf
        for top in _torch.torch().stack(self.tops).tolist() if self.tops else []:
            if top > -math.inf:  # a layer whose maximum is NaN is left out
                value = max(value, top)
        return value

    def close(self) -> None:
        for hd in self.handles:
            hd.remove()


def _norm(tensors: list[Any]) -> float:
    """The L2 norm of several tensors together (as ``clip_grad_norm_`` computes it: the norm of the norms)."""
    if not tensors:
        return 0.0
    torch = _torch.torch()
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t.float()) for t in tensors])))


def _train_step(
    ses: Any,
    opt: Any,
    by_group: dict[str, list[int]],
    attn: _AttentionLogits,
    seqs: list[np.ndarray],
    lr: float | None,
    max_norm: float | None,
) -> dict[str, Any]:
    """One optimizer step on ``seqs`` (module docstring) and its signals; the module is in train mode.

    The signals take few tensor calls per step whatever the parameter count (on a small model a step's time is mostly
    per-call overhead, and the signal pass should cost little more than the bare step): the per-tensor norms come from
    foreach calls over every parameter at once and are combined per group (a group's norm is the norm of its tensors'
    norms, as ``clip_grad_norm_`` combines them); the pre-clip norm is the one the clipping uses; the second-moment
    signals read flat buffers (:func:`_buckets`). Every value is the one the per-tensor arithmetic gives."""
    torch = _torch.torch()
    fwd = ses.fwd
    params = [p for g in opt.param_groups for p in g["params"]]
    opt.zero_grad(set_to_none=True)
    n = sum(max(len(s) - 1, 0) for s in seqs) + (len(seqs) if ses.denom == "labels" else 0)
    total, lse = 0.0, -math.inf
    attn.begin()
    for chunk in fwd._chunks(seqs, fwd.max_tokens):
        ids, mask = pad_batch(chunk, fwd.pad_id, fwd.pad_side)
        ids, mask = ids.to(fwd.device), mask.to(fwd.device)
        attn.set_mask(mask)
        with torch.enable_grad(), fwd._autocast():
            logits = ses.model.logits(ids, mask)
            ok = mask[:, 1:].bool()
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
            summed = (ce * ok).sum()
            (summed / max(n, 1)).backward()
        total += float(summed.detach())
        z = torch.logsumexp(logits.detach().float(), dim=-1).masked_select(mask.bool())
        if z.numel():
            lse = max(lse, float(z.max()))
    grads = [p.grad.detach() if p.grad is not None else torch.zeros_like(p) for p in params]
    grad_norms = torch.stack(torch._foreach_norm([g.float() for g in grads]))
    pre_clip = torch.linalg.vector_norm(grad_norms)
    if max_norm:
        with_grad = [p for p in params if p.grad is not None]
        if all(p.grad.dtype == torch.float32 for p in with_grad):
            torch.nn.utils.clip_grads_with_norm_(with_grad, max_norm, pre_clip)
        else:  # clip_grad_norm_ takes the norm in the gradients' own dtype
            torch.nn.utils.clip_grad_norm_(with_grad, max_norm)
    if lr is not None:
        for g in opt.param_groups:
            g["lr"] = lr
    hyper_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    g2v = _g2_over_v(opt, params, hyper_of, by_group)
    weights = [p.detach() for p in params]
    weight_norms = torch.stack(torch._foreach_norm([w.float() for w in weights]))
    before = torch._foreach_mul(weights, 1.0)
    opt.step()
    torch._foreach_sub_(before, weights)  # minus the update: the same norm
    update_norms = torch.stack(torch._foreach_norm([d.float() for d in before]))
    del before
    below = _below_eps(opt, params, hyper_of, by_group)
    per_tensor = torch.stack([grad_norms, weight_norms, update_norms])
    names_of = list(by_group)
    combined = torch.stack([torch.linalg.vector_norm(per_tensor[:, by_group[g]], dim=1) for g in names_of]).tolist()
    groups: dict[str, dict[str, float]] = {}
    for g, (grad, weight, upd) in zip(names_of, combined, strict=True):
        count, entries = below[g]
        groups[g] = {
            "grad_norm": grad,
            "update_ratio": upd / weight if weight else math.inf,
            "eps_share": count / entries if entries else 0.0,
            "g2_over_v_max": g2v[g],
        }
    return {
        "loss": total / n if n else math.nan,
        "grad_norm": float(pre_clip),
        "groups": groups,
        "max_attention_logit": attn.result(),
        "logsumexp": None if lse == -math.inf else lse,
    }


#: Elements per flat buffer of the second-moment signals: one buffer (a few tensor operations) for a small model,
#: bounded temporaries (two buffers at a time) for a large one.
_BUCKET = 1 << 22


def _moments(
    opt: Any, params: list[Any], hyper_of: dict[int, Any], by_group: dict[str, list[int]], with_grad: bool
) -> list[tuple[Any, ...]]:
    """(group, v, divisor, eps, grad) per parameter with Adam's second moment ``v`` (and a gradient when
    ``with_grad``), in group order; ``v / divisor`` is the bias-corrected v_hat (divisor 1 before any step)."""
    out = []
    for g, idx in by_group.items():
        for i in idx:
            p = params[i]
            st = opt.state.get(p) or {}
            v = st.get("exp_avg_sq")
            if v is None or (with_grad and p.grad is None):
                continue
            hyper = hyper_of[id(p)]
            t = float(st.get("step", 0))
            divisor = max(1.0 - hyper["betas"][1] ** t, 1e-12) if t else 1.0
            out.append((g, v, divisor, hyper["eps"], p.grad))
    return out


def _buckets(moments: list[tuple[Any, ...]]):
    """Runs of ``moments`` that one flat buffer holds: the same dtypes, device, divisor and epsilon (so each run's
    arithmetic is the per-tensor arithmetic), at most :data:`_BUCKET` elements unless one tensor alone is larger.
    Yields (divisor, eps, moments, [(group, start, stop)]), the groups' contiguous slices of the buffer."""
    run: list[tuple[Any, ...]] = []
    kind, size = None, 0
    for m in moments:
        _, v, divisor, eps, grad = m
        k = (v.dtype, v.device, None if grad is None else grad.dtype, divisor, eps)
        if run and (k != kind or size + v.numel() > _BUCKET):
            yield _slices(run)
            run, size = [], 0
        run.append(m)
        kind, size = k, size + v.numel()
    if run:
        yield _slices(run)


def _slices(run: list[tuple[Any, ...]]) -> tuple[float, float, list[tuple[Any, ...]], list[tuple[str, int, int]]]:
    spans: list[tuple[str, int, int]] = []
    at = 0
    for g, v, *_ in run:
        if spans and spans[-1][0] == g:
            spans[-1] = (g, spans[-1][1], at + v.numel())
        else:
            spans.append((g, at, at + v.numel()))
        at += v.numel()
    return run[0][2], run[0][3], run, [x for x in spans if x[2] > x[1]]


def _g2_over_v(
    opt: Any, params: list[Any], hyper_of: dict[int, Any], by_group: dict[str, list[int]]
) -> dict[str, float]:
    """Per group, the largest g^2 / (v_hat + eps^2) of the (clipped) gradient against the bias-corrected second
    moment before the step (0 without one; inf when an entry is not finite: NaN propagates through the maximum)."""
    torch = _torch.torch()
    names, tops = [], []
    for divisor, eps, run, spans in _buckets(_moments(opt, params, hyper_of, by_group, with_grad=True)):
        den = torch.cat([m[1].reshape(-1) for m in run]).div_(divisor).float().add_(eps**2)
        grad = torch.cat([m[4].detach().reshape(-1) for m in run]).float()
        ratio = grad.mul_(grad).div_(den)
        for g, start, stop in spans:
            names.append(g)
            tops.append(ratio[start:stop].amax())
    worst = dict.fromkeys(by_group, 0.0)
    for g, top in zip(names, torch.stack(tops).tolist() if tops else [], strict=True):
        worst[g] = max(worst[g], top) if math.isfinite(top) else math.inf
    return worst


def _below_eps(
    opt: Any, params: list[Any], hyper_of: dict[int, Any], by_group: dict[str, list[int]]
) -> dict[str, tuple[int, int]]:
    """Per group, how many second-moment entries have a bias-corrected root below epsilon, and of how many."""
    torch = _torch.torch()
    names, sizes, counts = [], [], []
    for divisor, eps, run, spans in _buckets(_moments(opt, params, hyper_of, by_group, with_grad=False)):
        below = torch.cat([m[1].reshape(-1) for m in run]).div_(divisor).sqrt_() < eps
        for g, start, stop in spans:
            names.append(g)
            sizes.append(stop - start)
            counts.append(below[start:stop].sum())
    out = dict.fromkeys(by_group, (0, 0))
    for g, size, count in zip(names, sizes, torch.stack(counts).tolist() if counts else [], strict=True):
        out[g] = (out[g][0] + int(count), out[g][1] + size)
    return out


@dataclass
class Segment:
    """One pass over a segment: its step records, and the counterfactuals taken at the suspect's state."""

    records: list[dict[str, Any]] = field(default_factory=list)
    replaced_loss: float | None = None
    per_sample: list[dict[str, Any]] = field(default_factory=list)


def _rng_state(ck: Checkpoint) -> Any:
    """The CPU generator state the trainer saved (HF ``rng_state.pth``), or None when absent or unreadable."""
    path = ck.path / "rng_state.pth" if ck.kind == "hf" else None
    if path is None or not path.exists():
        return None
    try:
        obj = torch_load(path)
    except ForensicsError:  # numpy's state needs a pickled global: the torch state alone is not worth failing for
        return None
    return obj.get("cpu") if isinstance(obj, dict) else None


def run_segment(
    ses: Any,
    ck: Checkpoint,
    steps: list[int],
    suspect: int,
    lrs: dict[int, float],
    max_norm: float | None,
    control: int | None = None,
    per_sample: bool = False,
) -> Segment:
    """The segment ``steps`` from checkpoint ``ck`` (module docstring); ``control``: the step whose batch replaces the
    suspect's in the counterfactual; ``per_sample``: the suspect batch's per-sample gradient norms."""
    torch = _torch.torch()
    from forensics.replay.forward import batch_loss

    opt_state = load_optimizer_state(ck)
    if opt_state is None:
        raise ForensicsError(
            f"--rerun: checkpoint {ck.path} has no optimizer state (optimizer.pt, or 'optimizer' in "
            "the .pt); the optimizer steps cannot be re-run without it"
        )
    module = ses.model.module
    apply_state(module, load_state_dict(ck), ck.path)
    ses._applied = None  # the weights change below: the next replay forward loads its checkpoint again
    opt, names = build_optimizer(module, opt_state, ck.path)
    out = Segment()
    rng = _rng_state(ck)
    by_group: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        by_group.setdefault(param_group(name), []).append(i)
    attn = _AttentionLogits(module)
    with torch.random.fork_rng(devices=[]):
        if rng is not None:
            torch.set_rng_state(rng)
        try:
            module.train(True)  # once for the segment: switching a model's mode walks every module
            for t in steps:
                seqs = [ses.tokens[i] for i in ses.index.samples_of[t]]
                if t == suspect and (control is not None or per_sample):
                    module.train(False)  # the counterfactuals are eval-mode forwards
                    if control is not None:
                        cseqs = [ses.tokens[i] for i in ses.index.samples_of[control]]
                        out.replaced_loss = batch_loss(ses.fwd.losses(cseqs), ses.denom)
                    if per_sample:
                        out.per_sample = per_sample_norms(ses, ses.index.samples_of[t])
                    module.train(True)
                rec = _train_step(ses, opt, by_group, attn, seqs, lrs.get(t), max_norm)
                out.records.append({"step": t} | rec)
        finally:
            attn.close()
            module.train(False)
    for p in module.parameters():
        p.grad = None
    return out


def per_sample_norms(ses: Any, sample_ids: list[int]) -> list[dict[str, Any]]:
    """Each sample's gradient norm as a micro-batch of one (its mean loss), most first.

    ``grad_norm`` leaves the embedding table out (``grad_norm_all`` keeps it): a sample pushes the rows of the tokens
    it holds, so that part grows with how few distinct tokens it repeats (a clean three-token motif outweighed
    corrupted text there) and says more about its vocabulary than about how hard it pulls the network's body."""
    from forensics.replay.forward import accumulate_grad

    module = ses.model.module
    named = list(module.named_parameters())
    out = []
    for i in sample_ids:
        accumulate_grad(ses.fwd, [ses.tokens[i]], ses.denom)
        body = [p.grad for n, p in named if p.grad is not None and param_group(n) != "embeddings"]
        every = [p.grad for _, p in named if p.grad is not None]
        out.append({"sample_id": int(i), "grad_norm": _norm(body), "grad_norm_all": _norm(every)})
        for _, p in named:
            p.grad = None
    return sorted(out, key=lambda d: (-_finite_or_inf(d["grad_norm"]), d["sample_id"]))


def _finite_or_inf(x: float) -> float:
    return math.inf if not math.isfinite(x) else x


def segment_start(checkpoints: list[Checkpoint], step: int) -> Checkpoint | None:
    """The checkpoint the segment of ``step`` starts at (module docstring)."""
    before = [c for c in checkpoints if c.step <= step]
    lead = [c for c in before if c.step <= step - MIN_LEAD]
    return lead[-1] if lead else (before[-1] if before else None)


def rerun_step(ses: Any, suspect: int, exclude: set[int], findings: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``rerun`` object for ``suspect`` (None when no checkpoint is at or before it: nothing to re-run from)."""
    from forensics.schema.keys import grad_norm_column, lr_column

    ck = segment_start(ses.checkpoints, suspect)
    if ck is None:
        ses.warnings.append(f"--rerun: step {suspect} has no checkpoint at or before it; not re-run")
        return None
    steps = list(range(ck.step, suspect + 1))
    missing = [t for t in steps if not ses.index.has(t)]
    if missing:
        raise ForensicsError(
            f"--rerun: the plan has no batch for step(s) {missing[:5]} of the segment {ck.step}-{suspect}"
        )
    metrics = ses.metrics
    lr_key, gn_key = lr_column(metrics.columns), grad_norm_column(metrics.columns)
    lrs = _column(metrics, lr_key)
    if not lr_key:
        ses.warnings.append("--rerun: no learning rate is logged; the segment runs at the checkpoint's own")
    same, _ = ses.pick_controls(suspect, exclude)
    # a control the segment's state has not just trained on: the nearest same-bucket batch after the suspect first
    control = next((c for c in same if c > suspect), same[0] if same else None)
    max_norm = ses.case.config.max_grad_norm
    first = run_segment(ses, ck, steps, suspect, lrs, max_norm, control=control, per_sample=True)
    second = run_segment(ses, ck, steps, suspect, lrs, max_norm)
    from forensics.replay.rerun_judge import judge, logged_numerics, logged_signals

    return judge(
        suspect,
        ck,
        first,
        second,
        ses.logged,
        _column(metrics, gn_key),
        control,
        _has_dropout(ses.model.module),
        findings,
        logged_numerics(findings, suspect),
        logged_signals(findings, suspect),
        case=str(ses.root) if ses.root is not None else None,
    )


def _has_dropout(module: Any) -> bool:
    """Whether a train-mode step draws dropout masks: a dropout module with p > 0 (a config's ``*dropout*`` value
    of a head the model does not have, such as GPT-2's ``summary_first_dropout``, draws none)."""
    torch = _torch.torch()
    return any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules())


def _column(metrics: Any, key: str | None) -> dict[int, float]:
    if not key:
        return {}
    from forensics.schema import STEP

    col = metrics[[STEP, key]].dropna()
    return {int(s): float(v) for s, v in zip(col[STEP].tolist(), col[key].astype(float).tolist(), strict=True)}
