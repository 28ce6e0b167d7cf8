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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LoraSwitch:
    """What every :class:`LoraLinear` reads: the active rank, 0 when LoRA is off (the base
    model runs exactly its own kernels). A Python value, read when a graph is captured."""

    def __init__(self) -> None:
        self.rank = 0


class LoraLinear:
    """The active LoRA buffers of one linear layer, and the forward that uses them."""

    def __init__(self, linear: nn.Linear, max_rank: int, switch: LoraSwitch) -> None:
        weight = linear.weight
        self.linear, self.switch = linear, switch
        self.a = torch.zeros(max_rank, linear.in_features, dtype=weight.dtype,
                             device=weight.device)
        self.bt = torch.zeros(max_rank, linear.out_features, dtype=weight.dtype,
                              device=weight.device)
        linear.forward = self.forward  # the module (and its name, state dict) stays as it was

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.linear.weight, self.linear.bias)
        rank = self.switch.rank
        if rank:
            y.view(-1, y.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]) @ self.a[:rank].t(),
                                           self.bt[:rank])
        return y

    def to(self, device: torch.device | str) -> None:
        """Move the buffers (sleep mode; the graphs that held them are dropped by then)."""

        self.a, self.bt = self.a.to(device), self.bt.to(device)
