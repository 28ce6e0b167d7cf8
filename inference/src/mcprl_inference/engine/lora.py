"""LoRA adapters with peft: several loaded at once, one active per forward pass.

The base model is wrapped in a ``PeftModel`` on the first load; peft injects its LoRA layers
into the base model's modules in place, so the model runner's references to the decoder and the
LM head stay valid. Loading a name that exists replaces it (the trainer republishes ``policy``
every step); ``version`` changes on every load so captured CUDA graphs of the old weights are
never replayed.

As in vLLM, a loaded adapter stays *registered* (listed, servable) however many there are;
at most ``max_loras`` are *resident* in memory. Loading one more evicts the least recently
used resident adapter, and a request for an evicted one loads it again from its folder
(:meth:`LoraManager.ensure_resident`), so a long-lived engine serves run after run without
anyone unloading the old ones.

Activation has two modes. ``unmerged`` runs peft's LoRA branch in every adapted linear (two
extra matmuls and peft's Python per module). ``merged`` writes ``W0 + scale * B @ A`` into
the base weights when the active adapter changes and runs the plain base modules: the same
function, at the base model's speed (about 1.3x peft's branch for a 5M model on a CPU at
batch 8, docs/benchmarks.md). Switching restores ``W0`` from a pristine copy (never subtracts), so
nothing drifts. ``auto`` merges only float32 weights: rounding ``W0 + delta`` to bf16 would
lose most of a small delta, and the sampler's log-probs must match the trainer's.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class LoraError(Exception):
    """A load/unload the client got wrong (bad path, rank too large, unknown name)."""

    def __init__(self, message: str, *, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    version: int


class LoraManager:
    """Loads, replaces, unloads and activates adapters on one base model."""

    def __init__(self, model: Any, *, max_loras: int, max_rank: int,
                 mode: str = "auto") -> None:
        if mode not in ("auto", "merged", "unmerged"):
            raise ValueError(f"LoRA mode must be auto, merged or unmerged, got {mode!r}")
        self.base = model
        self.peft: Any = None
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.adapters: dict[str, Adapter] = {}  # registered: what /v1/models lists
        self._resident: OrderedDict[str, None] = OrderedDict()  # in memory, LRU first
        self.evictions = 0
        self.reloads = 0
        self._versions = 0
        self._active: str | None = None
        dtype = next(model.parameters()).dtype
        self.merge = mode == "merged" or (mode == "auto" and str(dtype) == "torch.float32")
        self._pristine: dict[int, Any] = {}  # id(lora layer) -> W0 (merged mode)

    def _read_config(self, path: str) -> dict[str, Any]:
        folder = Path(path)
        cfg = folder / "adapter_config.json"
        if not folder.exists() or not cfg.exists():
            raise LoraError(f"No adapter found for {path}: no adapter_config.json there",
                            not_found=True)
        try:
            return json.loads(cfg.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LoraError(f"unreadable adapter_config.json in {path}: {exc}") from exc

    def load(self, name: str, path: str) -> Adapter:
        """Register ``name`` at ``path`` and load it (replacing an adapter of that name)."""

        config = self._read_config(path)
        rank = int(config.get("r", 0) or 0)
        if rank > self.max_rank:
            raise LoraError(f"LoRA rank {rank} is greater than max_lora_rank {self.max_rank}")
        adapter = self._load_resident(name, str(path))
        adapter.rank = rank
        self.adapters[name] = adapter
        log.info("lora loaded", extra={"lora_name": name, "lora_path": str(path), "rank": rank})
        return adapter

    def is_resident(self, name: str) -> bool:
        return name in self._resident

    @property
    def resident_count(self) -> int:
        return len(self._resident)

    def ensure_resident(self, name: str) -> bool:
        """Load an evicted adapter again from its folder; True when it had to (the model's
        weights changed, so the caller drops what it captured of them)."""

        if name in self._resident:
            self._resident.move_to_end(name)
            return False
        registered = self.adapters[name]
        try:
            self._read_config(registered.path)
            adapter = self._load_resident(name, registered.path)
        except LoraError:
            self.adapters.pop(name, None)  # its folder is gone: not servable any more
            raise
        adapter.rank = registered.rank
        self.adapters[name] = adapter
        self.reloads += 1
        log.info("lora reloaded", extra={"lora_name": name, "lora_path": registered.path})
        return True

    def _load_resident(self, name: str, path: str) -> Adapter:
        if name in self._resident:
            self._delete(name)
        while len(self._resident) >= self.max_loras:
            evicted = next(iter(self._resident))
            self._delete(evicted)
            self.evictions += 1
            log.info("lora evicted", extra={"lora_name": evicted,
                                            "max_loras": self.max_loras})
        try:
            if self.peft is None:
                from peft import PeftModel

                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name,
                                                      is_trainable=False)
            else:
                self.peft.load_adapter(path, adapter_name=name, is_trainable=False)
        except Exception as exc:
            if self.peft is not None and name in getattr(self.peft, "peft_config", {}):
                self._delete(name)
            raise LoraError(f"could not load LoRA adapter {name!r} from {path}: "
                            f"{type(exc).__name__}: {exc}") from exc
        self.peft.eval()
        self.base.requires_grad_(False)
        self._versions += 1
        self._resident[name] = None
        self._active = "?"  # force re-activation
        return Adapter(name=name, path=path, rank=0, version=self._versions)

    def _delete(self, name: str) -> None:
        """Drop ``name``'s weights from memory (it stays registered)."""

        if self.merge:
            self._write_weights(None)  # W0 back before peft drops the layers' adapter
        if self.peft is not None and name in self.peft.peft_config:
            self.peft.delete_adapter(name)
        self._resident.pop(name, None)
        self._active = "?"

    def unload(self, name: str) -> None:
        if name not in self.adapters:
            raise LoraError(f"The lora adapter '{name}' cannot be found.", not_found=True)
        self._delete(name)
        self.adapters.pop(name)
        log.info("lora unloaded", extra={"lora_name": name})

    def key(self, name: str | None) -> tuple[str, int] | None:
        """Identity of an adapter's current weights (for graph caches)."""

        if name is None:
            return None
        return (name, self.adapters[name].version)

    def activate(self, name: str | None) -> None:
        """Make ``name`` (or the bare base model for ``None``) what the next forward runs."""

        if self.peft is None or name == self._active:
            return
        lora_model = self.peft.base_model
        if self.merge:
            # Weights first, flags after: peft unmerges (subtracts) a disabled merged layer.
            if name is not None:
                self.peft.set_adapter(name)
            self._write_weights(name)
            if name is None:
                lora_model.disable_adapter_layers()
            else:
                lora_model.enable_adapter_layers()
        elif name is None:
            lora_model.disable_adapter_layers()
        else:
            lora_model.enable_adapter_layers()
            self.peft.set_adapter(name)
        self._active = name

    def move_pristine(self, device: Any) -> None:
        """Keep the W0 copies where the model is (sleep moves the model to the CPU)."""

        self._pristine = {k: v.to(device) for k, v in self._pristine.items()}

    def _lora_layers(self) -> list[Any]:
        from peft.tuners.lora import LoraLayer

        return [m for m in self.peft.modules() if isinstance(m, LoraLayer)]

    def _write_weights(self, name: str | None) -> None:
        """Base weights := W0 (+ ``name``'s delta); peft's layers then run the base only."""

        import torch

        if self.peft is None:
            return
        with torch.no_grad():
            for layer in self._lora_layers():
                weight = layer.get_base_layer().weight
                w0 = self._pristine.get(id(layer))
                if w0 is None:
                    if not layer.merged_adapters and name is None:
                        continue  # untouched: nothing to restore
                    w0 = self._pristine[id(layer)] = weight.detach().clone()
                weight.copy_(w0)
                if name is not None and name in layer.lora_A:
                    weight.add_(layer.get_delta_weight(name).to(weight.dtype))
                    layer.merged_adapters = [name]
                else:
                    layer.merged_adapters = []
