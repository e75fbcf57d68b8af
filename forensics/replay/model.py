"""Build the run's model and call it the one way replay needs: (input ids, attention mask) -> logits.

Three ways to name the model (``--model`` or run.toml ``model``):
- a local Hugging Face model folder (``config.json`` plus weights; sharded safetensors with an index too);
- an HF ``checkpoint-N/`` folder, which carries its own ``config.json`` (the default when the checkpoints are such
  folders and no model is named);
- ``module:factory`` or ``path/to/file.py:factory``: a callable with no arguments returning a ``torch.nn.Module``
  whose forward takes the input ids and an attention mask and returns logits or an object with ``.logits``.

HF models are built from their config with random weights and then given each checkpoint's weights, so one code path
(:func:`~forensics.replay.checkpoints.apply_state`) loads every checkpoint and checks that it fits.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.errors import ForensicsError
from forensics.replay import _torch


@dataclass
class LoadedModel:
    """The model, how to call it, and the padding its config implies (``None`` when it says nothing)."""

    module: Any
    hf: bool
    pad_id: int | None
    pad_side: str | None
    weights: Path | None  # an HF folder whose own weights can serve as a checkpoint

    def logits(self, ids: Any, mask: Any) -> Any:
        """Call the model; HF forwards take keywords (their second positional argument is not the mask)."""
        out = self.module(input_ids=ids, attention_mask=mask) if self.hf else self.module(ids, mask)
        return out if _torch.torch().is_tensor(out) else out.logits


def load_model(
    spec: str | None, base: Path, hf_config_dir: Path | None = None, checkpoints: Path | None = None
) -> tuple[LoadedModel, str | None]:
    """Build the model named by ``spec`` (relative paths against ``base``), else from ``hf_config_dir`` (an HF
    ``checkpoint-N/`` folder); returns it and a note when the architecture came from a checkpoint instead of a
    named folder that has no config (HF Trainer's output folder before ``trainer.save_model()``).

    ``checkpoints``: the folder the checkpoints were looked for in (named in the error when no model is found)."""
    note = None
    if spec:
        folder = Path(spec) if Path(spec).is_absolute() else base / spec
        if folder.is_dir() and (folder / "config.json").exists():
            return _hf_model(folder), None
        if folder.is_dir():
            if hf_config_dir is None:
                raise ForensicsError(_no_model(base, checkpoints, f"model folder {folder} has no config.json"))
            note = (
                f"model folder {folder} has no config.json (saved only by trainer.save_model()): the architecture "
                f"is taken from {hf_config_dir / 'config.json'}"
            )
        elif ":" in spec:
            return _factory_model(spec, base), None
        else:
            raise ForensicsError(f"model {spec!r}: expected a Hugging Face model folder or module:factory")
    if hf_config_dir is not None:
        return _hf_model(hf_config_dir), note
    raise ForensicsError(_no_model(base, checkpoints, "no model"))


def _no_model(base: Path, checkpoints: Path | None, what: str) -> str:
    """One line: what is missing, the folders looked in, the flag to pass."""
    where = [str(base)] + ([f"{checkpoints}/checkpoint-N/"] if checkpoints is not None else [])
    return (
        f"{what}: found no config.json in {' or '.join(where)}; pass --model (an HF model folder with "
        "config.json, or module:factory), or set 'model' in run.toml"
    )


def dropout_rate(module: Any) -> float:
    """The largest dropout probability the model applies in train mode (``nn.Dropout`` modules, and the config's
    ``*dropout*``/``*pdrop*`` values for models that call dropout functionally); 0 when it has none, so a
    train-mode replay cannot differ from an eval-mode one."""
    torch = _torch.torch()
    rates = [float(m.p) for m in module.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    config = getattr(module, "config", None)
    if config is not None:
        for key, value in vars(config).items():
            if ("dropout" in key or "pdrop" in key) and isinstance(value, (int, float)) and not isinstance(value, bool):
                rates.append(float(value))
    return max([r for r in rates if 0 <= r < 1], default=0.0)


def _hf_model(folder: Path) -> LoadedModel:
    tf = _torch.transformers()
    try:
        config = tf.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        module = tf.AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError) as exc:
        raise ForensicsError(
            f"model folder {folder}: transformers could not build a causal LM from its config.json: "
            f"{str(exc).splitlines()[0]}"
        ) from exc
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        pad = getattr(config, "eos_token_id", None)
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    side = _tokenizer_padding_side(folder)
    from forensics.replay.checkpoints import is_hf_folder

    return LoadedModel(module, True, pad, side, folder if is_hf_folder(folder) else None)


def _tokenizer_padding_side(folder: Path) -> str | None:
    import json

    p = folder / "tokenizer_config.json"
    if p.exists():
        try:
            side = json.loads(p.read_text(encoding="utf-8")).get("padding_side")
            return side if side in ("left", "right") else None
        except ValueError:
            return None
    return None


def _factory_model(spec: str, base: Path) -> LoadedModel:
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target) if Path(target).is_absolute() else base / target
        if not path.exists():
            raise ForensicsError(f"model {spec!r}: file {path} does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"_forensics_model_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)  # type: ignore[union-attr]
    else:
        for p in (str(Path.cwd()), str(base)):
            if p not in sys.path:
                sys.path.append(p)
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ForensicsError(f"model {spec!r}: module {target!r} could not be imported ({exc})") from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise ForensicsError(f"model {spec!r}: {target} has no callable {name!r}")
    built = factory()
    torch = _torch.torch()
    if not isinstance(built, torch.nn.Module):
        raise ForensicsError(f"model {spec!r}: the factory returned {type(built).__name__}, expected a torch.nn.Module")
    params = list(inspect.signature(built.forward).parameters)
    if len(params) < 2:
        raise ForensicsError(
            f"model {spec!r}: forward must take the input ids and an attention mask; it takes ({', '.join(params)})"
        )
    return LoadedModel(built, False, None, None, None)
