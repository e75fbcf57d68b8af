"""Options and output helpers shared by the commands (kept here so each command module stays short)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from forensics.schema import RANK_SPLITS, Case, open_case

if TYPE_CHECKING:
    from rich.console import Console

#: Flags whose value is a key of the run configuration (argparse dest -> RunConfig key).
CONFIG_FLAGS = (
    "metrics",
    "plan",
    "samples",
    "grad_accum",
    "world_size",
    "rank_split",
    "step_offset",
    "step_key",
    "logging_steps",
    "loss_key",
    "boundaries",
    "n_buckets",
    "clusters",
    "cluster_by",
    "token_budget",
    "max_len",
    "max_batch_size",
    "model",
    "checkpoints",
    "engine",
    "memory_limit",
    "scheduler",
)


def add_command(sub: Any, name: str, summary: str, example: str) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` ends with a worked example."""
    p = sub.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(_parser=p)
    return p


def add_case_argument(p: argparse.ArgumentParser, what: str = "its inputs") -> None:
    """The optional CASE folder and ``--set KEY=VALUE`` (any run.toml key, e.g. grad_accum=2, detect.spikes.z=5)."""
    p.add_argument("case", nargs="?", help=f"case folder (run.toml, plan.parquet, samples.parquet, ...): {what}")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a run.toml key (repeatable), e.g. --set grad_accum=2 --set detect.spikes.z=5",
    )


def open_case_from(args: argparse.Namespace) -> Case:
    """The case the command's arguments name: the folder's run.toml, then ``--set``, then the flags."""
    overrides = {key: getattr(args, key) for key in CONFIG_FLAGS if getattr(args, key, None) is not None}
    return open_case(getattr(args, "case", None), sets=getattr(args, "set", None) or [], overrides=overrides)


def flag_for(parser: argparse.ArgumentParser | None, key: str) -> str | None:
    """The option string that sets configuration key ``key`` in ``parser`` (``grad_accum`` -> ``--grad-accum``)."""
    for action in getattr(parser, "_actions", []):
        if action.dest == key and action.option_strings:
            return max(action.option_strings, key=len)
    return None


def clusters_option(text: str) -> int | str | None:
    """``--clusters K|auto``: a number of clusters, or None for auto (the configuration checks the value)."""
    if text == "auto":
        return None
    return int(text) if text.strip().lstrip("-").isdigit() else text


def add_mlflow_uri_option(p: argparse.ArgumentParser) -> None:
    """``--mlflow-uri``: where ``mlflow:RUN_ID`` sources live (default ``MLFLOW_TRACKING_URI``)."""
    p.add_argument(
        "--mlflow-uri",
        default=None,
        metavar="URI",
        help="MLflow tracking URI of mlflow:RUN_ID sources: a server, sqlite:///mlflow.db or a mlruns/ "
        "folder (default: MLFLOW_TRACKING_URI)",
    )


def use_mlflow_uri(args: argparse.Namespace) -> None:
    """Make ``--mlflow-uri`` the tracking URI the MLflow reader sees (this process's ``MLFLOW_TRACKING_URI``), so
    every reader of the command, however deep, reads the same one."""
    if getattr(args, "mlflow_uri", None):
        os.environ["MLFLOW_TRACKING_URI"] = args.mlflow_uri


def add_step_mapping_options(p: argparse.ArgumentParser) -> None:
    """``--grad-accum``, ``--world-size``, ``--rank-split``, ``--step-offset`` (defaults: run.toml's, else 1/1/rr/0)."""
    p.add_argument("--grad-accum", type=int, default=None, metavar="G", help="micro-batches per optimizer step")
    p.add_argument("--world-size", type=int, default=None, metavar="W", help="data-parallel ranks")
    p.add_argument(
        "--rank-split",
        choices=RANK_SPLITS,
        default=None,
        help="round_robin: one batch stream shared by the ranks; per_rank: one stream per rank",
    )
    p.add_argument(
        "--step-offset",
        type=int,
        default=None,
        metavar="N",
        help="metrics step = logged step - N (a log counting from 1 takes N = 1)",
    )


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """``--engine``, ``--memory-limit``, ``--scheduler``: where the plan computations run (default: run.toml's,
    else ``auto``: pandas while the plan's Arrow size is under a quarter of the memory limit, DuckDB beyond)."""
    p.add_argument(
        "--engine",
        choices=("auto", "pandas", "duckdb", "dask"),
        default=None,
        help="where the plan computations run (default auto: pandas in memory, DuckDB past memory)",
    )
    p.add_argument(
        "--memory-limit",
        default=None,
        metavar="SIZE",
        help="memory the engine may use, e.g. 4GB (default: half the available memory)",
    )
    p.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="the Dask scheduler of --engine dask, e.g. tcp://10.0.0.5:8786 (default: a local cluster)",
    )


