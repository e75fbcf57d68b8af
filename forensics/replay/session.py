"""One replay session: the case's tables, the model and the checkpoints loaded once, and the forwards of a group of
suspect steps planned and run checkpoint by checkpoint.

For each suspect step s (docs/commands/replay.md ``replay.json``):

1. its checkpoint: the latest one at or before s (the state s's batch saw, or the nearest before it); with none, the
   nearest one after s (``checkpoint = "after"``: the model has trained on the batch since);
2. reproduce: s's batch at that checkpoint against the logged loss, and s-1's and s+1's batches (each at its own
   checkpoint) against the same logged value, which is what exposes a misaligned join; steps between the checkpoint
   and s (``calibration``) measure how far the parameters drifted;
3. earlier: s's batch at up to ``earlier`` checkpoints before its own;
4. controls: ``controls`` K steps of s's dominant bucket and K of other buckets (the nearest in step, never sharing
   a sample with s, never a known spike), at the same checkpoint, and the same-bucket ones at the earlier checkpoints;
5. train mode: when the eval-mode replay misses the logged loss and the model has dropout, s's batch (and its
   calibration steps) again in train mode over ``seeds`` dropout seeds (:mod:`forensics.replay.verdicts`).

Each checkpoint is loaded once per pass and every batch it must see runs then. Every forward is logged
(``forward_log``: checkpoint, step, seed) so that a benchmark can run exactly the same forwards bare.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics.errors import ForensicsError
from forensics.plan.optimal_boundaries import resolve_boundaries
from forensics.plan.step_mapping import assign_steps
from forensics.replay import _torch
from forensics.replay.batches import StepIndex, read_tokens
from forensics.replay.checkpoints import (
    Checkpoint,
    apply_state,
    discover_checkpoints,
    load_state_dict,
    nearest_after,
    nearest_before,
)
from forensics.replay.forward import LOSS_DENOMINATORS, Forwarder, SampleLoss
from forensics.replay.model import LoadedModel, dropout_rate, load_model
from forensics.replay.verdicts import tolerance
from forensics.schema import DEFAULT_BOUNDARIES, STEP, Case, find_loss_key, load_plan, load_samples
from forensics.schema.tables import LEFT_OUT

#: Steps per checkpoint replayed to calibrate the tolerance of reproduction (see verdicts.tolerance).
CALIBRATION = 4


@dataclass
class StepPlan:
    """The forwards one suspect step needs (module docstring)."""

    step: int
    ck: int
    after: bool
    earlier: list[int]
    same: list[int]
    other: list[int]
    neigh: dict[str, tuple[int, int]] = field(default_factory=dict)  # offset -> (step, its checkpoint)
    cal: list[tuple[int, int]] = field(default_factory=list)  # (checkpoint, step)


def _device(name: str) -> str:
    torch = _torch.torch()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ForensicsError("--device cuda: no CUDA device is available to torch here")
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise ForensicsError(f"--device must be cpu, cuda or auto; got {name!r}")
    return name


def _vocab_size(module: Any) -> int | None:
    """Rows of the input embedding (HF ``get_input_embeddings``, else the first ``nn.Embedding``)."""
    torch = _torch.torch()
    emb = module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else None
    if emb is None:
        emb = next((m for m in module.modules() if isinstance(m, torch.nn.Embedding)), None)
    return int(emb.num_embeddings) if emb is not None else None


class ReplaySession:
    """The case, model and checkpoints of one ``forensics replay`` (or one ``audit --replay``), loaded once.

    ``opt`` is a :class:`~forensics.replay.core.ReplayOptions`; ``logged`` maps step -> the loss the run that wrote
    the checkpoints logged (run.toml ``[replay] metrics``, else the case's metrics).
    """

    def __init__(self, case: Case, opt: Any) -> None:
        self.case, self.opt, self.root = case, opt, case.root
        self.device = _device(opt.device)
        self.dtype = opt.dtype or ("bfloat16" if self.device.startswith("cuda") else "float32")
        if self.dtype not in ("float32", "bfloat16"):
            raise ForensicsError(f"--dtype must be float32 or bfloat16; got {self.dtype!r}")
        if opt.controls < 2:
            raise ForensicsError(f"--controls must be >= 2 (a z-score needs a spread); got {opt.controls}")
        if opt.mode not in ("eval", "train"):
            raise ForensicsError(f"--mode must be eval or train; got {opt.mode!r}")
        if opt.seeds < 2:
            raise ForensicsError(f"--seeds must be >= 2 (a spread needs two); got {opt.seeds}")
        self.warnings: list[str] = []
        self._load_tables(case)
        self._load_model(case)
        self.seeds = list(range(opt.seed, opt.seed + opt.seeds))
        self.compare_seeds = self.seeds if opt.mode == "train" else [None]
        self.cache: dict[tuple[int, int, int | None], list[SampleLoss]] = {}
        self.forward_log: list[tuple[int, int, int | None]] = []
        self.forward_seconds = 0.0
        self._applied: int | None = None
        self._state: dict[str, Any] | None = None

    # --- loading -----------------------------------------------------------------------------------------------
    def _load_tables(self, case: Case) -> None:
        from forensics.sources import read_metrics

        cfg, root = case.config, case.root
        sources = case.metrics_sources
        extra = (cfg.replay or {}).get("metrics")
        if extra:
            from forensics.schema.config import SourceSpec

            names = [extra] if isinstance(extra, str) else list(extra)
            sources = [SourceSpec(str(cfg.resolve(n))) for n in names]
            self.warnings.append(
                f"run.toml [replay] metrics: the logged losses are those of {', '.join(names)} "
                "(the run that wrote the checkpoints), not the case's own metrics"
            )
        metrics, report = read_metrics(sources, step_offset=cfg.step_offset, step_key=cfg.step_key)
        loss_key = find_loss_key(metrics.columns, cfg.loss_key, left_out=metrics.attrs.get(LEFT_OUT))
        self.loss_key = loss_key
        self.metrics = metrics  # the segment re-run reads the logged learning rate and grad norm
        pairs = zip(metrics[STEP].tolist(), metrics[loss_key].astype(float), strict=False)
        self.logged = {int(s): float(v) for s, v in pairs if v == v}
        offsets = [int(a.step_offset) for a in report.alignments]
        self.source_offset = max(set(offsets), key=offsets.count) if offsets else 0
        if case.plan_path is None:
            raise ForensicsError(f"case {root}: replay needs the plan (plan.parquet or run.toml 'plan')")
        self.samples = load_samples(case.samples_path) if case.samples_path else None
        plan = assign_steps(load_plan(case.plan_path, self.samples), cfg.grad_accum, cfg.world_size, cfg.rank_split)
        boundaries = (
            list(cfg.boundaries)
            if cfg.boundaries
            else (
                resolve_boundaries(None, self.samples, cfg.max_len, cfg.n_buckets)
                if self.samples is not None
                else DEFAULT_BOUNDARIES
            )
        )
        self.index = StepIndex.build(plan, self.samples, boundaries)
        self.tokens = read_tokens(case.samples_path, self.opt.tokens, self.samples)
        self.step_offset = cfg.step_offset or 0

    def _load_model(self, case: Case) -> None:
        cfg, root, opt = case.config, case.root, self.opt
        ck_spec = opt.checkpoints or cfg.checkpoints
        if not ck_spec and any(p.is_dir() for p in root.glob("checkpoint-*")):
            ck_spec = "."  # an HF Trainer output folder holds its checkpoint-N/ folders itself
        if not ck_spec:
            raise ForensicsError("no checkpoints: give --checkpoints DIR or set 'checkpoints' in run.toml")
        from pathlib import Path

        ck_path = Path(ck_spec) if Path(ck_spec).is_absolute() else root / ck_spec
        self.checkpoints = discover_checkpoints(ck_path)
        self.by_step = {c.step: c for c in self.checkpoints}
        config_dir = next((c.config_dir for c in reversed(self.checkpoints) if c.config_dir is not None), None)
        model, note = load_model(opt.model or cfg.model, root, config_dir, ck_path)
        if note:
            self.warnings.append(note)
        self.model = model
        pad_id = int(cfg.pad_id if cfg.pad_id is not None else (model.pad_id if model.pad_id is not None else 0))
        pad_side = str(cfg.pad_side or model.pad_side or "right")
        if pad_side not in ("left", "right"):
            raise ForensicsError(f"run.toml: 'pad_side' must be left or right; got {pad_side!r}")
        self.vocab = _vocab_size(model.module)
        if self.vocab is not None and not 0 <= pad_id < self.vocab:  # pads are masked out: any id will do
            pad_id = 0
        self.denom = str(cfg.loss_denominator or ("labels" if model.hf else "predicted"))
        if self.denom not in LOSS_DENOMINATORS:
            raise ForensicsError(
                f"run.toml: 'loss_denominator' must be one of {', '.join(LOSS_DENOMINATORS)}; got {self.denom!r}"
            )
        model.module.to(self.device).train(False)
        self.dropout = dropout_rate(model.module)
        self.fwd = Forwarder(model, self.device, self.dtype, opt.max_tokens_per_forward, pad_id, pad_side)
        self.fwd2 = None
        if opt.second_device or opt.second_dtype:
            dev2 = _device(opt.second_device or self.device)
            twin = LoadedModel(copy.deepcopy(model.module).to(dev2), model.hf, model.pad_id, model.pad_side, None)
            self.fwd2 = Forwarder(
                twin, dev2, opt.second_dtype or self.dtype, opt.max_tokens_per_forward, pad_id, pad_side
            )

    def check_vocabulary(self, steps: list[int]) -> None:
        """Token ids beyond the model's vocabulary: the tokens or the model are not the run's (one line)."""
        if self.vocab is None:
            return
        used = {i for s in steps for i in self.index.samples_of.get(s, [])}
        top = max((int(self.tokens[i].max()) for i in used if len(self.tokens[i])), default=0)
        if top >= self.vocab:
            raise ForensicsError(
                f"tokens {self.tokens.origin}: id {top} is beyond the model's vocabulary of "
                f"{self.vocab}; the tokens or the model are not the run's"
            )

    # --- planning ----------------------------------------------------------------------------------------------
    def checkpoint_for(self, step: int) -> tuple[Checkpoint, bool] | None:
        """The checkpoint to replay ``step`` at, and whether it is after the step (none at or before it)."""
        ck = nearest_before(self.checkpoints, step)
        if ck is not None:
            return ck, False
        ck = nearest_after(self.checkpoints, step)
        return (ck, True) if ck is not None else None

    def pick_controls(self, step: int, exclude: set[int]) -> tuple[list[int], list[int]]:
        """K same-bucket and K other-bucket control steps nearest to ``step`` sharing no sample with it."""
        index, k = self.index, self.opt.controls
        own = set(index.samples_of[step])
        bucket = index.bucket_of.get(step)
        same, other = [], []
        for c in sorted(index.samples_of, key=lambda t: (abs(t - step), t)):
            if c in exclude or c == step or own.intersection(index.samples_of[c]):
                continue
            if index.bucket_of.get(c) == bucket:
                if len(same) < k:
                    same.append(c)
            elif len(other) < k:
                other.append(c)
            if len(same) >= k and len(other) >= k:
                break
        return same, other

    def plan(self, s: int, exclude: set[int]) -> StepPlan:
        found = self.checkpoint_for(s)
        if found is None:  # discover_checkpoints never returns an empty list
            raise ForensicsError("replay: no checkpoint to replay with")
        ck, after = found
        earlier = (
            []
            if after or not self.opt.earlier
            else [c.step for c in self.checkpoints if c.step < ck.step][-self.opt.earlier :][::-1]
        )
        same, other = self.pick_controls(s, exclude | {s - 1, s + 1})
        p = StepPlan(s, ck.step, after, earlier, same, other)
        for off in (-1, 1):
            t = s + off
            nck = self.checkpoint_for(t)
            if self.index.has(t) and nck is not None:
                p.neigh[f"{off:+d}"] = (t, nck[0].step)
        # calibration: how well a checkpoint reproduces the logged loss of steps up to d = |s - c| updates from it,
        # on the side of the step (after the checkpoint; before it when the checkpoint is after the step)
        d = abs(s - ck.step)
        for base in [ck.step, *earlier]:
            if after:
                span = range(base - d, base)
            elif base == ck.step:
                span = range(base + 1, base + d)
            else:
                span = range(base + 1, base + d + 1)
            span = [t for t in span if t != s and self.index.has(t) and t in self.logged and t not in exclude]
            if span:
                picks = np.unique(np.linspace(0, len(span) - 1, min(CALIBRATION, len(span))).round().astype(int))
                p.cal += [(base, span[int(i)]) for i in picks]
        return p

    @staticmethod
    def pairs(p: StepPlan) -> set[tuple[int, int]]:
        """The (checkpoint, step) forwards of one plan."""
        out = set(p.cal) | {(p.ck, t) for t in [p.step, *p.same, *p.other]}
        out |= {(e, t) for e in p.earlier for t in [p.step, *p.same]}
        out |= {(c, t) for t, c in p.neigh.values()}
        return out

    # --- running -----------------------------------------------------------------------------------------------
    def load(self, ck_step: int) -> dict[str, Any]:
        """Put checkpoint ``ck_step``'s weights into the model (and the twin); kept while the next asks for it."""
        if self._applied != ck_step:
            ck = self.by_step[ck_step]
            state = load_state_dict(ck)
            apply_state(self.model.module, state, ck.path)
            if self.fwd2 is not None:
                apply_state(self.fwd2.model.module, state, ck.path)
            self._applied, self._state = ck_step, state
        return self._state

    def forward(self, ck_step: int, t: int, seed: int | None) -> list[SampleLoss]:
        """Step ``t``'s batch at the loaded checkpoint ``ck_step`` (eval mode, or train mode with ``seed``)."""
        key = (ck_step, t, seed)
        if key not in self.cache:
            t0 = time.perf_counter()
            self.cache[key] = self.fwd.losses([self.tokens[i] for i in self.index.samples_of[t]], seed)
            self.forward_seconds += time.perf_counter() - t0
            self.forward_log.append(key)
        return self.cache[key]

    def losses(self, ck_step: int, t: int) -> list[SampleLoss]:
        """The per-sample losses compared (eval mode; the mean over the seeds with ``--mode train``)."""
        if self.compare_seeds == [None]:
            return self.cache[(ck_step, t, None)]
        runs = [self.cache[(ck_step, t, k)] for k in self.compare_seeds]
        return [
            SampleLoss(
                float(np.mean([r[i].total for r in runs])),
                runs[0][i].count,
                np.mean([r[i].tokens for r in runs], axis=0),
            )
            for i in range(len(runs[0]))
        ]

    def seconds_per_forward(self) -> float:
        return self.forward_seconds / len(self.forward_log) if self.forward_log else 0.0

    def eval_misses(self, p: StepPlan, batch_loss) -> bool:
        """Whether the eval-mode replay of ``p``'s step misses its logged loss (so train mode is tried)."""
        log = self.logged.get(p.step)
        if log is None or not math.isfinite(log) or self.compare_seeds != [None] or self.dropout <= 0:
            return False
        replayed = batch_loss(self.losses(p.ck, p.step), self.denom)
        cal = self.calibration_errors(p, batch_loss, None)
        return abs(replayed - log) > tolerance(log, p.step - p.ck, cal)

    def calibration_errors(self, p: StepPlan, batch_loss, seeds: list[int | None] | None) -> list[tuple[int, float]]:
        """(distance, relative error) of the calibration steps, in eval mode or as the mean over ``seeds``."""
        out = []
        for base, t in p.cal:
            lt = self.logged.get(t)
            if lt is None or not math.isfinite(lt) or lt == 0:
                continue
            if seeds is None:
                r = batch_loss(self.losses(base, t), self.denom)
            else:
                r = float(np.mean([batch_loss(self.cache[(base, t, k)], self.denom) for k in seeds]))
            out.append((abs(t - base), abs(r - lt) / abs(lt)))
        return out
