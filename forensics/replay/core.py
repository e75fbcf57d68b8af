"""``replay_case``: choose the steps, replay them group by group within a time budget, decide, write replay.json.

The steps are given (``steps``, read as canonical or logged numbers), or the causes of findings.json with a batch,
most urgent first (``from_findings``; :mod:`forensics.replay.select`), or groups the audit chose (``groups``). Each
group is one cause's events, planned and run by a :class:`~forensics.replay.session.ReplaySession` (the case, model
and checkpoints loaded once): first every forward in the comparison mode, checkpoint by checkpoint, with the probes
at the suspect's checkpoint; then, for a suspect whose eval-mode replay misses its logged loss on a model with
dropout, the same batch in train mode over the dropout seeds. A group starts only while the budget allows it (its
forwards times the seconds per forward so far); the groups it did not reach are listed as not replayed. Last, one
clean control step is replayed like a suspect, so that the verdicts are seen to discriminate.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError
from forensics.replay.forward import batch_loss, grad_norm
from forensics.replay.outcome import step_result
from forensics.replay.probes import determinism, mixed_batch, probe_sets, update_probe
from forensics.replay.result import ReplayResult, json_safe, merge_write
from forensics.replay.select import ReplayGroup, cause_groups, control_step, known_spikes, read_findings, spike_steps
from forensics.replay.session import ReplaySession, StepPlan
from forensics.replay.verdicts import TrainReplay, zscore
from forensics.schema import Case, open_case
from forensics.schema.steps import STEPS_AS, to_canonical

#: What ``None`` options become when neither the command nor run.toml's ``[replay]`` table sets them.
DEFAULTS = {"device": "auto", "mode": "eval", "seeds": 3}


@dataclass
class ReplayOptions:
    """What to replay and how; ``None`` means the case's run.toml (``[replay]`` table), then :data:`DEFAULTS`."""

    steps: list[int] | None = None
    from_findings: bool = False
    groups: list[ReplayGroup] | None = None
    max_causes: int | None = None
    steps_as: str = "canonical"
    checkpoints: str | None = None
    model: str | None = None
    tokens: str | None = None
    device: str | None = None
    dtype: str | None = None
    controls: int = 8
    earlier: int = 2
    max_tokens_per_forward: int = 16_384
    json_path: str | None = None
    progress: bool = False
    mode: str | None = None
    seeds: int | None = None
    second_device: str | None = None
    second_dtype: str | None = None
    probes: bool = True
    seed: int = 0
    budget_s: float | None = None
    control_step: bool = True
    #: The audit's findings when they are not yet written (``audit --replay``): their spikes are never controls.
    findings: dict[str, Any] | None = None
    #: Also re-run the optimizer steps from the checkpoint before each suspect (:mod:`forensics.replay.rerun`).
    rerun: bool = False
    #: A re-run that cannot run (no optimizer state in its checkpoint, an optimizer it does not know) is a warning,
    #: not bad input: ``audit --replay`` re-runs when it can and replays the verdicts either way.
    rerun_optional: bool = False


def _resolved(opt: ReplayOptions, case: Case) -> ReplayOptions:
    from dataclasses import replace

    table = dict(case.config.replay or {})
    values = {k: getattr(opt, k) if getattr(opt, k) is not None else table.get(k, DEFAULTS[k]) for k in DEFAULTS}
    if opt.max_causes is None and table.get("max_causes") is not None:
        values["max_causes"] = int(table["max_causes"])
    if opt.steps_as not in STEPS_AS:
        raise ForensicsError(f"--steps-as must be logged or canonical; got {opt.steps_as!r}")
    if values.get("max_causes") is not None and values["max_causes"] < 1:
        raise ForensicsError(f"--max-causes must be >= 1; got {values['max_causes']}")
    return replace(opt, **values)


