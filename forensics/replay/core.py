"""``replay_case``: plan every forward the experiments need, run them checkpoint by checkpoint, decide, write.

For each suspect step s (DESIGN.md ``replay.json``):
1. reproduce: s's batch at the latest checkpoint c <= s against the logged loss, and s-1's and s+1's batches (each at
   its own latest checkpoint) against the same logged value, which is what exposes a misaligned join;
2. earlier: s's batch at up to ``earlier`` checkpoints before c;
3. controls: ``controls`` K steps of s's dominant bucket and K of other buckets (the nearest in step, never sharing
   a sample with s) at c, and the same-bucket ones at each earlier checkpoint; z against the same-bucket ones;
4. samples: per-sample losses, most suspect first, the batch's loss without each (leave-one-out) and without all
   samples above the controls' per-sample range, and each sample's signals.
Each checkpoint is loaded once and every batch it must see runs then (a progress bar on stderr when asked).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from forensics.errors import ForensicsError
from forensics.plan.optimal_boundaries import resolve_boundaries
from forensics.plan.step_mapping import assign_steps
from forensics.replay import _torch
from forensics.replay.batches import StepIndex, TokenStore, read_tokens
from forensics.replay.checkpoints import (
    Checkpoint,
    apply_state,
    discover_checkpoints,
    load_optimizer_state,
    load_state_dict,
    nearest_before,
)
from forensics.replay.forward import LOSS_DENOMINATORS, Forwarder, SampleLoss, batch_loss, grad_norm
from forensics.replay.model import LoadedModel, load_model
from forensics.replay.probes import composition_harm, determinism, mixed_batch, probe_sets, update_probe
from forensics.replay.result import ReplayResult, json_safe, merge_write
from forensics.replay.signals import signals
from forensics.replay.verdicts import Measured, decide, zscore
from forensics.schema import DEFAULT_BOUNDARIES, STEP, find_loss_key, load_plan, load_samples, open_case

#: A sample is a "top suspect" when its loss is this many SDs above the same-bucket controls' per-sample losses.
SAMPLE_Z = 3.0
#: Steps per checkpoint replayed to calibrate the tolerance of reproduction (see verdicts.tolerance).
CALIBRATION = 4


@dataclass
class ReplayOptions:
    """What to replay and how; ``None`` means the case's run.toml, then the defaults below."""

    steps: list[int] | None = None
    from_findings: bool = False
    checkpoints: str | None = None
    model: str | None = None
    tokens: str | None = None
    device: str = "auto"
    dtype: str | None = None
    controls: int = 8
    earlier: int = 2
    max_tokens_per_forward: int = 16_384
    json_path: str | None = None
    progress: bool = False
    train_mode: bool = False
    second_device: str | None = None
    second_dtype: str | None = None
    probes: bool = True
    seed: int = 0


def _vocab_size(module: Any) -> int | None:
    """Rows of the input embedding (HF ``get_input_embeddings``, else the first ``nn.Embedding``)."""
    torch = _torch.torch()
    emb = module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else None
    if emb is None:
        emb = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)
    return int(emb.num_embeddings) if emb is not None else None


def _device(name: str) -> str:
    torch = _torch.torch()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ForensicsError("--device cuda: no CUDA device is available to torch here")
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise ForensicsError(f"--device must be cpu, cuda or auto; got {name!r}")
    return name


def _steps_from_findings(root: Path, loss_key: str) -> tuple[list[int], list[str]]:
    path = root / "findings.json"
    if not path.exists():
        raise ForensicsError(f"--from-findings: {path} does not exist; run forensics audit {root} first")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ForensicsError(f"{path} is not valid JSON: {exc}") from exc
    key = (data.get("run") or {}).get("loss_key") or loss_key
    spikes = [s for s in data.get("spikes", []) if s.get("peak_step") is not None]
    steps = sorted({int(s["peak_step"]) for s in spikes if s.get("metric") == key})
    if steps:
        return steps, []
    # no loss spike (e.g. the loss detector's history window covers it) but spikes on other training quantities:
    # their steps are what the audit's next steps ask to replay
    steps = sorted({int(s["peak_step"]) for s in spikes})
    if not steps:
        raise ForensicsError(f"--from-findings: {path} holds no spike to replay")
    metrics = sorted({str(s.get("metric")) for s in spikes})
    return steps, [f"{path}: no spike on the loss '{key}'; replaying the peaks of the spikes on {', '.join(metrics)}"]


