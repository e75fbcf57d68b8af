"""``forensics replay``: run suspect steps' batches through the run's checkpoints, print each verdict, and merge them
into the case's findings.json and report when an audit wrote them."""

from __future__ import annotations

import argparse

from forensics.cli.common import add_command, add_steps_as_option, console, stage
from forensics.errors import ForensicsError


def register(sub) -> None:
    p = add_command(
        sub,
        "replay",
        "Prove or refute each suspect step by replaying its batch through the run's "
        "checkpoints (needs the [replay] extra).",
        "forensics replay CASE --from-findings",
    )
    p.add_argument(
        "case",
        help="case folder (plan, samples with input_ids, metrics, checkpoints; an HF Trainer "
        "output folder works as one)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--steps",
        "--step",
        dest="steps",
        default=None,
        metavar="S[,S]...",
        help="steps to replay, comma-separated (canonical 0-based unless --steps-as logged)",
    )
    which.add_argument(
        "--from-findings",
        action="store_true",
        help="every cause of CASE/findings.json with a batch (loss or grad norm), most urgent first; re-run "
        "from the checkpoints when they hold optimizer state, within run.toml's [replay] budget, as audit --replay "
        "does",
    )
    add_steps_as_option(p)
    p.add_argument(
        "--max-causes",
        type=int,
        default=None,
        metavar="N",
        help="with --from-findings: the N most urgent causes only (default: run.toml [replay] max_causes, else all)",
    )
    p.add_argument(
        "--checkpoints",
        default=None,
        metavar="DIR",
        help="checkpoints (default: run.toml 'checkpoints', else the case's checkpoint-N/ folders)",
    )
    p.add_argument(
        "--model",
        default=None,
        metavar="M",
        help="HF model folder, or module:factory (default: run.toml 'model', or a checkpoint's config)",
    )
    p.add_argument(
        "--tokens",
        default=None,
        metavar="T",
        help="tokens per sample: Parquet with sample_id + input_ids, or X.npy with X.offsets.npy",
    )
    p.add_argument("--device", default=None, help="cpu, cuda or auto (default: run.toml [replay] device, else auto)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16"),
        help="float32 (default on CPU) or bfloat16 autocast (default on CUDA)",
    )
    p.add_argument(
        "--mode",
        default=None,
        choices=("eval", "train"),
        help="compare suspect and controls in eval mode (default; the logged loss is still reproduced in "
        "train mode when the model has dropout) or in train mode over the dropout seeds",
    )
    p.add_argument(
        "--seeds", type=int, default=None, metavar="N", help="dropout seeds of a train-mode replay (default 3)"
    )
    p.add_argument(
        "--controls",
        type=int,
        default=8,
        metavar="K",
        help="control batches per kind: K of the same bucket, K of others (default 8)",
    )
    p.add_argument(
        "--no-control-step", action="store_true", help="do not replay a clean same-bucket step beside the suspects"
    )
    p.add_argument(
        "--max-tokens-per-forward",
        type=int,
        default=16_384,
        metavar="N",
        help="padded tokens per forward pass (default 16384; split again on out-of-memory)",
    )
    p.add_argument(
        "--second-device",
        default=None,
        metavar="D",
        help="determinism: also run the suspect batch on this device (cpu, cuda)",
    )
    p.add_argument(
        "--second-dtype",
        default=None,
        choices=("float32", "bfloat16"),
        help="determinism: also run the suspect batch in this dtype",
    )
    p.add_argument("--no-probes", action="store_true", help="skip the gradient and update probes (loss only)")
    p.add_argument(
        "--rerun",
        action="store_true",
        help="also re-run the optimizer steps from the checkpoint before each step (weights, optimizer, "
        "RNG state; the plan's batches, the logged lr): per-group signals, a replaced-batch "
        "counterfactual, determinism, per-sample gradient norms and a cause class (--from-findings does "
        "this when the checkpoints hold optimizer state; --rerun makes a re-run that cannot run an error)",
    )
    p.add_argument("--json", default=None, metavar="F", help="also write replay.json to F")
    p.set_defaults(func=run)


