"""Scripts that write real W&B offline runs with the ``wandb`` package, and the environment they run in."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

WRITER = textwrap.dedent("""
    import json, math, os, sys, time
    import wandb

    out = sys.argv[1]
    SETTINGS = dict(console="off", x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                    disable_git=True, save_code=False, x_save_requirements=False, disable_job_creation=True)
    logged = {}

    def next_second():
        # W&B names run folders by the second; a resume must land in a later folder name.
        time.sleep(1.02 - (time.time() % 1.0))

    # 1. nested keys, NaN/inf, text and a histogram (non-numeric), config and summary.
    run = wandb.init(dir=out + "/nested", project="p", id="nested1", config={"lr": 0.1, "model": {"layers": 2}},
                     settings=wandb.Settings(**SETTINGS))
    rows = []
    for i in range(150):
        loss = {7: float("nan"), 8: float("inf"), 9: float("-inf")}.get(i, 1.0 / (i + 1))
        row = {"train/loss": loss, "opt": {"lr": 1e-3 * (i % 10), "grad": {"norm": 0.5 * i}}, "caption": f"row {i}"}
        if i % 3 == 0:
            row["eval/acc"] = i / 150
        if i == 20:
            row["weights"] = wandb.Histogram([1.0, 2.0, 2.0, 3.0])
        run.log(row)
        rows.append({"step": i, "train/loss": loss, "opt/lr": 1e-3 * (i % 10), "opt/grad/norm": 0.5 * i,
                     **({"eval/acc": i / 150} if i % 3 == 0 else {})})
    run.summary["best_loss"] = 0.125
    run.finish()
    logged["nested"] = rows

    # 2. another run, then a run resumed with the same id whose step restarts at 0.
    run = wandb.init(dir=out + "/multi", project="p", id="other1", settings=wandb.Settings(**SETTINGS))
    for i in range(10):
        run.log({"loss": 50.0 + i, "global_step": 100 + 2 * i})
    run.finish()
    logged["other"] = [{"step": i, "loss": 50.0 + i, "global_step": 100 + 2 * i} for i in range(10)]
    next_second()
    run = wandb.init(dir=out + "/multi", project="p", id="resumed1", config={"phase": 1},
                     settings=wandb.Settings(**SETTINGS))
    for i in range(60):
        run.log({"loss": float(i)})
    run.finish()
    next_second()
    run = wandb.init(dir=out + "/multi", project="p", id="resumed1", resume="allow", config={"phase": 2},
                     settings=wandb.Settings(**SETTINGS))
    for i in range(25):
        run.log({"loss": 1000.0 + i, "resumed": 1.0})
    run.finish()
    logged["resumed_first"] = [{"step": i, "loss": float(i)} for i in range(60)]
    logged["resumed_second"] = [{"step": i, "loss": 1000.0 + i, "resumed": 1.0} for i in range(25)]
    with open(out + "/logged.json", "w") as fh:
        json.dump(logged, fh)
""")


def isolated_env(tmp: Path) -> dict[str, str]:
    """The environment for a writer: offline, silent, W&B's own folders under ``tmp``, no key, no server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "HOME": str(tmp / "home"),
            "WANDB_CONFIG_DIR": str(tmp / "config"),
            "WANDB_CACHE_DIR": str(tmp / "cache"),
            "WANDB_DATA_DIR": str(tmp / "data"),
            "WANDB_DISABLE_CODE": "true",
            "WANDB_DISABLE_GIT": "true",
        }
    )
    return env
