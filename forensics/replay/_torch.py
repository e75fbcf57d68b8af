"""The lazy imports of the ``[replay]`` extra (one place, so every module fails the same clear way)."""

from __future__ import annotations

from types import ModuleType

from forensics.errors import require


def torch() -> ModuleType:
    """``torch``, or a one-line error naming the ``[replay]`` extra."""
    return require("torch", "replay", "forensics replay")


def transformers() -> ModuleType:
    """``transformers`` (Hugging Face models only), or a one-line error naming the ``[replay]`` extra."""
    return require("transformers", "replay", "replaying a Hugging Face model")


def safetensors_torch() -> ModuleType:
    """``safetensors.torch`` (``.safetensors`` checkpoints), or a one-line error naming the ``[replay]`` extra."""
    return require("safetensors.torch", "replay", "reading .safetensors checkpoints")
