"""``forensics skip``: the steps and samples the audit blames, in the formats trainers read. Parse, call
:mod:`forensics.integrations.skip_lists`, render (the list on stdout or ``-o``, what it holds on stderr)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from forensics.cli.common import add_command, console

EXAMPLE = (
    "forensics skip forensics-demo/static --format megatron   (then: --iterations-to-skip $(...))\n"
    "  forensics skip forensics-demo/static --format ids --min-severity warning -o skip.json\n"
    '  # in the training script: train_ds = forensics.integrations.exclude_samples(train_ds, "skip.json")'
)


def register(sub) -> None:
    p = add_command(
        sub,
        "skip",
        "Export the steps and samples an audit blames, to train past them: Megatron-LM's "
        "--iterations-to-skip, a sample-id list for exclude_samples, or plain steps.",
        EXAMPLE,
    )
    p.add_argument(
        "case", metavar="CASE", help="a case folder with findings.json (from `forensics audit`), or a findings.json"
    )
    p.add_argument(
        "--format",
        required=True,
        choices=("megatron", "ids", "steps"),
        help='megatron: steps space-separated for --iterations-to-skip; ids: {"sample_ids": [...], '
        '"why": {...}} JSON; steps: one per line',
    )
    p.add_argument(
        "--min-severity",
        choices=("info", "warning", "critical"),
        default="critical",
        help="take causes at this severity or above (default: critical)",
    )
    p.add_argument(
        "--all-verdicts",
        action="store_true",
        help="when the causes were replayed, take them whatever the verdict (default: only 'data')",
    )
    p.add_argument(
        "--megatron-indexing",
        choices=("logged", "zero"),
        default="logged",
        help="logged: the iteration Megatron prints (core_v0.17.0 and later test iteration + 1); "
        "zero: the updates done before it (core_v0.12.0 to core_v0.16.x test iteration). "
        "Default: logged",
    )
    p.add_argument(
        "--steps-as",
        choices=("canonical", "logged"),
        default="canonical",
        help="--format steps: canonical 0-based steps (default) or as the run logs them",
    )
    p.add_argument("-o", "--output", default=None, metavar="F", help="write the list to F (default: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from forensics.integrations.skip_lists import (
        ids_document,
        megatron_steps,
        read_findings,
        skip_list,
        step_lines,
    )

    err = console(stderr=True)
    findings, path = read_findings(args.case)
    skip = skip_list(findings, min_severity=args.min_severity, all_verdicts=args.all_verdicts, source=str(path))
    if not skip.taken:
        err.print(f"nothing to skip: no data cause at {args.min_severity} or above in {path}", markup=False)
        for cid, reason in skip.left_out:
            err.print(f"  left out {cid}: {reason}", markup=False)
        return 0
    if args.format == "megatron":
        steps = megatron_steps(skip, args.megatron_indexing)
        text = " ".join(str(s) for s in steps) + "\n"
        header = skip.header() + [f"Megatron --iterations-to-skip, {args.megatron_indexing} indexing"]
    elif args.format == "ids":
        text = json.dumps(ids_document(skip), indent=2) + "\n"
        header = skip.header()
    else:
        text = "\n".join(step_lines(skip, args.steps_as)) + "\n"
        header = skip.header() if args.output else []  # on stdout the list carries it as comments
    for line in header:  # the list itself stays clean for $(...) and json.load; what it holds goes to stderr
        err.print(line, markup=False)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        err.print(f"wrote {out}", markup=False)
    else:
        console().file.write(text)
    return 0
