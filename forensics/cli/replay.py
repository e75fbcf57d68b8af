"""``forensics replay``: run suspect steps' batches through the run's checkpoints and print each verdict."""

from __future__ import annotations

import argparse

from rich.table import Table

from forensics.cli.common import add_command, console
from forensics.errors import ForensicsError


def register(sub) -> None:
    p = add_command(sub, "replay", "Prove or refute each suspect step by replaying its batch through the run's "
                    "checkpoints (needs the [replay] extra).", "forensics replay CASE --steps 254,258")
    p.add_argument("case", help="case folder (plan, samples with input_ids, metrics, run.toml with model/checkpoints)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--steps", "--step", dest="steps", default=None, metavar="S[,S]...",
                       help="steps to replay, comma-separated")
    which.add_argument("--from-findings", action="store_true", help="the loss spikes' peak steps of CASE/findings.json")
    p.add_argument("--checkpoints", default=None, metavar="DIR", help="checkpoints (default: run.toml 'checkpoints')")
    p.add_argument("--model", default=None, metavar="M",
                   help="HF model folder, or module:factory (default: run.toml 'model', or the checkpoints' config)")
    p.add_argument("--tokens", default=None, metavar="T",
                   help="tokens per sample: Parquet with sample_id + input_ids, or X.npy with X.offsets.npy")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                   help="float32 (default on CPU) or bfloat16 autocast (default on CUDA)")
    p.add_argument("--controls", type=int, default=8, metavar="K",
                   help="control batches per kind: K of the same bucket, K of others (default 8)")
    p.add_argument("--max-tokens-per-forward", type=int, default=16_384, metavar="N",
                   help="padded tokens per forward pass (default 16384; split again on out-of-memory)")
    p.add_argument("--second-device", default=None, metavar="D",
                   help="determinism: also run the suspect batch on this device (cpu, cuda)")
    p.add_argument("--second-dtype", default=None, choices=("float32", "bfloat16"),
                   help="determinism: also run the suspect batch in this dtype")
    p.add_argument("--train-mode", action="store_true",
                   help="run the model in train mode (dropout on), as a run whose logged loss had dropout")
    p.add_argument("--no-probes", action="store_true", help="skip the gradient and update probes (loss only)")
    p.add_argument("--json", default=None, metavar="F", help="also write replay.json to F")
    p.set_defaults(func=run)


def _parse_steps(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError as exc:
        raise ForensicsError(f"--steps: expected comma-separated step numbers like 254,258; got {text!r}") from exc


def run(args: argparse.Namespace) -> int:
    from forensics.replay import ReplayOptions, replay_case
    from forensics.replay.result import steps_table

    if args.json and not args.json.endswith(".json"):
        raise ForensicsError(f"--json {args.json}: replay writes .json only")
    opts = ReplayOptions(steps=_parse_steps(args.steps), from_findings=args.from_findings,
                         checkpoints=args.checkpoints, model=args.model, tokens=args.tokens, device=args.device,
                         dtype=args.dtype, controls=args.controls, max_tokens_per_forward=args.max_tokens_per_forward,
                         json_path=args.json, progress=True, train_mode=args.train_mode,
                         second_device=args.second_device, second_dtype=args.second_dtype,
                         probes=not args.no_probes)
    result = replay_case(args.case, opts)
    out = console()
    for w in result.warnings:
        console(stderr=True).print(f"warning: {w}", markup=False)
    table = Table(title=f"replay on {result.device} ({result.dtype}), {result.forwards} forwards")
    frame = steps_table(result)
    for col in frame.columns:
        table.add_column(col, justify="left" if col in ("verdict", "top samples") else "right")
    for row in frame.itertuples(index=False):
        table.add_row(*[_cell(v) for v in row])
    out.print(table)
    for d in result.steps:
        out.print(f"step {d['step']} ({d['verdict']}): " + " ".join(d.get("evidence", [])), markup=False)
    out.print("written: " + ", ".join(str(p) for p in result.written))
    return 0


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)
