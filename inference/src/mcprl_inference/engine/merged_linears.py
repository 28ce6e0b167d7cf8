"""Merged projections: linears that read one input run as one GEMM (vLLM's
``QKVParallelLinear`` and ``MergedColumnParallelLinear``), inside the model's own code.

A 3B decode step at batch 64 spends more time in its GEMMs than reading the weights takes
(docs/benchmarks.md): q, k and v, and gate and up, are separate small GEMMs over the same
input (k and v only 256 columns wide). :func:`merge` lays each group's weights end to end in
one tensor and makes the modules' own parameters views of it: the same names, state dict and
memory, and in-place writes (the merged-LoRA mode) still land in the merged weight. In the
engine's decode steps, the first member called with an input computes the whole group's
output once; each member returns its column slice. Prefills, bound by compute, run the
members' own linears. HF's attention and MLP code stays as it is: it
calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` in turn with the same ``x``.

Anything else runs the member's own linear: a call outside the engine, another input, or
weights that are no longer where :meth:`MergedLinears.merge` put them. Merging changes the
number of kernels, never which function runs.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# Attribute names of the linears merged, per module that holds them (Llama, Qwen2/3, Mistral).
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
_MEMBER = "_mcprl_merged"  # on each member linear: (its group, its index)


class MergedLinears:
    """One group of linears with a shared input, and the forward its members run."""

    def __init__(self, names: list[str], linears: list[nn.Linear],
                 enabled: Callable[[], bool]) -> None:
        self.names, self.linears, self._enabled = names, linears, enabled
        ends = list(itertools.accumulate(m.out_features for m in linears))
        self.bounds = list(zip([0, *ends[:-1]], ends, strict=True))
        self.out_features = ends[-1]
        self.lora: Any = None  # a lora_layers.MergedLora, once an adapter reaches the group
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self._x: torch.Tensor | None = None  # the input whose output is held, until every
        self._y: torch.Tensor | None = None  # member took its slice
        self._left: set[int] = set()
        for i, linear in enumerate(linears):
            setattr(linear, _MEMBER, (self, i))
            linear.forward = functools.partial(self._forward, i)
        self.merge()

    @staticmethod
    def mergeable(linears: list[nn.Linear]) -> bool:
        first = linears[0]
        return all(type(m) is nn.Linear and m.in_features == first.in_features
                   and m.weight.dtype == first.weight.dtype
                   and m.weight.device == first.weight.device
                   and (m.bias is None) == (first.bias is None) for m in linears)

    def merge(self) -> None:
        """Lay the weights end to end, the members' parameters views of them (again after a
        device move gave each parameter its own storage)."""

        if self.merged():
            return
        with torch.no_grad():
            self.weight = torch.cat([m.weight for m in self.linears]).contiguous()
            has_bias = self.linears[0].bias is not None
            self.bias = torch.cat([m.bias for m in self.linears]) if has_bias else None
            for m, (a, b) in zip(self.linears, self.bounds, strict=True):
                m.weight.data = self.weight[a:b]
                if self.bias is not None:
                    m.bias.data = self.bias[a:b]

    def release(self) -> None:
        """Forget the merged tensors (sleep: the parameters move on their own)."""

        self.weight = self.bias = self._x = self._y = None

    def merged(self) -> bool:
        """The members' parameters are still the views :meth:`merge` made."""

        w = self.weight
        if w is None or w.device != self.linears[0].weight.device:
            return False
        row = w.stride(0) * w.element_size()
        return all(m.weight.data_ptr() == w.data_ptr() + a * row
                   for m, (a, _) in zip(self.linears, self.bounds, strict=True))

    def _forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if x is not self._x:
            if not (self._enabled() and self.merged()):
                return self._own_forward(index, x)
            y = F.linear(x, self.weight, self.bias)
            if self.lora is not None:
                self.lora.add_to(y, x)
            self._x, self._y, self._left = x, y, set(range(len(self.linears)))
        y = self._y
        assert y is not None
        self._left.discard(index)
        if not self._left:  # every member has its slice: hold no activation past the layer
            self._x = self._y = None
        a, b = self.bounds[index]
        return y[..., a:b]

    def _own_forward(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self.lora is not None:
            return self.lora.members[index].forward(x)
        linear = self.linears[index]
        return F.linear(x, linear.weight, linear.bias)


def group_of(module: nn.Module) -> tuple[MergedLinears, int] | None:
    """The merged group a linear belongs to, and its index in it (``None``: not merged)."""

    return getattr(module, _MEMBER, None)


def merge(model: nn.Module, enabled: Callable[[], bool]) -> list[MergedLinears]:
    """Merge every q/k/v and gate/up group of ``model`` that can be (same input size,
    dtype, device and bias); ``enabled`` says, at each call, whether the merged GEMM runs."""

    groups: list[MergedLinears] = []
    for prefix, module in model.named_modules():
        for attrs in GROUPS:
            linears = [getattr(module, a, None) for a in attrs]
            if not all(isinstance(m, nn.Linear) for m in linears):
                continue
            member = group_of(linears[0])
            if member is not None:  # merged before (a copy of a merged model): adopt it
                member[0].merge()
                groups.append(member[0])
            elif MergedLinears.mergeable(linears):
                names = [f"{prefix}.{a}" if prefix else a for a in attrs]
                groups.append(MergedLinears(names, linears, enabled))
    return groups