def add_steps_as_option(p: argparse.ArgumentParser) -> None:
    """``--steps-as logged|canonical``: which numbering the steps a user types are in (docs/concepts.md)."""
    p.add_argument(
        "--steps-as",
        choices=("canonical", "logged"),
        default="canonical",
        help="the steps given are canonical 0-based steps (default) or the run's logged steps "
        "(HF global_step = canonical + 1)",
    )


def console(stderr: bool = False, *, for_rich: bool = False) -> Console | PipedConsole:
    """A rich console on a terminal (colours, spinners); a :class:`PipedConsole` when the stream is not one, unless
    ``for_rich`` (what rich's own objects, a progress bar, are given)."""
    stream = sys.stderr if stderr else sys.stdout
    if for_rich or _is_terminal(stream):
        from rich.console import Console

        return Console(file=stream, highlight=False, soft_wrap=True)
    return PipedConsole(stream)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty()) or bool(os.environ.get("FORCE_COLOR"))
    except ValueError:  # a closed stream
        return False


class PipedConsole:
    """What a command prints to a pipe or a file: rich's markup read and dropped (``rich.markup``: its escapes and
    emoji codes as a rich console treats them), one line per print, never wrapped. rich's console itself is made only
    for what is not text (a table), which is what makes a piped command's start ~15 ms shorter (its import)."""

    is_terminal = False

    def __init__(self, file: TextIO) -> None:
        self.file = file
        self._rich: Console | None = None

    def print(
        self,
        *objects: Any,
        sep: str = " ",
        end: str = "\n",
        markup: bool | None = None,
        highlight: bool | None = None,
        **options: Any,
    ) -> None:
        if options or not all(isinstance(o, str) for o in objects):
            self.rich.print(*objects, sep=sep, end=end, markup=markup, highlight=highlight, **options)
            return
        text = sep.join(objects)
        if markup is not False:
            from rich.markup import render

            text = render(text).plain
        self.file.write(text + end)
        self.file.flush()  # as rich does: a stream the OS refuses fails here, where the command reports it

    @property
    def rich(self) -> Console:
        if self._rich is None:
            from rich.console import Console

            self._rich = Console(file=self.file, highlight=False, soft_wrap=True)
        return self._rich

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich, name)


def write_json(obj: Any, path: str | Path) -> None:
    """Write JSON (NaN/inf as null would lose meaning, so they are written as strings by the caller's model)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, allow_nan=False) + "\n", encoding="utf-8")


class StageNote:
    """What a stage adds to its line (``detail``: a few words, e.g. where inside it the time went)."""

    detail: str = ""


def _stage_line(name: str, note: StageNote, t0: float) -> str:
    """``name (detail): T s``: the time last, as every stage line ends, for a log reader looking for the times."""
    return f"{name}{f' ({note.detail})' if note.detail else ''}: {time.perf_counter() - t0:.1f} s"


@contextmanager
def stage(name: str) -> Iterator[StageNote]:
    """One stage of a long command: a spinner on a terminal, and always one line with its elapsed time on stderr
    (so CI logs show where the time goes), with the note's ``detail`` after its name when the stage set one."""
    err = console(stderr=True)
    t0 = time.perf_counter()
    note = StageNote()
    with err.status(f"{name} ...") if err.is_terminal else nullcontext():
        yield note
    err.print(_stage_line(name, note, t0), style="dim" if err.is_terminal else None, markup=False, highlight=False)


@contextmanager
def stage_progress(name: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """A stage whose work is counted: ``update(done, total=None)``; a bar on a terminal (shown only once work is
    reported), else one line with the elapsed time when the stage reported any work."""
    err = console(stderr=True)
    t0 = time.perf_counter()
    state: dict[str, Any] = {"bar": None, "task": None, "total": total, "used": False}

    def update(done: int, total: int | None = None) -> None:
        state["used"] = True
        if total is not None:
            state["total"] = total
        if not err.is_terminal:
            return
        if state["bar"] is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            state["bar"] = Progress(
                TextColumn(name), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True
            )
            state["bar"].start()
            state["task"] = state["bar"].add_task(name, total=state["total"])
        state["bar"].update(state["task"], completed=done, total=state["total"])

    try:
        yield update
    finally:
        if state["bar"] is not None:
            state["bar"].stop()
        if state["used"]:
            err.print(f"{name}: {time.perf_counter() - t0:.1f} s", markup=False, highlight=False)
