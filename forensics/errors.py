"""The one error type for bad input.

Everything a user can get wrong (a missing file, a column that is not there, a value that cannot be cast without
loss) is raised as :class:`ForensicsError` with one sentence naming the file, the field and what was expected; the
CLI turns it into that sentence on stderr and exit code 2. Data quirks of real runs (NaN, resumed steps, a
half-written last line) are never raised: they are kept and reported as warnings.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class ForensicsError(Exception):
    """Bad input: the message is shown to the user as is, and the CLI exits with code 2."""


class MissingExtraError(ForensicsError):
    """An optional dependency is needed for what was asked and is not installed."""


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or raise a message naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{purpose} needs the '{module}' package, which is not installed; "
            f"install it with: pip install 'loss-spike-forensics[{extra}]'"
        ) from exc
