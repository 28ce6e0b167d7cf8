"""The lean unmerged LoRA branch: preallocated buffers per adapted linear, written in place.

Each adapted ``nn.Linear`` gets a :class:`LoraLinear` whose forward is ``y = F.linear(x, W,
b)`` and, while LoRA is on, ``y += (x @ A^T) @ (s B)^T``: one ``mm`` and one in-place
``addmm_`` more than the base layer (peft's branch ran ~4 kernels and its Python per module).

``A [max_rank, in]`` and ``Bt = (s B)^T [max_rank, out]`` are allocated once, as vLLM's LoRA
buffers are: activating, replacing or switching adapters copies weights into them in place,
so a captured CUDA graph (which holds their addresses) runs the new weights on its next
replay and never needs capturing again. The forward reads the first ``rank`` rows, the
active adapter's rank (:class:`LoraSwitch`): an adapter of rank 8 served under
``max_lora_rank`` 64 costs rank-8 matmuls, and a graph is captured per (shape, rank).

Linears merged into one GEMM (:mod:`.merged_linears`) share one :class:`MergedLora`: their
``A`` stacked and their ``B`` block-diagonal, so the group's branch is the same two kernels
as one linear's; each member's :class:`LoraLinear` holds views of its block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mcprl_inference.engine.merged_linears import MergedLinears


class LoraSwitch:
    """What every :class:`LoraLinear` reads: the active rank, 0 when LoRA is off (the base
    model runs exactly its own kernels). A Python value, read when a graph is captured."""

    def __init__(self) -> None:
        self.rank = 0


class LoraLinear:
    """The active LoRA buffers of one linear layer, and the forward that uses them."""

    def __init__(self, linear: nn.Linear, max_rank: int, switch: LoraSwitch,
                 buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        weight = linear.weight
        self.linear, self.switch = linear, switch
        if buffers is not None:  # views into a MergedLora's, whose group runs the forward
            self.a, self.bt = buffers
            return
        self.a = torch.zeros(max_rank, linear.in_features, dtype=weight.dtype,
                             device=weight.device)
        self.bt = torch.zeros(max_rank, linear.out_features, dtype=weight.dtype,
                              device=weight.device)
        linear.forward = self.forward  # the module (and its name, state dict) stays as it was

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.linear.weight, self.linear.bias)
        self.add_to(y, x)
        return y

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """``y`` (the base layer's output for ``x``) += the active LoRA delta, in place; the
        residual fusion calls it after its own base GEMM."""

        rank = self.switch.rank
        if rank:
            y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]) @ self.a[:rank].t(),
                                           self.bt[:rank])

    def to(self, device: torch.device | str) -> None:
        """Move the buffers (sleep mode; the graphs that held them are dropped by then)."""

        self.a, self.bt = self.a.to(device), self.bt.to(device)


class MergedLora:
    """The LoRA branch of a :class:`MergedLinears` group of ``G`` linears.

    ``A [max_rank, G, in]`` and ``Bt [max_rank, G, out]`` (``out``: the group's columns,
    member ``m``'s block nonzero only in its own columns), so the first ``rank`` rows reshape
    to ``[rank * G, ...]`` without a copy and ``y += (x @ A^T) @ Bt`` adds every member's
    delta to its own slice of the merged output."""

    def __init__(self, group: MergedLinears, max_rank: int, switch: LoraSwitch) -> None:
        self.group, self.max_rank, self.switch = group, max_rank, switch
        weight = group.linears[0].weight
        size = len(group.linears)
        self.a = torch.zeros(max_rank, size, weight.shape[1], dtype=weight.dtype,
                             device=weight.device)
        self.bt = torch.zeros(max_rank, size, group.out_features, dtype=weight.dtype,
                              device=weight.device)
        self.members = [LoraLinear(linear, max_rank, switch, self._views(i))
                        for i, linear in enumerate(group.linears)]
        group.lora = self

    def _views(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = self.group.bounds[index]
        return self.a[:, index], self.bt[:, index, lo:hi]

    def add_to(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """``y`` (the group's merged output) += every member's LoRA delta."""

        rank = self.switch.rank
        if rank:
            a = self.a[:rank].reshape(-1, self.a.shape[-1])
            bt = self.bt[:rank].reshape(-1, self.bt.shape[-1])
            y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]) @ a.t(), bt)

    def to(self, device: torch.device | str) -> None:
        """Move the buffers and point the members' views at them again (sleep mode)."""

        self.a, self.bt = self.a.to(device), self.bt.to(device)
        for i, member in enumerate(self.members):
            member.a, member.bt = self._views(i)
