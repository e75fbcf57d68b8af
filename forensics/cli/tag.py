"""``forensics tag``: one row of tags per optimizer step (tokens, padding, bucket, cluster, their sequence)."""

from __future__ import annotations

import argparse

from rich.table import Table

from forensics.cli.common import (
    add_case_argument,
    add_command,
    add_engine_options,
    add_step_mapping_options,
    clusters_option,
    console,
    open_case_from,
    stage_progress,
)
from forensics.tagging import TagResult, tag_case_folder


def register(sub) -> None:
    p = add_command(
        sub,
        "tag",
        "Tag every optimizer step with tokens, padding, length bucket and content cluster.",
        "forensics tag forensics-demo/static -o tags.parquet --samples-out samples-tagged.parquet",
    )
    add_case_argument(p, "its plan, samples and run.toml")
    p.add_argument("--plan", default=None, help="plan table or recorder folder (Parquet/CSV/JSONL)")
    p.add_argument("--samples", default=None, help="samples table (Parquet/CSV/JSONL)")
    p.add_argument(
        "--builder",
        default=None,
        metavar="B",
        help="rebuild the plan instead: a reference builder, module:function or file.py:function",
    )
    p.add_argument("--epochs", type=int, default=1, metavar="N", help="epochs to rebuild with --builder (default 1)")
    p.add_argument("--seed", type=int, default=0, metavar="K", help="seed of --builder and of clustering (default 0)")
    add_step_mapping_options(p)
    p.add_argument(
        "--clusters",
        type=clusters_option,
        default=None,
        metavar="K|auto",
        help="cluster the text into K clusters, or 'auto' to choose K by silhouette (default: keep the "
        "samples' cluster column if they have one, else auto)",
    )
    p.add_argument("--cluster-by", default=None, metavar="COLUMN", help="use a label column (e.g. source) as clusters")
    p.add_argument("--max-fit", type=int, default=20_000, metavar="N", help="texts the clustering is fitted on")
    p.add_argument(
        "--boundaries",
        default=None,
        metavar="b0,b1,...|optimal",
        help="length-bucket boundaries (default: run.toml's, else fitted to the samples)",
    )
    p.add_argument(
        "--n-buckets", type=int, default=None, metavar="K", help="buckets when the boundaries are fitted (default 6)"
    )
    p.add_argument("--max-len", type=int, default=None, metavar="L", help="length cap (default: run.toml's, 8192)")
    add_engine_options(p)
    p.add_argument("-o", "--out", required=True, metavar="TAGS.parquet", help="where the tags table goes")
    p.add_argument(
        "--samples-out",
        default=None,
        metavar="S2.parquet",
        help="also write the samples with bucket, cluster and cluster_name",
    )
    p.epilog += (
        "\n\n--step-offset is accepted for symmetry with audit and ingest: it shifts metrics only, and plans"
        "\nare 0-based, so the tags' steps are the plan's steps."
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    case = open_case_from(args)
    with stage_progress("clustering texts") as progress:
        result = tag_case_folder(
            case, builder=args.builder, epochs=args.epochs, seed=args.seed, max_fit=args.max_fit, progress=progress
        )
    result.write(args.out, args.samples_out, inputs=[case.samples_path, case.plan_path])
    _render(result, args.out)
    return 0


def _render(result: TagResult, out: str) -> None:
    con = console()
    summary = result.to_json()
    con.print(f"tagged {summary['steps']} steps over {summary['epochs']} epochs -> {out}")
    if summary["steps"]:
        con.print(
            f"padding ratio {summary['padding_ratio']:.3f} overall; boundaries {result.boundaries}; "
            f"clusters: {result.clusters.method}, k={result.clusters.k}"
        )
        table = Table("cluster", "name", "steps dominated", "mean share", "mean steps since seen")
        for c, g in result.tags.groupby("cluster", sort=True):
            table.add_row(
                str(c),
                str(g["cluster_name"].iloc[0]),
                str(len(g)),
                f"{g['cluster_share'].mean():.2f}",
                f"{g['steps_since_cluster_seen'].astype('float64').mean():.1f}",
            )
        con.print(table)
    err = console(stderr=True)
    for w in result.warnings:
        err.print(f"warning: {w}", markup=False)