def replay_case(case_dir: str | Path | Case, options: ReplayOptions | None = None) -> ReplayResult:
    """Replay the suspect steps of a case folder and write ``CASE/replay/replay.json`` (merged by step)."""
    t0 = time.perf_counter()
    case = case_dir if isinstance(case_dir, Case) else open_case(case_dir)
    if case.root is None:
        raise ForensicsError(f"replay needs a case folder (plan, samples, checkpoints); {case_dir} is a metrics source")
    opt = _resolved(options or ReplayOptions(), case)
    findings = opt.findings if opt.findings is not None else read_findings(case.root)
    ses = ReplaySession(case, opt)
    offset = int((findings or {}).get("run", {}).get("logged_offset", ses.source_offset) or 0)
    groups, notes = _groups(opt, ses, findings, offset, case.root)
    every = sorted({s for g in groups for s in g.steps})
    missing = [s for s in every if not ses.index.has(s)]
    if missing:
        raise ForensicsError(
            f"plan {case.plan_path}: no batch for step(s) {missing[:5]}; the plan covers steps "
            f"{min(ses.index.samples_of)}-{max(ses.index.samples_of)}"
        )
    ses.check_vocabulary(every)
    exclude = known_spikes(findings) | set(every)
    results: list[dict[str, Any]] = []
    done: list[ReplayGroup] = []
    not_reached: list[ReplayGroup] = []
    with _Progress(opt.progress) as bar:
        for g in groups:
            if not _affordable(ses, opt, g.steps, exclude, t0):
                not_reached.append(g)
                continue
            results += [
                r | {"role": "suspect"} | ({"cause": g.cause, "cause_key": g.key} if g.cause else {})
                for r in _replay_group(ses, g.steps, exclude, offset, bar)
            ]
            done.append(g)
        if opt.control_step and done:
            first = done[0].steps[0]
            c = control_step(
                first,
                set(every),
                ses.index,
                lambda t: ses.checkpoint_for(t) is not None and not ses.checkpoint_for(t)[1],
                ses.logged,
                exclude,
            )
            if c is not None and _affordable(ses, opt, [c], exclude, t0):
                results += [
                    r | {"role": "control", "control_of": first}
                    for r in _replay_group(ses, [c], exclude - {c}, offset, bar)
                ]
    if opt.rerun:
        _rerun(ses, opt, results, exclude, findings, bar, t0)
    warnings = ses.warnings + notes
    result = ReplayResult(
        steps=json_safe(sorted(results, key=lambda d: d["step"])),
        device=ses.device,
        dtype=ses.dtype,
        forwards=ses.fwd.forwards,
        tokens_forwarded=ses.fwd.tokens,
        warnings=warnings,
        logged_offset=offset,
        steps_as=opt.steps_as,
        forward_log=list(ses.forward_log),
        seconds=time.perf_counter() - t0,
        groups=[{"cause": g.cause, "kind": g.kind, "steps": g.steps} for g in done],
        not_replayed=[{"cause": g.cause, "kind": g.kind, "steps": g.steps} for g in not_reached],
        budget_s=opt.budget_s,
    )
    out = case.root / "replay" / "replay.json"
    merge_write(out, result)
    result.written.append(out)
    if opt.json_path:
        jp = Path(opt.json_path)
        jp.parent.mkdir(parents=True, exist_ok=True)
        jp.write_text(json.dumps(result.to_json(), indent=2, allow_nan=False) + "\n", encoding="utf-8")
        result.written.append(jp)
    return result


#: Forward-equivalents one re-run step costs (two passes, each a forward and a backward of the batch and the
#: signals), to judge the first re-run against the budget before any has been timed.
RERUN_FORWARDS_PER_STEP = 8


def _rerun(
    ses: ReplaySession,
    opt: ReplayOptions,
    results: list[dict[str, Any]],
    exclude: set[int],
    findings: dict | None,
    bar: Any,
    t0: float,
) -> None:
    """The segment re-run of the suspect steps, added to each entry as ``rerun`` (none for a step with no
    checkpoint at or before it): each cause's first step first (in the causes' order), then the rest, while the
    budget allows one more (the seconds per re-run step so far, else :data:`RERUN_FORWARDS_PER_STEP` forwards)."""
    from forensics.replay.rerun import rerun_step, segment_start

    suspects = [r for r in results if r.get("role") == "suspect"]
    firsts: dict[Any, dict[str, Any]] = {}
    for r in suspects:
        firsts.setdefault(r.get("cause", id(r)), r)
    order = list(firsts.values()) + [r for r in suspects if r not in firsts.values()]
    bar.add(len(order))
    spent = steps_done = 0.0
    for r in order:
        s = int(r["step"])
        ck = segment_start(ses.checkpoints, s)
        n = s - ck.step + 1 if ck is not None else 0
        if opt.budget_s is not None and n:
            per = spent / steps_done if steps_done else (ses.seconds_per_forward() or 0.0) * RERUN_FORWARDS_PER_STEP
            if time.perf_counter() - t0 + per * n > opt.budget_s:
                ses.warnings.append(f"--rerun: step {s} not re-run; the replay budget ({opt.budget_s:g} s) was spent")
                bar.advance(f"re-run to step {s} skipped")
                continue
        started = time.perf_counter()
        try:
            found = rerun_step(ses, s, exclude, findings)
        except ForensicsError as exc:
            if not opt.rerun_optional:
                raise
            ses.warnings.append(f"{exc}; not re-run" if str(exc).startswith("--rerun") else f"--rerun: {exc}")
            found = None
        if found is not None:
            r["rerun"] = found
            spent += time.perf_counter() - started
            steps_done += n
        bar.advance(f"re-run to step {s}")


