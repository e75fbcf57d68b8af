"""``forensics audit``: the audit of a run: terminal summary, ``findings.json`` and one offline ``report.html``."""

from __future__ import annotations

import argparse
from pathlib import Path

from forensics.cli.common import (
    add_case_argument,
    add_command,
    add_engine_options,
    add_mlflow_uri_option,
    add_step_mapping_options,
    clusters_option,
    console,
    open_case_from,
    stage,
    use_mlflow_uri,
    write_json,
)
from forensics.detect.kinds import fail_kinds
from forensics.pipeline.audit import failed_kinds, parse_fail_on, run_audit
from forensics.schema import check_output

DEMO_DIR = Path("forensics-demo")


def register(sub) -> None:
    p = add_command(
        sub,
        "audit",
        "Audit a run: spikes, oscillation, batch composition, attribution; writes findings.json and report.html.",
        "forensics audit forensics-demo/static --fail-on spike,static-plan",
    )
    add_case_argument(p, "outputs go there too (an HF Trainer output folder works as one)")
    p.add_argument(
        "--demo",
        action="store_true",
        help=f"audit the demo's static run ({DEMO_DIR}/static), building the demo first if missing",
    )
    p.add_argument(
        "--metrics",
        action="append",
        default=None,
        metavar="SRC",
        help="metrics source, anything `forensics ingest` reads (repeatable; later sources win)",
    )
    p.add_argument("--plan", default=None, help="plan table (Parquet/CSV/JSONL, or a recorder folder)")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL)")
    add_step_mapping_options(p)
    add_engine_options(p)
    p.add_argument(
        "--pattern",
        default=None,
        metavar="REGEX",
        help="text logs: a regex with a group 'step' and one named group per metric (as ingest takes it)",
    )
    add_mlflow_uri_option(p)
    p.add_argument(
        "--step-key",
        default=None,
        metavar="K",
        help="the key holding the step in every source (default: what each source says of itself)",
    )
    p.add_argument(
        "--loss-key",
        default=None,
        metavar="K",
        help="the loss column (default: found by name, e.g. train/loss, loss, train_loss, lm loss)",
    )
    p.add_argument(
        "--boundaries",
        default=None,
        metavar="b0,b1,...|optimal",
        help="length-bucket boundaries (default: run.toml's, else fitted to the samples)",
    )
    p.add_argument(
        "--clusters",
        type=clusters_option,
        default=None,
        metavar="K|auto",
        help="content clusters of the sample text (default: chosen from the texts)",
    )
    p.add_argument(
        "--spike-metric",
        action="append",
        default=None,
        metavar="K",
        help="also look for spikes in this metric (repeatable; default: the loss and grad norm)",
    )
    p.add_argument(
        "--cluster-by",
        default=None,
        metavar="COLUMN",
        help="content clusters from this samples column (e.g. source) instead of the text",
    )
    p.add_argument("--json", default=None, metavar="F", help="findings.json path (default CASE/findings.json)")
    p.add_argument("--html", default=None, metavar="F", help="report path (default CASE/report.html)")
    p.add_argument("--no-html", action="store_true", help="do not write the HTML report")
    p.add_argument(
        "--replay",
        action="store_true",
        help="then replay the most urgent causes through the run's checkpoints and write everything from "
        "the replayed evidence (run.toml [replay] auto = true does the same; needs the [replay] extra)",
    )
    p.add_argument(
        "--replay-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds --replay may spend (default: run.toml [replay] budget, else 300); the causes it does "
        "not reach are listed as not replayed",
    )
    p.add_argument(
        "--fail-on",
        default=None,
        metavar="KIND[,KIND]",
        help=f"exit 1 when a critical finding of these kinds is found: {', '.join(sorted(fail_kinds()))}",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fail_on = parse_fail_on(args.fail_on)
    use_mlflow_uri(args)
    check_output(args.json, (".json",), "--json")
    check_output(args.html, (".html", ".htm"), "--html")
    err = console(stderr=True)
    case = args.case
    if args.demo:
        case = case or str(_ensure_demo(err))
    args.case = case
    opened = open_case_from(args)

    audit = run_audit(opened, spike_metrics=args.spike_metric, stage=stage, pattern=args.pattern)
    from forensics.pipeline.replay_loop import replay_requested

    replayed = None
    if replay_requested(opened, args.replay):
        replayed = _replay(opened, audit, args.replay_budget)
    written = []
    json_path = args.json or opened.findings_path
    html_path = None if args.no_html else (args.html or opened.report_path)
    if json_path:
        write_json(audit.to_json(), json_path)
        written.append(str(json_path))
    if html_path:
        from forensics.report import write_report

        with stage("writing the report"):
            write_report(
                html_path,
                audit.findings,
                audit.metrics,
                tags=audit.tags,
                samples=audit.samples,
                plan=audit.plan,
                loss_key=audit.loss_key,
                replay=audit.replay_results(),
                batch_rows=audit.batch_rows,
                expected=audit.expected,
            )
        written.append(str(html_path))

    from forensics.report.summary import render_summary

    render_summary(console(), audit.findings, written + ([str(p) for p in replayed.written] if replayed else []))
    if not written:  # no case folder to write into (a log or metrics file given alone)
        console(stderr=True).print(
            "audit: no findings.json or report.html written (no case folder); add --json F and --html F to keep them",
            markup=False,
        )
    failed = failed_kinds(audit.findings, fail_on)
    if failed:
        console(stderr=True).print(f"audit: failing on {', '.join(failed)} (--fail-on)")
        return 1
    return 0


def _replay(case, audit, budget: float | None):
    """``--replay``: the top causes through the checkpoints, merged into the audit's findings
    (forensics.pipeline.replay_loop)."""
    from forensics.pipeline.replay_loop import replay_causes

    plan_steps = audit.plan_steps
    if plan_steps is None:
        audit.findings.setdefault("warnings", []).append("--replay: not replayed; the case has no batch plan")
        return None
    with stage("replaying the top causes"):
        _, result = replay_causes(case, audit.findings, plan_steps, budget, progress=console(stderr=True).is_terminal)
    return result


def _ensure_demo(err) -> Path:
    """The demo's static case, built on first use (full scale, seed 0)."""
    case = DEMO_DIR / "static"
    if (case / "metrics.parquet").exists() and (DEMO_DIR / "bucketed" / "metrics.parquet").exists():
        return case
    from forensics.datasets import build_demo

    err.print(f"building the demo run in {DEMO_DIR}/ (first use; under a minute) ...")
    build_demo(DEMO_DIR, scale="full", seed=0)
    return case
