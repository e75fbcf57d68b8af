"""``forensics watch CASE_OR_SOURCE [--alert ...]...``: tail a live run and alert once per new cause.

Parses, builds the sinks and the options, and runs :class:`forensics.live.watch.Watch`; stdout gets one line per
cause, stderr the messages. Bad input (a path that does not exist, a bad ``--alert`` spec, a bad number) is one line
on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import sys
import types

from forensics.cli.common import add_command
from forensics.detect.findings import SEVERITIES

EXAMPLE = (
    "forensics watch runs/exp1/metrics.jsonl --interval 10 --alert terminal "
    "--alert webhook=https://hooks.slack.com/services/T000/B000/XXXX --exit-on critical"
)


def register(sub) -> None:
    p = add_command(
        sub, "watch", "Tail a live run and alert once per new cause (terminal, webhook, W&B, a command).", EXAMPLE
    )
    p.add_argument(
        "targets",
        nargs="+",
        metavar="CASE_OR_SOURCE",
        help="a case folder, or metrics sources (log files, a W&B folder or run path entity/project/id)",
    )
    p.add_argument("--interval", type=float, default=10.0, metavar="S", help="seconds between polls (default 10)")
    p.add_argument(
        "--alert",
        action="append",
        default=None,
        metavar="SINK",
        help="where alerts go (repeatable): terminal (default), webhook=URL (POST of the JSON body), "
        "wandb (a W&B alert on the watched W&B run), cmd=CMD (the JSON body on CMD's stdin)",
    )
    p.add_argument(
        "--min-severity",
        choices=SEVERITIES,
        default="warning",
        help="alert causes at this severity or above (default warning)",
    )
    p.add_argument(
        "--quiet-period",
        type=float,
        default=300.0,
        metavar="S",
        help="per sink: after an alert, warnings and infos are held for S seconds and then sent together; "
        "critical ones are sent at once; each cause is alerted once (default 300)",
    )
    p.add_argument(
        "--exit-on",
        choices=SEVERITIES,
        default=None,
        metavar="SEVERITY",
        help="exit 1 on the first cause at or above SEVERITY (info, warning, critical)",
    )
    p.add_argument(
        "--until-idle", type=float, default=None, metavar="S", help="exit 0 when the source has not grown for S seconds"
    )
    p.add_argument("--dashboard-url", default=None, metavar="URL", help="the dashboard link put in each alert")
    p.add_argument(
        "--alert-existing",
        action="store_true",
        help="also alert the causes the run already had when the watch started (else only printed)",
    )
    p.add_argument(
        "--backoff",
        type=float,
        default=1.0,
        metavar="S",
        help="first retry delay of a sink that is down, doubled after each failure (default 1)",
    )
    p.add_argument("--backoff-max", type=float, default=60.0, metavar="S", help="longest retry delay (default 60)")
    p.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="S",
        help="on exit or SIGTERM, seconds pending alerts still get to go out (default 30)",
    )
    p.set_defaults(func=run)

    def error(self, message: str) -> None:  # bad input is one line, as every ForensicsError is
        print(f"forensics: error: watch: {message}", file=sys.stderr)
        sys.exit(2)

    p.error = types.MethodType(error, p)


def run(args: argparse.Namespace) -> int:
    from forensics.live import resolve_target
    from forensics.live.alerts import Backoff, parse_sink
    from forensics.live.watch import Watch, WatchOptions, not_yet_written, wait_for
    from forensics.sources.registry import is_wandb_api_source

    def warn(line: str) -> None:
        print(line if line.startswith("forensics") else f"forensics watch: {line}", file=sys.stderr, flush=True)

    options = WatchOptions(
        interval_s=args.interval,
        min_severity=args.min_severity,
        quiet_period_s=args.quiet_period,
        exit_on=args.exit_on,
        until_idle_s=args.until_idle,
        dashboard_url=args.dashboard_url,
        backoff=Backoff(args.backoff, args.backoff_max),
        grace_s=args.grace,
        alert_existing=args.alert_existing,
    )
    if not wait_for(not_yet_written(list(args.targets)), args.interval, args.until_idle, warn):
        print(f"forensics watch: nothing appeared in {args.until_idle:g}s (--until-idle); nothing to watch")
        return 0
    target = resolve_target(args.targets, command="watch")
    sources = list(target.sources)
    if target.case is not None:
        from forensics.schema import open_case

        sources = [s.path for s in open_case(target.case).metrics_sources]
    wandb_runs = [str(s) for s in sources if is_wandb_api_source(str(s))]
    sinks = [s for spec in (args.alert or ["terminal"]) if (s := parse_sink(spec, wandb_runs, warn)) is not None]
    return Watch(target, sinks, options, warn=warn).run()