def _groups(
    opt: ReplayOptions, ses: ReplaySession, findings: dict | None, offset: int, root: Path
) -> tuple[list[ReplayGroup], list[str]]:
    """The groups to replay and the notes to say about them (which numbering the steps were read in)."""
    notes: list[str] = []
    if opt.groups is not None:
        return list(opt.groups), notes
    if opt.from_findings:
        if findings is None:
            raise ForensicsError(
                f"--from-findings: {root / 'findings.json'} does not exist; run forensics audit {root} first"
            )
        if "causes" in findings:
            groups = cause_groups(findings, ses.index.has, opt.max_causes)
            if not groups:
                raise ForensicsError(
                    f"--from-findings: {root / 'findings.json'} holds no cause with a batch to "
                    "replay (the run-level causes have none)"
                )
            for g in groups:
                if g.skipped:
                    notes.append(f"cause {g.cause}: steps {g.skipped[:5]} have no batch in the plan; not replayed")
            return groups, notes
        steps = spike_steps(findings)
        if not steps:
            raise ForensicsError(f"--from-findings: {root / 'findings.json'} holds no spike to replay")
        return [ReplayGroup([s]) for s in steps], notes
    steps = sorted(set(opt.steps or []))
    if not steps:
        raise ForensicsError("replay: name the steps (--steps 254,258) or use --from-findings")
    if opt.steps_as == "logged":
        canonical = to_canonical(steps, "logged", offset)
        notes.append(
            f"--steps read as logged steps (the run's own numbering): {', '.join(map(str, steps))} -> "
            f"canonical {', '.join(map(str, canonical))} (logged = canonical + {offset})"
        )
        steps = canonical
    elif offset:
        notes.append(
            f"--steps read as canonical 0-based steps (the run logs them as step + {offset}; "
            "--steps-as logged reads the run's own numbers)"
        )
    return [ReplayGroup(steps)], notes


def _affordable(ses: ReplaySession, opt: ReplayOptions, steps: list[int], exclude: set[int], t0: float) -> bool:
    """Whether a group of ``steps`` fits the rest of the budget (always, without one)."""
    if opt.budget_s is None:
        return True
    elapsed = time.perf_counter() - t0
    if elapsed >= opt.budget_s:
        return False
    per = ses.seconds_per_forward()
    if not per:
        return True
    n = sum(len(ReplaySession.pairs(ses.plan(s, exclude))) for s in steps) * len(ses.compare_seeds)
    return elapsed + per * n <= opt.budget_s


def _replay_group(ses: ReplaySession, steps: list[int], exclude: set[int], offset: int, bar: Any) -> list[dict]:
    """Plan, run and decide one group of steps (module docstring)."""
    plans = {s: ses.plan(s, exclude) for s in steps}
    needed = sorted({(c, t, k) for p in plans.values() for c, t in ReplaySession.pairs(p) for k in ses.compare_seeds})
    bar.add(len(needed))
    probes: dict[int, dict[str, Any]] = {}
    for ck in sorted({c for c, _, _ in needed}):
        state = ses.load(ck)
        for _, t, k in (x for x in needed if x[0] == ck):
            ses.forward(ck, t, k)
            bar.advance(f"checkpoint {ck}, step {t}")
        for s, p in plans.items():
            if p.ck == ck:
                probes[s] = _probes(ses, p, state)
    trains = _train_pass(ses, [p for p in plans.values() if ses.eval_misses(p, batch_loss)], probes, bar)
    doc_freq, n_docs = ses.tokens.document_frequency()
    return [step_result(ses, plans[s], probes.get(s, {}), trains.get(s), doc_freq, n_docs, offset) for s in steps]


