"""``forensics compare``: do the same spikes happen in another run? Parse, call :func:`forensics.compare.compare_runs`,
render (the terminal summary, compare.json, compare.html)."""

from __future__ import annotations

import argparse
from pathlib import Path

from forensics.cli.common import add_command, console, write_json

EXAMPLE = (
    "forensics compare forensics-demo/static forensics-demo/bucketed --json compare.json --html compare.html\n"
    "  forensics compare run_a/train.log run_b/train.log --same-order   (two logs, same data order, no plan)"
)


def register(sub) -> None:
    p = add_command(
        sub,
        "compare",
        'Compare the loss spikes of two or more runs (the first is "before"): '
        "recurring, vanished or unique, by step or by data position.",
        EXAMPLE,
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="a case folder or a metrics source (log file, W&B or TensorBoard folder); two or more",
    )
    p.add_argument(
        "--by",
        choices=("step", "data"),
        default=None,
        help="align spikes by step, or by data position (the samples consumed; needs plans). "
        "Default: data when every run has a plan, else step",
    )
    p.add_argument(
        "--same-order", action="store_true", help="the runs read the data in the same order (for runs without a plan)"
    )
    p.add_argument(
        "--name",
        action="append",
        default=None,
        metavar="NAME",
        help="a name per RUN, in order (repeatable; default: the folder or file names)",
    )
    p.add_argument(
        "--json",
        default=None,
        metavar="F",
        help="write compare.json to F; as CASE/compare.json of a case compared, that case's next audit "
        "counts a recurring spike as data evidence and a unique one (same data, no spike) against",
    )
    p.add_argument("--html", default=None, metavar="F", help="write compare.html (curves and spike classes) to F")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from forensics.compare import compare_runs

    err = console(stderr=True)
    result = compare_runs(args.runs, names=args.name, by=args.by, same_order=args.same_order, stage=None)
    for w in result.warnings:
        err.print(f"warning: {w}", markup=False)
    out = console()
    for line in result.lines():
        out.print(line, markup=False)
    if args.json:
        doc = result.to_json()
        this_run = next(
            (
                r.name
                for r in result.runs
                if r.case is not None and Path(r.case).resolve() == Path(args.json).resolve().parent
            ),
            None,
        )
        if this_run is not None:  # left in a case folder: that case's next audit weighs its causes with it
            doc["this_run"] = this_run
        write_json(doc, args.json)
        err.print(
            f"wrote {args.json}"
            + (
                f" (the next `forensics audit {Path(args.json).parent}` counts its classes as evidence)"
                if this_run
                else ""
            ),
            markup=False,
        )
    if args.html:
        from forensics.compare.html import write_compare_html

        path = write_compare_html(args.html, result)
        err.print(f"wrote {path}", markup=False)
    return 0
