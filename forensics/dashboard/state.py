"""What the page reads: the watched run lives in :mod:`forensics.live` (the online loop ``forensics watch`` shares);
this module names it for the views, which import it from here."""

from forensics.live import LiveRun, NewCause, NewFinding, Target, is_case_folder, resolve_target

__all__ = ["LiveRun", "NewCause", "NewFinding", "Target", "is_case_folder", "resolve_target"]