def parse_steps(text: str | None) -> list[int] | None:
    """``"254,258"`` -> ``[254, 258]``."""
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise ForensicsError(f"--steps: expected comma-separated step numbers like 254,258; got {text!r}") from exc


def run(args: argparse.Namespace) -> int:
    from forensics.pipeline.replay_loop import replay_budget, rerun_plan
    from forensics.replay import ReplayOptions, replay_case
    from forensics.schema import open_case

    if args.json and not args.json.endswith(".json"):
        raise ForensicsError(f"--json {args.json}: replay writes .json only")
    case = open_case(args.case)
    rerun, rerun_optional = rerun_plan(case, args.rerun, args.from_findings)
    opts = ReplayOptions(
        steps=parse_steps(args.steps),
        from_findings=args.from_findings,
        max_causes=args.max_causes,
        steps_as=args.steps_as,
        checkpoints=args.checkpoints,
        model=args.model,
        tokens=args.tokens,
        device=args.device,
        dtype=args.dtype,
        controls=args.controls,
        mode=args.mode,
        seeds=args.seeds,
        max_tokens_per_forward=args.max_tokens_per_forward,
        json_path=args.json,
        progress=True,
        second_device=args.second_device,
        second_dtype=args.second_dtype,
        probes=not args.no_probes,
        control_step=not args.no_control_step,
        rerun=rerun,
        rerun_optional=rerun_optional,
        budget_s=replay_budget(case) if args.from_findings else None,
    )
    result = replay_case(case, opts)
    err = console(stderr=True)
    for w in result.warnings:
        err.print(f"note: {w}", markup=False)
    from pathlib import Path

    from forensics.pipeline.replay_loop import merge_into_audit

    written = []
    if (Path(args.case) / "findings.json").is_file():
        with stage("merging the verdicts into findings.json and the report"):
            written = merge_into_audit(args.case, result)
        _renumber(result, Path(args.case) / "findings.json")
    print_result(console(), result)
    console().print("written: " + ", ".join(str(p) for p in [*result.written, *written]), markup=False)
    return 0


def _renumber(result, findings_path) -> None:
    """Name each replayed cause by its id in the merged findings.json (the merge ranks the causes again)."""
    import json

    try:
        causes = json.loads(findings_path.read_text(encoding="utf-8")).get("causes") or []
    except (OSError, ValueError):
        return
    ids = {c.get("key"): c.get("id") for c in causes if isinstance(c, dict)}
    for d in result.steps:
        if d.get("cause_key") in ids:
            d["cause"] = ids[d["cause_key"]]


def print_result(out, result) -> None:
    """The verdict table and each step's evidence (plain text: dataset-derived values never pass through markup,
    and the table is never wrapped)."""
    out.print(
        f"replay on {result.device} ({result.dtype}): {len(result.steps)} steps, {result.forwards} forwards, "
        f"{result.seconds:.1f} s",
        markup=False,
    )
    frame = _table(result)
    if len(frame):
        out.print(frame.to_string(index=False, justify="left"), markup=False, soft_wrap=True, crop=False)
    for d in result.steps:
        out.print(
            f"step {d['step']} ({d['verdict']}, confidence {float(d.get('confidence') or 0):.2f}): "
            + " ".join(d.get("evidence", [])),
            markup=False,
        )
        r = d.get("rerun")
        if isinstance(r, dict):
            first = f"; first group to move: {r['first_group']}" if r.get("first_group") else ""
            cls = f"cause class {r['cause_class']}" if r.get("cause_class") else "no cause class (no spike)"
            act = f" Action: {r['action']}" if r.get("action") else ""
            out.print(
                f"step {d['step']} re-run, {cls}{first}: {'; '.join(r.get('evidence', [])[:-1])}.{act}", markup=False
            )
    for g in result.not_replayed:
        out.print(
            f"not replayed (budget {result.budget_s:g} s): cause {g['cause']} (steps "
            f"{', '.join(map(str, g['steps']))})",
            markup=False,
        )


def _table(result):
    from forensics.replay.result import steps_table

    return steps_table(result)
