"""The online loop the dashboard and ``forensics watch`` share: tail a run's sources, feed the rules that run live,
group what they find into causes with stable keys.

- :mod:`~forensics.live.target`: what is watched (a case folder or metrics sources);
- :mod:`~forensics.live.tables`: the run's tables, the audit it starts from, tags kept in the user cache;
- :mod:`~forensics.live.run`: :class:`LiveRun`, the loop itself;
- :mod:`~forensics.live.alerts`: the alert body, the sinks and their delivery (retried in the background);
- :mod:`~forensics.live.watch`: ``forensics watch``, the loop telling each new cause once to the sinks.
"""

from forensics.live.run import LiveRun, NewCause, NewFinding
from forensics.live.target import Target, is_case_folder, resolve_target

__all__ = ["LiveRun", "NewCause", "NewFinding", "Target", "is_case_folder", "resolve_target"]
