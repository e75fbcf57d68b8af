"""``forensics dashboard [CASE | SOURCE...] [--host H] [--port P]``: serve the Streamlit dashboard, headless.

The same as ``streamlit run app.py -- [CASE | SOURCE...]``: it runs the app module inside the package (so it works
after ``pip install``), bound to 127.0.0.1 unless ``--host`` says otherwise, with no browser opened. Options that
start with ``--server.``, ``--browser.``, ``--theme.``, ``--client.``, ``--runner.`` or ``--logger.`` go to
streamlit unchanged (``--server.port`` like ``--port``).
"""

from __future__ import annotations

import argparse
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from forensics.cli.common import add_command
from forensics.errors import ForensicsError

#: Streamlit option groups passed through untouched.
PASS_THROUGH = ("--server.", "--browser.", "--theme.", "--client.", "--runner.", "--logger.")
DEFAULT_HOST = "127.0.0.1"


def split_streamlit_options(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(ours, streamlit's)``: ``--server.port 8600`` and ``--server.port=8600`` both go to streamlit."""
    ours: list[str] = []
    theirs: list[str] = []
    args = list(args)
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith(PASS_THROUGH):
            theirs.append(a)
            if "=" not in a and i + 1 < len(args) and not args[i + 1].startswith("--"):
                theirs.append(args[i + 1])
                i += 1
        else:
            ours.append(a)
        i += 1
    return ours, theirs


def register(sub) -> None:
    p = add_command(
        sub,
        "dashboard",
        "Serve the live dashboard of a run (Streamlit), on 127.0.0.1 by default.",
        "forensics dashboard forensics-demo/static --port 8501",
    )
    p.add_argument(
        "targets",
        nargs="*",
        metavar="CASE | SOURCE",
        help="a case folder, or metrics sources (log files, a W&B folder or run path); none: the demo",
    )
    p.add_argument("--host", default=None, metavar="H", help=f"address to bind (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=None, metavar="P", help="port (default: streamlit's, 8501)")
    p.add_argument("--print-command", action="store_true", help="print the streamlit command instead of running it")
    p.set_defaults(func=run, streamlit_options=[])

    # streamlit's own options are not declared here (there are dozens): take them out before argparse sees them;
    # targets after an option (``--host h CASE``) come back as extras and are targets too
    def parse_known_args(self, args=None, namespace=None):
        ours, theirs = split_streamlit_options(sys.argv[1:] if args is None else args)
        ns, extra = argparse.ArgumentParser.parse_known_args(self, ours, namespace)
        ns.streamlit_options = theirs
        late = [a for a in extra if not a.startswith("-")]
        ns.targets = list(ns.targets or []) + late
        return ns, [a for a in extra if a.startswith("-")]

    p.parse_known_args = types.MethodType(parse_known_args, p)


def streamlit_command(
    targets: Sequence[str], host: str | None = None, port: int | None = None, options: Sequence[str] = ()
) -> list[str]:
    """The ``python -m streamlit run <app> [options] -- [targets]`` command line."""
    from forensics.dashboard import app

    options = list(options)
    given = {o.split("=", 1)[0] for o in options if o.startswith("--")}
    cmd = [sys.executable, "-m", "streamlit", "run", str(Path(app.__file__).with_name("entry.py"))]
    if "--server.address" not in given:
        cmd += ["--server.address", host or DEFAULT_HOST]
    elif host:
        raise ForensicsError("dashboard: give --host or --server.address, not both")
    if port is not None:
        if "--server.port" in given:
            raise ForensicsError("dashboard: give --port or --server.port, not both")
        cmd += ["--server.port", str(port)]
    if "--server.headless" not in given:
        cmd += ["--server.headless", "true"]
    if "--browser.gatherUsageStats" not in given:
        cmd += ["--browser.gatherUsageStats", "false"]
    return cmd + options + ["--", *targets]


def run(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        raise ForensicsError("dashboard: streamlit is not installed; pip install 'loss-spike-forensics[dashboard]'")
    from forensics.dashboard.state import resolve_target

    if args.targets:
        resolve_target(args.targets)  # bad input fails here, in one line, before a server starts
    targets = [str(Path(t).resolve()) if Path(t).exists() else t for t in args.targets]
    cmd = streamlit_command(targets, args.host, args.port, args.streamlit_options)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    # replace this process: the server's pid is the command's, so stopping it stops the server
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover - execv does not return
