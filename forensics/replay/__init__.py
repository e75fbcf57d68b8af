"""Replay: run a suspect step's batch through the run's own checkpoints and say what caused its loss.

Torch (and transformers for Hugging Face models) is imported only when a replay runs, so importing the package (every
audit reads its checkpoints' names and whether a replay could run) never needs them; a missing one is one line naming
the ``[replay]`` extra. The modules, one job each:

- :mod:`~forensics.replay.checkpoints`: find checkpoints and their steps, load state dicts safely, fit them to a model;
- :mod:`~forensics.replay.model`: build the model (HF folder, HF ``checkpoint-N/``, or ``module:factory``) and call it;
- :mod:`~forensics.replay.batches`: tokens per sample, samples per step, padding as the run built it;
- :mod:`~forensics.replay.forward`: per-sample losses in micro-batches that fit a token limit;
- :mod:`~forensics.replay.signals`: per-sample signals (repeated n-grams, rare tokens, loss concentration);
- :mod:`~forensics.replay.verdicts`: the experiments' numbers -> a verdict with evidence sentences;
- :mod:`~forensics.replay.probes`: determinism, gradient norm and the one-step update probe;
- :mod:`~forensics.replay.result`: replay.json's shape, merged by step with an earlier file;
- :mod:`~forensics.replay.core`: :func:`replay_case`, which plans the forwards, runs them and writes replay.json;
- :mod:`~forensics.replay.rerun`: ``--rerun``: the optimizer steps up to a suspect re-run from the checkpoint before
  it, with per-group signals and counterfactuals; :mod:`~forensics.replay.rerun_judge` judges them and
  :mod:`~forensics.replay.cause_class` names the class of cause and its action.
"""

from __future__ import annotations

from forensics.replay.core import ReplayOptions, replay_case
from forensics.replay.result import ReplayResult

__all__ = ["ReplayOptions", "ReplayResult", "replay_case"]
