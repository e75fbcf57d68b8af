"""The detect stage: rules that turn metrics and tags into findings (spikes, oscillation, recurrence, ...)."""
