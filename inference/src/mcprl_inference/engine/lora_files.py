"""Reads a peft LoRA adapter folder into plain tensors, refusing what the engine cannot run.

The engine runs adapters without peft (see :mod:`.lora`), so it reads peft's files itself:
``adapter_config.json`` and ``adapter_model.safetensors`` (or ``adapter_model.bin``). Every
option that changes the forward pass beyond ``y = W x + scale * B A x`` (DoRA, a trained
bias, extra saved modules, per-module ranks, ...) is refused with a :class:`LoraError`
naming it, rather than served with a silently different function than the trainer's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

# peft config keys that change the forward pass (set: refused), with the name an error shows
UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "lora_bias": "a LoRA bias (lora_bias)",
    "modules_to_save": "modules_to_save",
    "fan_in_fan_out": "fan_in_fan_out",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "layer_replication": "layer_replication",
    "trainable_token_indices": "trainable_token_indices",
    "target_parameters": "target_parameters",
    "alora_invocation_tokens": "aLoRA (alora_invocation_tokens)",
    "arrow_config": "arrow_config",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "use_bdlora",
    "velora_config": "velora_config",
    "monteclora_config": "monteclora_config",
    "kasa_config": "kasa_config",
}
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")


class LoraError(Exception):
    """A load/unload the client got wrong (bad path, rank too large, unknown name)."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


@dataclass
class AdapterWeights:
    """One adapter ready to run: per adapted linear ``A [r, in]`` and ``(scaling * B)^T
    [r, out]`` (scaling folded in once, so the forward needs no multiply; transposed as the
    active buffers of :mod:`.lora_layers` hold it, so activating is one contiguous copy)."""

    rank: int
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]

    def to(self, device: torch.device | str) -> AdapterWeights:
        return AdapterWeights(self.rank, {n: (a.to(device), b.to(device))
                                          for n, (a, b) in self.modules.items()})


def read_config(path: str) -> dict[str, Any]:
    folder = Path(path)
    cfg = folder / "adapter_config.json"
    if not folder.exists() or not cfg.exists():
        raise LoraError(f"No adapter found for {path}: no adapter_config.json there",
                        not_found=True)
    try:
        return json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoraError(f"unreadable adapter_config.json in {path}: {exc}") from exc


def check_config(config: dict[str, Any], max_rank: int) -> int:
    """The adapter's rank, once its config asks for nothing this path does not run."""

    if config.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"not a LoRA adapter: peft_type {config.get('peft_type')!r}")
    for key, what in UNSUPPORTED.items():
        if config.get(key):
            raise LoraError(f"LoRA adapters with {what} are not supported by this engine")
    if config.get("bias", "none") != "none":
        raise LoraError(f"LoRA bias {config['bias']!r} is not supported (only 'none')")
    rank = int(config.get("r", 0) or 0)
    if rank < 1:
        raise LoraError(f"LoRA rank must be at least 1, got {rank}")
    if rank > max_rank:
        raise LoraError(f"LoRA rank {rank} is greater than max_lora_rank {max_rank}")
    return rank


def _tensors(path: str) -> dict[str, torch.Tensor]:
    folder = Path(path)
    try:
        if (folder / "adapter_model.safetensors").exists():
            from safetensors.torch import load_file

            return load_file(folder / "adapter_model.safetensors", device="cpu")
        if (folder / "adapter_model.bin").exists():
            return torch.load(folder / "adapter_model.bin", map_location="cpu",
                              weights_only=True)
    except Exception as exc:
        raise LoraError(f"unreadable LoRA weights in {path}: {type(exc).__name__}: {exc}"
                        ) from exc
    raise LoraError(f"no adapter_model.safetensors or adapter_model.bin in {path}")


def _targeted(config: dict[str, Any], model: nn.Module) -> Any:
    """A predicate on module names from ``target_modules`` (peft's matching), after checking
    that each listed name exists in the model."""

    targets = config.get("target_modules")
    if targets is None or targets == "all-linear":
        return lambda name: True
    if isinstance(targets, str):
        return lambda name: re.fullmatch(targets, name) is not None
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    for target in targets:
        if not any(n == target or n.endswith("." + target) for n in names):
            raise LoraError(f"target module {target!r} is not a linear layer of the base model")
    return lambda name: any(name == t or name.endswith("." + t) for t in targets)


def read_adapter(path: str, model: nn.Module, *, max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> AdapterWeights:
    """``path``'s adapter for ``model``, in ``dtype`` on ``device`` (see the module doc)."""

    config = read_config(path)
    rank = check_config(config, max_rank)
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targeted = _targeted(config, model)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _tensors(path).items():
        match = _KEY.match(key)
        if match is None:
            raise LoraError(f"unsupported tensor {key!r} in {path} (only lora_A/lora_B "
                            "weights of linear layers are)")
        pairs.setdefault(match["module"], {})[match["ab"]] = tensor
    if not pairs:
        raise LoraError(f"no LoRA weights in {path}")
    modules = {}
    for name, ab in sorted(pairs.items()):
        try:
            linear = model.get_submodule(name)
        except AttributeError:
            raise LoraError(f"target module {name!r} is not in the base model") from None
        if not isinstance(linear, nn.Linear):
            raise LoraError(f"target module {name!r} is a {type(linear).__name__}, not a "
                            "linear layer")
        if not targeted(name):
            raise LoraError(f"{path} holds weights for {name!r}, which target_modules "
                            "does not name")
        a, b = ab.get("A"), ab.get("B")
        if a is None or b is None:
            raise LoraError(f"{name!r} lacks its lora_{'A' if a is None else 'B'} weight")
        want_a, want_b = (rank, linear.in_features), (linear.out_features, rank)
        if tuple(a.shape) != want_a or tuple(b.shape) != want_b:
            raise LoraError(f"{name!r}: LoRA shapes A {tuple(a.shape)}, B {tuple(b.shape)} do "
                            f"not match r={rank} and the layer ({want_a}, {want_b})")
        bt = (b.to(device, torch.float32) * scaling).t().contiguous()
        modules[name] = (a.to(device, dtype).contiguous(), bt.to(dtype))
    return AdapterWeights(rank, modules)
