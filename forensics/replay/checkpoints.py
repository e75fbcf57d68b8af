"""Checkpoints: find them and their steps, load their state dicts without unpickling code, fit them to the model.

Step convention: checkpoint N is the state after N optimizer updates, which is the state plan step N's
batch saw (HF ``checkpoint-N/`` counts ``global_step`` the same way). Layouts understood:

- a folder of HF ``checkpoint-N/`` folders (weights in ``model.safetensors``, a sharded index, or ``pytorch_model.bin``;
  ``optimizer.pt`` beside), or one such folder;
- a folder of ``.safetensors`` / ``.pt`` / ``.pth`` / ``.bin`` state dicts, the step the last number in the name
  (``step_000030.pt``, ``ckpt-30.safetensors``), or given by ``manifest.json``
  (``{"checkpoints": [{"path", "step"}]}``);
- a ``.pt`` may hold ``{"model": state_dict, "optimizer": optimizer_state, ...}`` (the usual training-loop layout);
- sharded ``torch.distributed.checkpoint`` (DCP) folders (a ``.metadata`` file beside the shards), gathered into one
  process with torch's own ``dcp_to_torch_save`` and then read like a ``.pt``.

``torch.load`` runs with ``weights_only=True`` only: a file holding a pickled object is refused, never executed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError
from forensics.replay import _torch

STATE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_MODEL_KEYS = ("model", "state_dict", "model_state_dict", "module")
_OPTIM_KEYS = ("optimizer", "optimizer_state_dict", "optim")
_FEW = 5


@dataclass(frozen=True)
class Checkpoint:
    """One saved state: ``step`` (updates done), ``path`` (file or folder) and ``kind`` (``hf`` or ``file``)."""

    step: int
    path: Path
    kind: str

    @property
    def config_dir(self) -> Path | None:
        """The folder holding an HF ``config.json`` for this checkpoint, if any."""
        return self.path if self.kind == "hf" and (self.path / "config.json").exists() else None


def is_dcp_folder(path: Path) -> bool:
    """A ``torch.distributed.checkpoint`` folder: its ``.metadata`` file names the shards."""
    return path.is_dir() and (path / ".metadata").exists()


def is_hf_folder(path: Path) -> bool:
    """An HF model or ``checkpoint-N`` folder: it holds weights under one of the names the Trainer writes."""
    return path.is_dir() and any((path / n).exists() for n in _HF_WEIGHTS)


def discover_checkpoints(path: str | Path) -> list[Checkpoint]:
    """Every checkpoint under ``path``, sorted by step; none found is bad input naming what was looked for.

    ``kind`` is ``hf`` (a ``checkpoint-N/`` folder), ``dcp`` (a ``torch.distributed.checkpoint`` folder) or ``file``.
    """
    path = Path(path)
    if not path.exists():
        raise ForensicsError(f"checkpoints {path} do not exist")
    if path.is_file():
        return [Checkpoint(_step_from_name(path, path), path, "file")]
    if is_hf_folder(path):
        return [Checkpoint(_hf_step(path), path, "hf")]
    if is_dcp_folder(path):
        return [Checkpoint(_step_from_name(path, path), path, "dcp")]
    manifest = path / "manifest.json"
    if manifest.exists():
        return _from_manifest(manifest)
    found: list[Checkpoint] = []
    for child in sorted(path.iterdir()):
        if child.is_dir() and is_hf_folder(child):
            found.append(Checkpoint(_hf_step(child), child, "hf"))
        elif child.is_dir() and is_dcp_folder(child):
            found.append(Checkpoint(_step_from_name(child, child), child, "dcp"))
        elif child.is_file() and child.suffix in STATE_SUFFIXES and not child.name.startswith(("optimizer", "rng")):
            found.append(Checkpoint(_step_from_name(child, child), child, "file"))
    if not found:
        raise ForensicsError(
            f"checkpoints {path}: no checkpoint-N/ folder and no {'/'.join(STATE_SUFFIXES)} state dict found"
        )
    steps = [c.step for c in found]
    dup = sorted({s for s in steps if steps.count(s) > 1})
    if dup:
        raise ForensicsError(
            f"checkpoints {path}: several checkpoints claim step(s) {dup[:_FEW]}; keep one per step "
            "or name the steps in manifest.json"
        )
    return sorted(found, key=lambda c: c.step)


def _from_manifest(manifest: Path) -> list[Checkpoint]:
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        entries = data["checkpoints"] if isinstance(data, dict) else data
        out = [Checkpoint(int(e["step"]), manifest.parent / e["path"], "file") for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ForensicsError(f'{manifest}: expected {{"checkpoints": [{{"path", "step"}}]}}; {exc}') from exc
    for c in out:
        if not c.path.exists():
            raise ForensicsError(f"{manifest}: checkpoint {c.path} does not exist")
    return sorted(
        (Checkpoint(c.step, c.path, "hf" if is_hf_folder(c.path) else "file") for c in out), key=lambda c: c.step
    )


def _step_from_name(path: Path, origin: Path) -> int:
    nums = re.findall(r"\d+", path.stem if path.is_file() else path.name)
    if not nums:
        raise ForensicsError(f"checkpoint {origin}: no step in its name (e.g. step_30.pt) and no manifest.json")
    return int(nums[-1])


def _hf_step(folder: Path) -> int:
    m = re.search(r"(\d+)$", folder.name)
    if m:
        return int(m.group(1))
    state = folder / "trainer_state.json"
    if state.exists():
        try:
            return int(json.loads(state.read_text(encoding="utf-8"))["global_step"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ForensicsError(f"{state}: expected a 'global_step' number") from exc
    raise ForensicsError(f"checkpoint {folder}: no step in its name (checkpoint-N) and no trainer_state.json")


def torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True)`` on CPU; a pickled object (code, a whole module) is refused in one line."""
    import pickle

    torch = _torch.torch()
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ForensicsError(
            f"checkpoint {path} holds a pickled object, which torch.load(weights_only=True) refuses "
            "to run; save model.state_dict() (tensors only) instead"
        ) from exc
    except (RuntimeError, EOFError, OSError) as exc:
        raise ForensicsError(
            f"checkpoint {path} could not be read as a torch state dict: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc


def _read_weights(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        try:
            return dict(_torch.safetensors_torch().load_file(str(path), device="cpu"))
        except Exception as exc:  # safetensors raises its own error types for a damaged header
            raise ForensicsError(f"checkpoint {path} is not a readable .safetensors file: {exc}") from exc
    if path.name.endswith(".index.json"):
        try:
            weight_map = json.loads(path.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise ForensicsError(f"{path}: expected a sharded-checkpoint index with a 'weight_map'") from exc
        state: dict[str, Any] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(_read_weights(path.parent / shard))
        return state
    return _state_of(torch_load(path), path)


def _state_of(obj: Any, path: Path) -> dict[str, Any]:
    torch = _torch.torch()
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj
    if isinstance(obj, dict):
        for key in _MODEL_KEYS:
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                return inner
    keys = list(obj)[:_FEW] if isinstance(obj, dict) else type(obj).__name__
    raise ForensicsError(f"checkpoint {path}: expected a state dict of tensors (or one under 'model'); found {keys}")


def _read_dcp(folder: Path) -> Any:
    """A DCP folder gathered into one object with torch's converter, then loaded with ``weights_only=True``."""
    import tempfile

    _torch.torch()
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="forensics-dcp-") as tmp:
        out = Path(tmp) / "gathered.pt"
        try:
            dcp_to_torch_save(str(folder), str(out))
        except Exception as exc:  # DCP raises several types for a damaged or partial folder
            raise ForensicsError(
                f"checkpoint {folder}: torch.distributed.checkpoint could not gather it into one "
                f"process: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from exc
        return torch_load(out)


def load_state_dict(ckpt: Checkpoint) -> dict[str, Any]:
    """The model weights of ``ckpt`` as a name -> tensor dict (on CPU)."""
    if ckpt.kind == "dcp":
        return _state_of(_read_dcp(ckpt.path), ckpt.path)
    if ckpt.kind == "hf":
        for name in _HF_WEIGHTS:
            if (ckpt.path / name).exists():
                return _read_weights(ckpt.path / name)
    return _read_weights(ckpt.path)


def load_optimizer_state(ckpt: Checkpoint) -> dict[str, Any] | None:
    """The optimizer's ``state_dict()`` saved with ``ckpt`` (HF ``optimizer.pt``, or a ``.pt``'s 'optimizer')."""
    if ckpt.kind == "hf":
        p = ckpt.path / "optimizer.pt"
        return torch_load(p) if p.exists() else None
    if ckpt.path.suffix in (".pt", ".pth", ".bin") or ckpt.kind == "dcp":
        obj = _read_dcp(ckpt.path) if ckpt.kind == "dcp" else torch_load(ckpt.path)
        if isinstance(obj, dict):
            for key in _OPTIM_KEYS:
                if isinstance(obj.get(key), dict):
                    return obj[key]
    return None


def _strip_prefix(state: dict[str, Any], model_keys: set[str]) -> dict[str, Any]:
    """DDP's ``module.`` and ``torch.compile``'s ``_orig_mod.`` prefixes, when every key carries one."""
    for prefix in ("module.", "_orig_mod."):
        if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in model_keys):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def apply_state(model: Any, state: dict[str, Any], origin: str | Path) -> None:
    """Load ``state`` into ``model``; a checkpoint that does not fit is one line naming missing and unexpected keys.

    A key missing from the file is accepted only when its tensor is tied to one the file holds (GPT-2's ``lm_head``
    shares the embedding and HF saves it once).
    """
    own = model.state_dict()
    state = _strip_prefix(state, set(own))
    present = {t.data_ptr() for k, t in own.items() if k in state}
    missing = sorted(k for k, t in own.items() if k not in state and t.data_ptr() not in present)
    unexpected = sorted(k for k in state if k not in own)
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}"
        for k in own
        if k in state and tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {_few(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_few(unexpected)}")
        if shapes:
            parts.append(f"shape mismatches {_few(shapes)} (file vs model)")
        raise ForensicsError(f"checkpoint {origin} does not fit the model: {'; '.join(parts)}")
    model.load_state_dict(state, strict=False)


def _few(names: list[str]) -> str:
    shown = ", ".join(names[:_FEW])
    return f"{shown} (+{len(names) - _FEW} more)" if len(names) > _FEW else shown


def nearest_before(checkpoints: list[Checkpoint], step: int) -> Checkpoint | None:
    """The latest checkpoint whose state plan step ``step`` could have seen (checkpoint step <= ``step``)."""
    best = None
    for c in checkpoints:
        if c.step <= step:
            best = c
    return best


def nearest_after(checkpoints: list[Checkpoint], step: int) -> Checkpoint | None:
    """The earliest checkpoint saved after ``step`` (for a step with none at or before it)."""
    return next((c for c in checkpoints if c.step > step), None)
