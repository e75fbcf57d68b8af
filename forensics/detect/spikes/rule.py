"""The spike rule of the audit: the :class:`~forensics.detect.spikes.driver.SpikeDriver` on the analysed metrics.

Each metric is judged on the rows where it was written (an eval metric between evals is missing, not a NaN), against
per-bucket baselines when steps carry tags. Its parameters are the spike detector's (``[detect.spikes]``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from forensics.detect.base import Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.spikes.detector import PARAMETER_CONSTRAINTS, check_spike_params, spike_defaults
from forensics.detect.spikes.driver import SpikeDriver


class SpikeRule(Rule):
    """Spikes, level shifts, non-finite steps and bucket summaries of the analysed metrics.

    Parameters are :class:`~forensics.detect.spikes.detector.SpikeDetector`'s (``window``, ``z``, ``ratio``, ...:
    defaults and reasons documented there), given as ``[detect.spikes]`` keys.
    """

    name = "spikes"
    parameter_constraints = {k: v for k, v in PARAMETER_CONSTRAINTS.items() if k != "metric"}
    required_columns = {"metrics": ("step",)}

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(self.parameter_defaults()))
        if unknown:
            raise TypeError(f"SpikeRule: unknown parameter '{unknown[0]}'")
        self.params = {**self.parameter_defaults(), **params}

    @classmethod
    def parameter_defaults(cls) -> dict[str, Any]:
        return {k: v for k, v in spike_defaults().items() if k != "metric"}

    def get_params(self) -> dict[str, Any]:
        return dict(self.params)

    def validate(self) -> None:
        check_spike_params(self.params, f"detect.{self.name}")

    def driver(self, run: RunTables) -> SpikeDriver:
        """The run's spike driver: its analysed metrics, grad norm, logging window and boundaries."""
        return SpikeDriver(
            run.analysed,
            run.grad_norm_key,
            params=self.params,
            logging_steps=run.logging_steps,
            boundaries=run.boundaries,
        )

    def reset(self) -> None:
        super().reset()
        self.expected_: pd.DataFrame | None = None

    def detect(self, run: RunTables, found: list[Finding] | None = None) -> list[Finding]:
        self.reset()
        self.check_inputs(run)
        driver = self.driver(run)
        out = driver.detect(run.metrics, run.tags)
        self.warnings_ = driver.warnings()
        # the expected value of each step from its composition (SpikeDriver.expected), for the pipeline's tables:
        # the report draws it as the expected band
        self.expected_ = driver.expected()
        return out

    def online(self, run: RunTables) -> LiveSpikes:
        return LiveSpikes(self.driver(run), run)


class LiveSpikes:
    """The spike rule on a live run: each chunk of rows through the driver, judged with the run's current tags."""

    def __init__(self, driver: SpikeDriver, run: RunTables) -> None:
        self.driver = driver
        self.run = run

    def update(self, rows: pd.DataFrame) -> list[Finding]:
        return self.driver.update(rows, self.run.tags)

    def finish(self) -> list[Finding]:
        return self.driver.finish()

    def warnings(self) -> list[str]:
        return self.driver.warnings()
