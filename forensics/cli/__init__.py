"""The ``forensics`` command: parse, call the library, render. Nothing else lives here.

Each command is a module of this package with ``register(subparsers)``; the module sets ``func`` on its parser.
Modules are discovered, so adding a command touches one file. Bad input (:class:`ForensicsError`) becomes one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import pkgutil
import sys

from forensics import __version__
from forensics.cli.common import flag_for
from forensics.errors import ForensicsError
from forensics.schema import ConfigError

#: The order commands are listed in ``forensics --help``; a discovered module not named here comes last.
ORDER = [
    "demo",
    "audit",
    "replay",
    "skip",
    "dashboard",
    "watch",
    "ingest",
    "tag",
    "buckets",
    "whatif",
    "check_plan",
    "validate",
    "compare",
]
_HELPERS = {"common"}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``command`` (a command's name as typed, e.g. ``check-plan``) only that command's
    module is imported and registered, so that a command never pays for the imports of the others (``--help`` and
    an unknown name still get every command)."""
    parser = argparse.ArgumentParser(
        prog="forensics",
        description="Why did the training loss spike? Joins step metrics to the batch plan, finds spikes and "
        "oscillation, and names the bucket, cluster, batch and samples behind them.",
        epilog="Start with:  forensics audit --demo   (builds the demo run on first use, then audits it)",
    )
    parser.add_argument("--version", action="version", version=f"forensics {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.name not in _HELPERS and not m.name.startswith("_")]
    names.sort(key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))
    if command is not None and "_" not in command and command.replace("-", "_") in names:
        names = [command.replace("-", "_")]
    for name in names:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def run() -> None:
    """The console script and ``python -m forensics``: :func:`main`, then a quick exit.

    A process that loaded the compiled spike kernel spends ~0.3 s after its work tearing down numba's and LLVM's
    modules (measured: 0.31 s against 0.11 s for numpy and pandas alone), a fifth of a metrics-only audit. The exit
    handlers still run (logging, temporary folders) and the standard streams are flushed; only the interpreter's
    module teardown is skipped. ``main()`` itself returns normally, for callers in Python.
    """
    import atexit
    import os

    code = main()
    try:
        run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
        if run_exit_handlers is not None:
            run_exit_handlers()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a full disk, a closed pipe: what Python's own exit reports as 120
                code = code or 120
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(args_list[0] if args_list and not args_list[0].startswith("-") else None)
    args = parser.parse_args(args_list)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        flag = flag_for(getattr(args, "_parser", None), exc.key) if exc.origin == "option" else None
        print(f"forensics: error: {flag}: {exc.problem}" if flag else f"forensics: error: {exc}", file=sys.stderr)
        return 2
    except ForensicsError as exc:
        print(f"forensics: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("forensics: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # what the machine refused: a full disk, a closed pipe, a folder not writable
        with contextlib.suppress(OSError):
            print(f"forensics: error: {exc.strerror or exc} ({exc.filename or 'output'})", file=sys.stderr)
        return 2
