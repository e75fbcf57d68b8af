"""Options and output helpers shared by the commands (kept here so each command module stays short)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from forensics.schema import RANK_SPLITS


def add_command(sub: Any, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` ends with a worked example."""
    return sub.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_step_mapping_options(p: argparse.ArgumentParser) -> None:
    """``--grad-accum``, ``--world-size``, ``--rank-split``, ``--step-offset`` (defaults: run.toml's, else 1/1/rr/0)."""
    p.add_argument("--grad-accum", type=int, default=None, metavar="G", help="micro-batches per optimizer step")
    p.add_argument("--world-size", type=int, default=None, metavar="W", help="data-parallel ranks")
    p.add_argument("--rank-split", choices=RANK_SPLITS, default=None,
                   help="round_robin: one batch stream shared by the ranks; per_rank: one stream per rank")
    p.add_argument("--step-offset", type=int, default=None, metavar="N",
                   help="metrics step = logged step - N (a log counting from 1 takes N = 1)")


def console(stderr: bool = False) -> Console:
    """A rich console: colours on a terminal, plain text when piped."""
    return Console(file=sys.stderr if stderr else sys.stdout, highlight=False, soft_wrap=True)


def write_json(obj: Any, path: str | Path) -> None:
    """Write JSON (NaN/inf as null would lose meaning, so they are written as strings by the caller's model)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n", encoding="utf-8")
