"""``forensics demo``: write the story's two case folders (``static/``, ``bucketed/``) and say what to run next."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from forensics.cli.common import add_command, console
from forensics.datasets import SCALES, build_demo


def register(sub) -> None:
    p = add_command(
        sub,
        "demo",
        "Write the demo run of the story: static/ (spikes at 254 and 258) and bucketed/.",
        "forensics demo --out forensics-demo && forensics audit forensics-demo/static",
    )
    p.add_argument("--out", default="forensics-demo", metavar="DIR", help="where to write (default ./forensics-demo)")
    p.add_argument(
        "--scale",
        choices=list(SCALES),
        default="full",
        help="full: ~52,000 steps over 6 epochs (default); small: a few thousand steps, same mechanism",
    )
    p.add_argument("--seed", type=int, default=0, metavar="K", help="seed of everything (default 0)")
    p.add_argument("--no-wandb", action="store_true", help="skip the W&B offline runs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    err = console(stderr=True, for_rich=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task("demo", total=1)

        def on_progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=max(total, 1))

        summary = build_demo(
            Path(args.out), scale=args.scale, seed=args.seed, wandb=not args.no_wandb, progress=on_progress
        )
    out = console()
    for case in summary["cases"].values():
        spikes = ", ".join(map(str, case["spike_steps"][:6])) or "none"
        out.print(
            f"wrote {case['path']}: {case['steps']} steps ({case['builder']}), "
            f"{case['mean_tokens_per_s']:,.0f} tok/s, labelled spikes at steps {spikes}"
        )
    if not summary["wandb"]:
        out.print("no W&B offline runs written (wandb not installed or --no-wandb)")
    out.print(f"{summary['n_samples']} samples, seed {summary['seed']}, {summary['seconds']['total']:.1f} s")
    out.print(f"next: forensics audit {Path(args.out) / 'static'}")
    return 0