def _pick_controls(step: int, index: StepIndex, k: int, exclude: set[int]) -> tuple[list[int], list[int]]:
    own = set(index.samples_of[step])
    bucket = index.bucket_of.get(step)
    same, other = [], []
    for c in sorted(index.samples_of, key=lambda t: (abs(t - step), t)):
        if c in exclude or own.intersection(index.samples_of[c]):
            continue
        if index.bucket_of.get(c) == bucket:
            if len(same) < k:
                same.append(c)
        elif len(other) < k:
            other.append(c)
        if len(same) >= k and len(other) >= k:
            break
    return same, other


def replay_case(case_dir: str | Path, options: ReplayOptions | None = None) -> ReplayResult:
    """Replay the suspect steps of a case folder and write ``CASE/replay/replay.json`` (merged by step)."""
    opt = options or ReplayOptions()
    case = open_case(case_dir)
    cfg, root = case.config, case.root
    if root is None:
        raise ForensicsError(f"replay needs a case folder (plan, samples, checkpoints); {case_dir} is a metrics source")
    torch = _torch.torch()
    device = _device(opt.device)
    dtype = opt.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    if dtype not in ("float32", "bfloat16"):
        raise ForensicsError(f"--dtype must be float32 or bfloat16; got {dtype!r}")
    if opt.controls < 2:
        raise ForensicsError(f"--controls must be >= 2 (a z-score needs a spread); got {opt.controls}")

    # the run's tables
    from forensics.sources import read_metrics

    metrics, _ = read_metrics(case.metrics_sources, step_offset=cfg.step_offset,
                              step_key=cfg.step_key)
    loss_key = find_loss_key(metrics.columns, cfg.loss_key)
    logged = dict(zip(metrics[STEP].tolist(), metrics[loss_key].astype(float).tolist()))
    if case.plan_path is None:
        raise ForensicsError(f"case {root}: replay needs the plan (plan.parquet or run.toml 'plan')")
    samples = load_samples(case.samples_path) if case.samples_path else None
    plan = assign_steps(load_plan(case.plan_path, samples), cfg.grad_accum, cfg.world_size, cfg.rank_split)
    boundaries = list(cfg.boundaries) if cfg.boundaries else (
        resolve_boundaries(None, samples, cfg.max_len, cfg.n_buckets) if samples is not None else DEFAULT_BOUNDARIES)
    index = StepIndex.build(plan, samples, boundaries)
    tokens = read_tokens(case.samples_path, opt.tokens, samples)

    warnings: list[str] = []
    if opt.from_findings:
        steps, warnings = _steps_from_findings(root, loss_key)
    else:
        steps = sorted(set(opt.steps or []))
    if not steps:
        raise ForensicsError("replay: name the steps (--steps 254,258) or use --from-findings")
    missing = [s for s in steps if not index.has(s)]
    if missing:
        raise ForensicsError(f"plan {case.plan_path}: no batch for step(s) {missing[:5]}; the plan covers steps "
                             f"{min(index.samples_of)}-{max(index.samples_of)}")

    # model and checkpoints
    ck_spec = opt.checkpoints or cfg.checkpoints
    if not ck_spec and any(p.is_dir() for p in root.glob("checkpoint-*")):
        ck_spec = "."  # an HF Trainer output folder holds its checkpoint-N/ folders itself
    if not ck_spec:
        raise ForensicsError("no checkpoints: give --checkpoints DIR or set 'checkpoints' in run.toml")
    ck_path = Path(ck_spec) if Path(ck_spec).is_absolute() else root / ck_spec
    checkpoints = discover_checkpoints(ck_path)
    model = load_model(opt.model or cfg.model, root, checkpoints[-1].config_dir)
    pad_id = int(cfg.pad_id if cfg.pad_id is not None else (model.pad_id if model.pad_id is not None else 0))
    pad_side = str(cfg.pad_side or model.pad_side or "right")
    if pad_side not in ("left", "right"):
        raise ForensicsError(f"run.toml: 'pad_side' must be left or right; got {pad_side!r}")
    vocab = _vocab_size(model.module)
    if vocab is not None:
        if not 0 <= pad_id < vocab:  # pads are masked out: any id the embedding holds will do
            pad_id = 0
        used = {i for t in (index.samples_of[s] for s in steps) for i in t}
        top = max((int(tokens[i].max()) for i in used if len(tokens[i])), default=0)
        if top >= vocab:
            raise ForensicsError(f"tokens {tokens.origin}: id {top} is beyond the model's vocabulary of {vocab}; "
                                 "the tokens or the model are not the run's")
    denom = str(cfg.loss_denominator or ("labels" if model.hf else "predicted"))
    if denom not in LOSS_DENOMINATORS:
        raise ForensicsError(f"run.toml: 'loss_denominator' must be one of {', '.join(LOSS_DENOMINATORS)}; "
                             f"got {denom!r}")
    model.module.to(device).train(opt.train_mode)
    fwd = Forwarder(model, device, dtype, opt.max_tokens_per_forward, pad_id, pad_side)
    fwd2 = None
    if opt.second_device or opt.second_dtype:
        import copy

        dev2 = _device(opt.second_device or device)
        twin = LoadedModel(copy.deepcopy(model.module).to(dev2), model.hf, model.pad_id, model.pad_side, None)
        fwd2 = Forwarder(twin, dev2, opt.second_dtype or dtype, opt.max_tokens_per_forward, pad_id, pad_side)

    # plan the forwards: (checkpoint step, batch step)
    plans, needed = {}, set()
    by_step = {c.step: c for c in checkpoints}
    for s in steps:
        ck = nearest_before(checkpoints, s)
        if ck is None:
            plans[s] = None
            continue
        earlier = [c for c in checkpoints if c.step < ck.step][-opt.earlier:][::-1] if opt.earlier else []
        same, other = _pick_controls(s, index, opt.controls, set(steps) | {s - 1, s + 1})
        neigh = {}
        for off in (-1, 1):
            t = s + off
            nck = nearest_before(checkpoints, t)
            if index.has(t) and nck is not None:
                neigh[f"{off:+d}"] = (t, nck.step)
                needed.add((nck.step, t))
        # calibration: how well a checkpoint reproduces the logged loss of steps up to d = s - c updates after it,
        # measured after this checkpoint (steps c+1..s-1) and after the earlier ones (c'+1..c'+d): the tolerance
        # of reproduction comes from the run's own drift, not from a guess
        d = s - ck.step
        cal = []
        for base in [ck.step, *(e.step for e in earlier)]:
            span = [t for t in range(base + 1, base + d + (0 if base == ck.step else 1))
                    if index.has(t) and t in logged and t not in steps]
            if span:
                picks = np.unique(np.linspace(0, len(span) - 1, min(CALIBRATION, len(span))).round().astype(int))
                cal += [(base, span[int(i)]) for i in picks]
        plans[s] = dict(ck=ck.step, earlier=[c.step for c in earlier], same=same, other=other, neigh=neigh, cal=cal)
        needed |= set(cal)
        needed |= {(ck.step, t) for t in [s, *same, *other]}
        needed |= {(e.step, t) for e in earlier for t in [s, *same]}

    cache: dict[tuple[int, int], list[SampleLoss]] = {}
    probes: dict[int, dict[str, Any]] = {}
    with _Progress(opt.progress, len(needed)) as advance:
        for ck_step in sorted({c for c, _ in needed}):
            ck: Checkpoint = by_step[ck_step]
            state = load_state_dict(ck)
            apply_state(model.module, state, ck.path)
            if fwd2 is not None:
                apply_state(fwd2.model.module, state, ck.path)
            for _, t in sorted(p for p in needed if p[0] == ck_step):
                cache[(ck_step, t)] = fwd.losses([tokens[i] for i in index.samples_of[t]])
                advance(f"checkpoint {ck_step}, step {t}")
            for s in steps:
                if plans.get(s) and plans[s]["ck"] == ck_step:
                    probes[s] = _probes(s, plans[s], ck, state, model, fwd, fwd2, cache, index, tokens, samples,
                                        denom, opt)

    doc_freq, n_docs = tokens.document_frequency()
    results = []
    for s in steps:
        results.append(_step_result(s, plans[s], cache, index, tokens, logged, doc_freq, n_docs, cfg.step_offset,
                                    denom, probes.get(s, {}), samples))
    result = ReplayResult(steps=json_safe(results), device=device, dtype=dtype, forwards=fwd.forwards,
                          tokens_forwarded=fwd.tokens, warnings=warnings)
    out = root / "replay" / "replay.json"
    merge_write(out, result)
    result.written.append(out)
    if opt.json_path:
        jp = Path(opt.json_path)
        jp.parent.mkdir(parents=True, exist_ok=True)
        jp.write_text(json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
        result.written.append(jp)
    del torch
    return result


def _step_result(s: int, plan: dict | None, cache: dict, index: StepIndex, tokens: TokenStore,
                 logged: dict[int, float], doc_freq: np.ndarray, n_docs: int, step_offset: int,
                 denom: str = "predicted", probed: dict | None = None,
                 samples: pd.DataFrame | None = None) -> dict[str, Any]:
    log = logged.get(s)
    log = None if log is None or not math.isfinite(log) else log
    if plan is None:
        return {"step": s, "verdict": "inconclusive", "logged": log,
                "evidence": [f"No checkpoint at or before step {s}: nothing to replay it with."]}
    ck = plan["ck"]
    suspect = cache[(ck, s)]
    replayed = batch_loss(suspect, denom)
    same = [batch_loss(cache[(ck, t)], denom) for t in plan["same"]]
    other = [batch_loss(cache[(ck, t)], denom) for t in plan["other"]]
    z = zscore(replayed, same)
    neighbours, match, dist = {}, {}, {}
    for off, (t, nck) in plan["neigh"].items():
        r = batch_loss(cache[(nck, t)], denom)
        neighbours[off] = r
        if log is not None:
            match[off] = abs(r - log)
            dist[off] = t - nck  # updates between the neighbour batch and its checkpoint
    calibration = []
    for base, t in plan["cal"]:
        lt = logged.get(t)
        if lt is not None and math.isfinite(lt) and lt != 0:
            calibration.append({"checkpoint_step": base, "step": t, "replayed": batch_loss(cache[(base, t)], denom),
                                "logged": lt})
    reverse = {}
    for off in plan["neigh"]:
        lr_ = logged.get(s - int(off))
        if lr_ is not None and math.isfinite(lr_):
            reverse[off] = lr_
    earlier = []
    for e in plan["earlier"]:
        er = batch_loss(cache[(e, s)], denom)
        es = [batch_loss(cache[(e, t)], denom) for t in plan["same"]]
        earlier.append({"checkpoint_step": e, "replayed": er, "z": zscore(er, es),
                        "controls_mean": float(np.mean(es)) if es else None})

    # per-sample: most suspect first, leave-one-out, and leave-the-top-out
    sids = index.samples_of[s]
    extra = 1 if denom == "labels" else 0
    total, count = sum(x.total for x in suspect), sum(x.count + extra for x in suspect)
    ctrl = [x.mean for t in plan["same"] for x in cache[(ck, t)] if x.count]
    thr = (float(np.mean(ctrl)) + SAMPLE_Z * float(np.std(ctrl))) if len(ctrl) >= 2 else math.inf
    order = sorted(range(len(sids)), key=lambda i: -(suspect[i].mean if suspect[i].count else -math.inf))
    rows = []
    for i in order:
        x = suspect[i]
        rest = count - x.count - extra
        rows.append({"sample_id": int(sids[i]), "loss": x.mean, "n_tokens": int(len(tokens[sids[i]])),
                     "leave_one_out": (total - x.total) / rest if rest else None,
                     "signals": signals(tokens[sids[i]], x.tokens, doc_freq, n_docs)})
    top = [i for i in order if suspect[i].count and suspect[i].mean > thr]
    leave_out = None
    if top and len(top) < len(sids):
        rest = [suspect[i] for i in range(len(sids)) if i not in set(top)]
        lr = batch_loss(rest, denom)
        leave_out = {"sample_ids": [int(sids[i]) for i in top], "replayed": lr, "z": zscore(lr, same)}
    m = Measured(step=s, checkpoint_step=ck, logged=log, replayed=replayed, neighbours=neighbours,
                 neighbour_logged_match=match, neighbour_distance=dist, z=z,
                 controls_mean=float(np.mean(same)) if same else None,
                 earlier=earlier, leave_out=leave_out, step_offset=step_offset,
                 calibration=[(c["step"] - c["checkpoint_step"], abs(c["replayed"] - c["logged"]) / abs(c["logged"]))
                              for c in calibration],
                 reverse_logged=reverse)
    probed = probed or {}
    if "determinism" in probed:
        m.determinism = probed["determinism"]
    if "update_probe" in probed:
        col = "cluster" if samples is not None and "cluster" in samples.columns else "source"
        cl = dict(zip(samples["sample_id"].tolist(), samples[col].astype(str).tolist()))
        m.composition = composition_harm(probed["update_probe"], {cl[i] for i in sids if i in cl})
    verdict, evidence = decide(m)
    g = probed.get("gradient")
    if g and g.get("z") is not None and verdict != "nondeterministic":
        same_g = g["controls"]["same_bucket"]
        evidence.insert(len(evidence) - 1, f"Its gradient norm is {g['suspect']:.3g} against {np.mean(same_g):.3g} "
                        f"for its bucket's controls (z = {g['z']:.1f}).")
    if rows and verdict == "data":
        evidence.insert(len(evidence) - 1, "Most suspect samples: " + ", ".join(
            f"{r['sample_id']} (loss {r['loss']:.3g}, repeat run {r['signals']['repeat_run']}, rare tokens "
            f"{r['signals']['rare_token_share']:.0%})" for r in rows[:3]) + ".")
    out: dict[str, Any] = {
        "step": s, "verdict": verdict, "checkpoint_step": ck, "logged": log, "replayed": replayed,
        "neighbours": {k: neighbours.get(k) for k in ("-1", "+1")},
        "bucket": index.bucket_of.get(s),
        "controls": {"same_bucket": same, "other_buckets": other, "z": z,
                     "same_bucket_steps": plan["same"], "other_bucket_steps": plan["other"]},
        "samples": rows,
        "evidence": evidence,
    }
    if earlier:
        out["earlier"] = [{k: e[k] for k in ("checkpoint_step", "replayed", "z")} for e in earlier]
    if leave_out:
        out["leave_out"] = leave_out
    if calibration:
        out["calibration"] = calibration
    for key in ("gradient", "update_probe", "determinism"):
        if key in probed:
            out[key] = probed[key]
    return out


def _probes(s: int, plan: dict, ck: Checkpoint, state: dict, model: LoadedModel, fwd: Forwarder,
            fwd2: Forwarder | None, cache: dict, index: StepIndex, tokens: TokenStore,
            samples: pd.DataFrame | None, denom: str, opt: ReplayOptions) -> dict[str, Any]:
    """Determinism, gradient and update probes of step ``s`` at its checkpoint (the weights are loaded)."""
    seqs = [tokens[i] for i in index.samples_of[s]]
    out: dict[str, Any] = {"determinism": determinism(fwd, seqs, cache[(ck.step, s)], fwd2)}
    if not opt.probes:
        return out
    g = {"suspect": grad_norm(fwd, seqs, denom)}
    g["controls"] = {kind: [grad_norm(fwd, [tokens[i] for i in index.samples_of[t]], denom) for t in plan[key]]
                     for kind, key in (("same_bucket", "same"), ("other_buckets", "other"))}
    g["z"] = zscore(g["suspect"], g["controls"]["same_bucket"])
    out["gradient"] = g
    opt_state = load_optimizer_state(ck)
    if opt_state is not None and samples is not None:
        own = set(index.samples_of[s])
        sets = probe_sets(samples, own, opt.seed)
        col = "cluster" if "cluster" in samples.columns else ("source" if "source" in samples.columns else None)
        if len(sets) >= 2 and col is not None:
            used = own | {i for ids in sets.values() for i in ids}
            mixed = mixed_batch(samples, col, sum(len(x) for x in seqs), used, opt.seed)
            probe = update_probe(fwd, opt_state, lambda: apply_state(model.module, state, ck.path), seqs,
                                 [tokens[i] for i in mixed], {c: [tokens[i] for i in ids] for c, ids in sets.items()},
                                 denom)
            if probe is not None:
                out["update_probe"] = probe
    return out


class _Progress:
    """A rich progress bar on stderr over the forwards (only when asked: the library stays quiet by default)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self._bar = enabled, total, None

    def __enter__(self):
        if not self.enabled:
            return lambda what: None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
        self._bar.start()
        task = self._bar.add_task("", total=self.total)
        return lambda what: self._bar.update(task, advance=1, description=what)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
