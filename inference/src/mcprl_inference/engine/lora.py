"""LoRA adapters: several loaded at once, one active per forward pass, run without peft.

Adapters are read from peft's files (:mod:`.lora_files`) into plain tensors, ``B`` pre-scaled.
Loading a name that exists replaces it (the trainer republishes ``policy`` every step).

As in vLLM, a loaded adapter stays *registered* (listed, servable) however many there are;
at most ``max_loras`` are *resident* in memory. Loading one more evicts the least recently
used resident adapter, and a request for an evicted one loads it again from its folder
(:meth:`LoraManager.ensure_resident`), so a long-lived engine serves run after run without
anyone unloading the old ones.

Activation has two modes. ``unmerged`` runs the lean LoRA branch of :mod:`.lora_layers` in
every adapted linear: preallocated buffers that activating an adapter (or republishing the
active one) overwrites in place, two extra kernels per linear, and captured CUDA graphs that
stay valid across republishes. ``merged`` writes ``W0 + B @ A`` into the base weights when
the active adapter changes and runs the plain base modules: the same function, at the base
model's speed (faster on a CPU, docs/benchmarks.md). Switching restores ``W0`` from a pristine
copy (never subtracts), so nothing drifts. ``auto`` merges only float32 weights: rounding
``W0 + delta`` to bf16 would lose most of a small delta, and the sampler's log-probs must
match the trainer's.

Two identities: :meth:`LoraManager.key` (name, version) changes whenever an adapter's weights
do (the prefix cache and prefill sharing key on it); :meth:`LoraManager.graph_key` changes
only with what a captured decode graph runs (LoRA on and its rank, the set of adapted
layers), not with the weights, which are written in place.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from mcprl_inference.engine.lora_files import (
    AdapterWeights,
    LoraError,
    read_adapter,
)
from mcprl_inference.engine.lora_layers import LoraLinear, LoraSwitch, MergedLora
from mcprl_inference.engine.merged_linears import group_of

__all__ = ["Adapter", "LoraError", "LoraManager"]

log = logging.getLogger(__name__)


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    version: int


class LoraManager:
    """Loads, replaces, unloads and activates adapters on one base model."""

    def __init__(self, model: nn.Module, *, max_loras: int, max_rank: int, mode: str = "auto",
                 on_layout_change: Callable[[], None] | None = None) -> None:
        if mode not in ("auto", "merged", "unmerged"):
            raise ValueError(f"LoRA mode must be auto, merged or unmerged, got {mode!r}")
        self.base = model
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.adapters: dict[str, Adapter] = {}  # registered: what /v1/models lists
        self._resident: OrderedDict[str, tuple[int, AdapterWeights]] = OrderedDict()  # LRU first
        self.evictions = 0
        self.reloads = 0
        self._versions = 0
        self._current: tuple[str, int] | None = None  # what the buffers/weights hold now
        dtype = next(model.parameters()).dtype
        self.merge = mode == "merged" or (mode == "auto" and dtype == torch.float32)
        self._pristine: dict[str, torch.Tensor] = {}  # module name -> W0 (merged mode)
        self._layers: dict[str, LoraLinear] = {}  # module name -> active buffers (unmerged)
        self._merged: list[MergedLora] = []  # their owners, for linears merged into one GEMM
        self._switch = LoraSwitch()
        self.layout = 0  # bumped when more layers get a LoRA branch (captured graphs lack it)
        self._on_layout_change = on_layout_change

    # loading ---------------------------------------------------------------------------
    def load(self, name: str, path: str) -> Adapter:
        """Register ``name`` at ``path`` and load it (replacing an adapter of that name; a
        load that fails leaves the old one as it was)."""

        adapter = self._load_resident(name, str(path))
        self.adapters[name] = adapter
        log.info("lora loaded", extra={"lora_name": name, "lora_path": str(path),
                                       "rank": adapter.rank})
        return adapter

    def is_resident(self, name: str) -> bool:
        return name in self._resident

    @property
    def resident_count(self) -> int:
        return len(self._resident)

    def ensure_resident(self, name: str) -> bool:
        """Load an evicted adapter again from its folder; True when it had to."""

        if name in self._resident:
            self._resident.move_to_end(name)
            return False
        registered = self.adapters[name]
        try:
            adapter = self._load_resident(name, registered.path)
        except LoraError:
            self.adapters.pop(name, None)  # its folder is gone: not servable any more
            raise
        self.adapters[name] = adapter
        self.reloads += 1
        log.info("lora reloaded", extra={"lora_name": name, "lora_path": registered.path})
        return True

    def _load_resident(self, name: str, path: str) -> Adapter:
        param = next(self.base.parameters())
        weights = read_adapter(path, self.base, max_rank=self.max_rank, dtype=param.dtype,
                               device=param.device)
        self._resident.pop(name, None)
        while len(self._resident) >= self.max_loras:
            evicted, _ = self._resident.popitem(last=False)
            self.evictions += 1
            log.info("lora evicted", extra={"lora_name": evicted,
                                            "max_loras": self.max_loras})
        if not self.merge:
            self._add_layers(weights.modules)
        self._versions += 1
        self._resident[name] = (self._versions, weights)
        return Adapter(name=name, path=path, rank=weights.rank, version=self._versions)

    def _add_layers(self, names: Iterable[str]) -> None:
        new = [n for n in names if n not in self._layers]
        for n in new:
            if n in self._layers:  # a member of a merged group added before it
                continue
            module = self.base.get_submodule(n)
            member = group_of(module)
            if member is None:
                self._layers[n] = LoraLinear(module, self.max_rank, self._switch)
                continue
            merged = MergedLora(member[0], self.max_rank, self._switch)  # the whole group
            self._merged.append(merged)
            self._layers.update(zip(member[0].names, merged.members, strict=True))
        if new:
            self.layout += 1
            if self._on_layout_change is not None:
                self._on_layout_change()

    def unload(self, name: str) -> None:
        if name not in self.adapters:
            raise LoraError(f"The lora adapter '{name}' cannot be found.", not_found=True)
        self._resident.pop(name, None)
        self.adapters.pop(name)
        log.info("lora unloaded", extra={"lora_name": name})

    # keys ------------------------------------------------------------------------------
    def key(self, name: str | None) -> tuple[str, int] | None:
        """Identity of an adapter's current weights (prefix cache, prefill sharing)."""

        if name is None:
            return None
        return (name, self.adapters[name].version)

    def graph_key(self) -> Hashable:
        """What a decode graph captured now runs, apart from the weights (written in place
        by :meth:`activate`, so a republish or a switch keeps the captured graphs)."""

        rank = self._switch.rank
        return (self.layout, rank) if rank else None

    def active_buffers(self) -> list[torch.Tensor]:
        """The tensors the unmerged forward reads (captured graphs hold these objects)."""

        merged = [t for m in self._merged for t in (m.a, m.bt)]
        owned = (layer for n, layer in self._layers.items() if group_of(layer.linear) is None)
        return merged + [t for layer in owned for t in (layer.a, layer.bt)]

    # activation ------------------------------------------------------------------------
    def activate(self, name: str | None) -> None:
        """Make ``name`` (or the bare base model for ``None``) what the next forward runs."""

        want = None if name is None else (name, self._resident[name][0])
        if want == self._current:
            return
        weights = None if name is None else self._resident[name][1]
        with torch.no_grad():
            if self.merge:
                self._write_weights(weights)
            else:
                self._write_buffers(weights)
        self._current = want

    def _write_buffers(self, weights: AdapterWeights | None) -> None:
        if weights is None:
            self._switch.rank = 0
            return
        r = weights.rank
        idle = [t[:r] for n, layer in self._layers.items() if n not in weights.modules
                for t in (layer.a, layer.bt)]
        if idle:
            torch._foreach_zero_(idle)
        dst, src = [], []
        for n, (a, bt) in weights.modules.items():
            layer = self._layers[n]
            dst += [layer.a[:r], layer.bt[:r]]
            src += [a, bt]
        torch._foreach_copy_(dst, src)
        self._switch.rank = r

    def _write_weights(self, weights: AdapterWeights | None) -> None:
        """Base weights := W0 (+ the adapter's ``B @ A``) in every layer either touches."""

        target = weights.modules if weights is not None else {}
        for n in set(self._pristine) | set(target):
            weight = self.base.get_submodule(n).weight
            w0 = self._pristine.get(n)
            if w0 is None:
                w0 = self._pristine[n] = weight.detach().clone()
            weight.copy_(w0)
            if n in target:
                a, bt = target[n]
                weight.addmm_(bt.t(), a)

    def move_pristine(self, device: Any) -> None:
        """Keep the W0 copies, the resident adapters and the active buffers where the model
        is (sleep moves the model to the CPU; the captured graphs are dropped by then)."""

        self._pristine = {k: v.to(device) for k, v in self._pristine.items()}
        for name, (version, weights) in self._resident.items():
            self._resident[name] = (version, weights.to(device))
        for merged in self._merged:
            merged.to(device)
        for layer in self._layers.values():
            if group_of(layer.linear) is None:
                layer.to(device)
