"""The default target: the story's small demo run, built on first use in the user cache folder."""

from __future__ import annotations

from pathlib import Path

from forensics.cache import cache_dir

SCALE = "small"


def demo_case(case: str = "static") -> Path:
    """``<cache>/demo-small/<case>``, built by :func:`forensics.datasets.build_demo` the first time (~20 s)."""
    root = cache_dir() / f"demo-{SCALE}"
    folder = root / case
    if not (root / ".complete").exists():
        from forensics.datasets import build_demo

        build_demo(root, scale=SCALE, seed=0)
        (root / ".complete").write_text("built by forensics dashboard\n")
    return folder
