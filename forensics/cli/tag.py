"""``forensics tag``: one row of tags per optimizer step (tokens, padding, bucket, cluster, their sequence)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from forensics.cli.common import add_command, add_step_mapping_options, console
from forensics.errors import ForensicsError
from forensics.plan.rebuild import rebuild_plan, resolve_builder
from forensics.schema import STEP, RunConfig, load_plan, load_samples, open_case, parse_boundaries
from forensics.tagging import TagResult, tag_case


def register(sub) -> None:
    p = add_command(sub, "tag", "Tag every optimizer step with tokens, padding, length bucket and content cluster.",
                    "forensics tag forensics-demo/static -o tags.parquet --samples-out samples-tagged.parquet")
    p.add_argument("case", nargs="?", help="case folder (plan.parquet, samples.parquet, run.toml)")
    p.add_argument("--plan", default=None, help="plan table or recorder folder (Parquet/CSV/JSONL)")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL)")
    p.add_argument("--builder", default=None, metavar="B",
                   help="rebuild the plan instead: a reference builder, module:function or file.py:function")
    p.add_argument("--epochs", type=int, default=1, metavar="N", help="epochs to rebuild with --builder (default 1)")
    p.add_argument("--seed", type=int, default=0, metavar="K", help="seed of --builder and of clustering (default 0)")
    add_step_mapping_options(p)
    p.add_argument("--clusters", default=None, metavar="K",
                   help="cluster the text into K clusters, or 'auto' to choose K by silhouette (default: keep the samples' "
                        "cluster column if they have one, else auto)")
    p.add_argument("--cluster-by", default=None, metavar="COLUMN", help="use a label column (e.g. source) as clusters")
    p.add_argument("--max-fit", type=int, default=20_000, metavar="N", help="texts the clustering is fitted on")
    p.add_argument("--boundaries", default=None, metavar="b0,b1,...|optimal",
                   help="length-bucket boundaries (default: run.toml's, else the story's)")
    p.add_argument("--n-buckets", type=int, default=None, metavar="K",
                   help="buckets for --boundaries optimal (default: as many as the default boundaries)")
    p.add_argument("--max-len", type=int, default=None, metavar="L", help="length cap (default: run.toml's, 8192)")
    p.add_argument("-o", "--out", required=True, metavar="TAGS.parquet", help="where the tags table goes")
    p.add_argument("--samples-out", default=None, metavar="S2.parquet",
                   help="also write the samples with bucket, cluster and cluster_name")
    p.epilog += ("\n\n--step-offset is accepted for symmetry with audit and ingest: it shifts metrics only, and plans"
                 "\nare 0-based, so the tags' steps are the plan's steps.")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = RunConfig().validated()
    warnings: list[str] = []
    plan_src, samples_src = args.plan, args.samples
    if args.case:
        case = open_case(args.case)
        cfg, warnings = case.config, list(case.warnings)
        plan_src = plan_src or (str(case.plan_path) if case.plan_path else None)
        samples_src = samples_src or (str(case.samples_path) if case.samples_path else None)
    if not samples_src:
        raise ForensicsError("tag needs the samples: give a case folder or --samples")
    if not plan_src and not args.builder:
        raise ForensicsError("tag needs a plan: give a case folder, --plan or --builder")
    for flag, value in (("--epochs", args.epochs), ("--max-fit", args.max_fit), ("--grad-accum", args.grad_accum),
                        ("--world-size", args.world_size), ("--max-len", args.max_len), ("--n-buckets", args.n_buckets)):
        if value is not None and value < 1:
            raise ForensicsError(f"{flag} must be >= 1; got {value}")
    inputs = {Path(x).resolve() for x in (samples_src, plan_src) if x}
    for out in (args.out, args.samples_out):
        if out and Path(out).resolve() in inputs:
            raise ForensicsError(f"output {out} is one of the inputs; inputs are never overwritten")
    samples = load_samples(samples_src)
    max_len = args.max_len or cfg.max_len
    if args.builder:
        builder = resolve_builder(args.builder, token_budget=cfg.token_budget, max_len=max_len,
                                  boundaries=cfg.boundaries)
        plan = rebuild_plan(samples, builder, args.epochs, args.seed)
    else:
        plan = load_plan(plan_src, samples)
    boundaries = _boundaries(args.boundaries, cfg)
    given = [f for f, v in (("--grad-accum", args.grad_accum), ("--world-size", args.world_size),
                            ("--rank-split", args.rank_split)) if v is not None]
    if given and STEP in plan.columns:
        warnings.append(f"the plan has a 'step' column, which wins: {', '.join(given)} not used")
    with _progress(len(samples)) as report:
        result = tag_case(
            plan, samples,
            grad_accum=args.grad_accum or cfg.grad_accum,
            world_size=args.world_size or cfg.world_size,
            rank_split=args.rank_split or cfg.rank_split,
            boundaries=boundaries, n_buckets=args.n_buckets, max_len=max_len,
            clusters=_clusters(args.clusters), cluster_by=args.cluster_by, max_fit=args.max_fit, seed=args.seed,
            progress=report,
        )
    _write(result, Path(args.out), args.samples_out)
    _render(result, args.out, warnings + result.warnings)
    return 0


def _boundaries(text: str | None, cfg: RunConfig):
    if text is None:
        return cfg.boundaries
    return "optimal" if text.strip() == "optimal" else parse_boundaries(text)


def _clusters(text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    try:
        return int(text)
    except ValueError as exc:
        raise ForensicsError(f"--clusters: expected a whole number or 'auto'; got {text!r}") from exc


class _progress:
    """A transient progress bar on stderr while texts are clustered (silent when nothing is clustered)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar: Progress | None = None

    def __enter__(self):
        return self._update

    def _update(self, done: int) -> None:
        if self.bar is None:
            self.bar = Progress(TextColumn("clustering texts"), BarColumn(), MofNCompleteColumn(),
                                console=console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("cluster", total=self.total)
        self.bar.update(self.task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _write(result: TagResult, out: Path, samples_out: str | None) -> None:
    meta = {b"forensics": json.dumps(result.metadata()).encode()}
    _write_parquet(result.tags, out, meta)
    if samples_out:
        _write_parquet(result.samples, Path(samples_out), meta)


def _write_parquet(df, path: Path, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    try:
        pq.write_table(table, path)
    except OSError as exc:
        raise ForensicsError(f"cannot write {path}: {exc}") from exc


def _render(result: TagResult, out: str, warnings: list[str]) -> None:
    con = console()
    tags = result.tags
    epochs = tags["epoch"].nunique() if len(tags) else 0
    con.print(f"tagged {len(tags)} steps over {epochs} epochs -> {out}")
    if len(tags):
        ratio = 1 - tags["real_tokens"].sum() / max(int(tags["padded_tokens"].sum()), 1)
        con.print(f"padding ratio {ratio:.3f} overall; boundaries {result.boundaries}; "
                  f"clusters: {result.clusters.method}, k={result.clusters.k}")
        table = Table("cluster", "name", "steps dominated", "mean share", "mean steps since seen")
        by = tags.groupby("cluster", sort=True)
        for c, g in by:
            table.add_row(str(c), str(g["cluster_name"].iloc[0]), str(len(g)), f"{g['cluster_share'].mean():.2f}",
                          f"{g['steps_since_cluster_seen'].astype('float64').mean():.1f}")
        con.print(table)
    for w in warnings:
        con.print(f"warning: {w}", markup=False)
