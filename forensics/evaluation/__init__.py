"""The means to judge the tool itself (as ruptures ships ``metrics/``): scoring against labels, and the spike rules
of other frameworks re-implemented for comparison. Only ``bench/`` and the tests use it; no product stage imports it."""
