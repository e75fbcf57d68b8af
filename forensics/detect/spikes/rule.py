"""The spike rule of the audit: the :class:`~forensics.detect.spikes.driver.SpikeDriver` on the analysed metrics.

Each metric is judged on the rows where it was written (an eval metric between evals is missing, not a NaN), against
per-bucket baselines when steps carry tags. Its parameters are the spike detector's (``[detect.spikes]``).
"""

from __future__ import annotations

import pandas as pd

from forensics.detect.base import OnlineRule, Rule, RunTables
from forensics.detect.findings import Finding
from forensics.detect.spikes.detector import PARAMETER_CONSTRAINTS, SpikeDetector, check_tail_fits
from forensics.detect.spikes.driver import SpikeDriver

#: The detector's defaults, declared once (in :class:`SpikeDetector`'s signature) and read here.
_DEFAULTS = SpikeDetector.parameter_defaults()


class SpikeRule(Rule):
    """Spikes, level shifts, non-finite steps and bucket summaries of the analysed metrics.

    Parameters are :class:`~forensics.detect.spikes.detector.SpikeDetector`'s (``window``, ``z``, ``ratio``, ...:
    defaults and reasons documented there), given as ``[detect.spikes]`` keys.
    """

    name = "spikes"
    parameter_constraints = {k: v for k, v in PARAMETER_CONSTRAINTS.items() if k != "metric"}
    required_columns = {"metrics": ("step",)}

    def __init__(
        self,
        window: int = _DEFAULTS["window"],
        z: float = _DEFAULTS["z"],
        ratio: float = _DEFAULTS["ratio"],
        min_jump: float = _DEFAULTS["min_jump"],
        max_duration: int = _DEFAULTS["max_duration"],
        confirm: int = _DEFAULTS["confirm"],
        min_periods: int = _DEFAULTS["min_periods"],
        trend: bool = _DEFAULTS["trend"],
        bucket_window: int = _DEFAULTS["bucket_window"],
        min_bucket_periods: int = _DEFAULTS["min_bucket_periods"],
        group: str = _DEFAULTS["group"],
        z_large: float = _DEFAULTS["z_large"],
        ratio_large: float = _DEFAULTS["ratio_large"],
        false_rate: float | None = _DEFAULTS["false_rate"],
        tail_start: float = _DEFAULTS["tail_start"],
        tail_window: int = _DEFAULTS["tail_window"],
        min_peaks: int = _DEFAULTS["min_peaks"],
        joint_factor: float = _DEFAULTS["joint_factor"],
    ) -> None:
        self.window = window
        self.z = z
        self.ratio = ratio
        self.min_jump = min_jump
        self.max_duration = max_duration
        self.confirm = confirm
        self.min_periods = min_periods
        self.trend = trend
        self.bucket_window = bucket_window
        self.min_bucket_periods = min_bucket_periods
        self.group = group
        self.z_large = z_large
        self.ratio_large = ratio_large
        self.false_rate = false_rate
        self.tail_start = tail_start
        self.tail_window = tail_window
        self.min_peaks = min_peaks
        self.joint_factor = joint_factor

    def validate(self) -> None:
        """Each parameter against its constraint, then the tail's peaks within its window (as the detector does)."""
        super().validate()
        check_tail_fits(self.param_owner(), self.get_params())

    def driver(self, run: RunTables) -> SpikeDriver:
        """The run's spike driver: its analysed metrics, grad norm, logging window and boundaries."""
        return SpikeDriver(
            run.analysed,
            run.grad_norm_key,
            params=self.get_params(),
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


class LiveSpikes(OnlineRule):
    """The spike rule on a live run: each chunk of rows through the driver, judged with the run's current tags (the
    live loop replaces ``run.tags`` as the plan grows, so they are read at each update, not bound once)."""

    def __init__(self, driver: SpikeDriver, run: RunTables) -> None:
        self.driver = driver
        self.run = run

    def update(self, rows: pd.DataFrame) -> list[Finding]:
        return self.driver.update(rows, self.run.tags)

    def finish(self) -> list[Finding]:
        return self.driver.finish()

    def warnings(self) -> list[str]:
        return self.driver.warnings()