def _train_pass(ses: ReplaySession, plans: list[StepPlan], probes: dict[int, dict], bar: Any) -> dict[int, TrainReplay]:
    """The train-mode replay over the dropout seeds of each step whose eval-mode replay missed (with its
    calibration steps, and the first seed again as the determinism check)."""
    needed = sorted(
        {
            (c, t, k)
            for p in plans
            for c, t in [(p.ck, p.step), *p.cal, *((c, t) for t, c in p.neigh.values())]
            for k in ses.seeds
        }
    )
    bar.add(len(needed) + len(plans))
    for ck in sorted({c for c, _, _ in needed}):
        ses.load(ck)
        for _, t, k in (x for x in needed if x[0] == ck):
            ses.forward(ck, t, k)
            bar.advance(f"checkpoint {ck}, step {t}, seed {k}")
        for p in (p for p in plans if p.ck == ck):
            first = ses.cache[(ck, p.step, ses.seeds[0])]
            again = ses.fwd.losses([ses.tokens[i] for i in ses.index.samples_of[p.step]], ses.seeds[0])
            ses.forward_log.append((ck, p.step, ses.seeds[0]))
            diff = max((abs(a.mean - b.mean) for a, b in zip(first, again, strict=False) if a.count), default=0.0)
            probes.setdefault(p.step, {}).setdefault("determinism", {"max_abs_diff": 0.0, "equal": True})["train"] = {
                "seed": ses.seeds[0],
                "max_abs_diff": diff,
                "equal": bool(diff <= 1e-5 * max(1.0, batch_loss(first, ses.denom))),
            }
            bar.advance(f"checkpoint {ck}, step {p.step}, seed {ses.seeds[0]} again")
    out = {}
    for p in plans:
        losses = [batch_loss(ses.cache[(p.ck, p.step, k)], ses.denom) for k in ses.seeds]
        out[p.step] = TrainReplay(list(ses.seeds), losses, ses.calibration_errors(p, batch_loss, ses.seeds))
    return out


def _probes(ses: ReplaySession, p: StepPlan, state: dict) -> dict[str, Any]:
    """Determinism, gradient and update probes of step ``p.step`` at its checkpoint (the weights are loaded)."""
    opt, fwd, tokens, index = ses.opt, ses.fwd, ses.tokens, ses.index
    seqs = [tokens[i] for i in index.samples_of[p.step]]
    seed = ses.compare_seeds[0]
    first = ses.cache[(p.ck, p.step, seed)]
    out: dict[str, Any] = {"determinism": determinism(fwd, seqs, first, ses.fwd2, seed)}
    ses.forward_log.append((p.ck, p.step, seed))
    if not opt.probes:
        return out
    g = {"suspect": grad_norm(fwd, seqs, ses.denom)}
    g["controls"] = {
        kind: [grad_norm(fwd, [tokens[i] for i in index.samples_of[t]], ses.denom) for t in getattr(p, key)]
        for kind, key in (("same_bucket", "same"), ("other_buckets", "other"))
    }
    g["z"] = zscore(g["suspect"], g["controls"]["same_bucket"])
    out["gradient"] = g
    from forensics.replay.checkpoints import apply_state, load_optimizer_state

    ck = ses.by_step[p.ck]
    opt_state = load_optimizer_state(ck) if not p.after else None
    samples = ses.samples
    if opt_state is not None and samples is not None:
        own = set(index.samples_of[p.step])
        sets = probe_sets(samples, own, opt.seed)
        col = "cluster" if "cluster" in samples.columns else ("source" if "source" in samples.columns else None)
        if len(sets) >= 2 and col is not None:
            used = own | {i for ids in sets.values() for i in ids}
            mixed = mixed_batch(samples, col, sum(len(x) for x in seqs), used, opt.seed)
            probe = update_probe(
                fwd,
                opt_state,
                lambda: apply_state(ses.model.module, state, ck.path),
                seqs,
                [tokens[i] for i in mixed],
                {c: [tokens[i] for i in ids] for c, ids in sets.items()},
                ses.denom,
            )
            if probe is not None:
                out["update_probe"] = probe
    return out


class _Progress:
    """A rich progress bar on stderr over the forwards (only when asked: the library stays quiet by default)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self._bar, self._task = enabled, None, None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("replay"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=0)
        return self

    def add(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, total=(self._bar.tasks[0].total or 0) + n)

    def advance(self, what: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=what)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
