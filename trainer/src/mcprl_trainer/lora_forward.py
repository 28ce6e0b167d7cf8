"""A leaner forward for peft's LoRA linears during training (same math, fewer kernels).

peft computes ``result + lora_B(lora_A(dropout(x))) * scaling``: after the base GEMM, a
scale and an add over the whole ``[tokens, out]`` output, each again in the backward, and
before that a cast of the input to the adapter's fp32, which bf16 autocast casts straight
back (a copy per linear, kept for the backward). In a 3B model's update those element-wise
passes and copies took more device time than the attention (bench/bench_trainer.py
``--kernel-profile``). Here the LoRA product is added into the base output by one in-place
``addmm_`` (``alpha`` = scaling), as the inference engine's LoRA layers do, and the input
stays in the compute dtype. The base output is not needed by its own backward, so writing
into it is safe for autograd.

Anything this path does not cover (adapters disabled, as for the reference policy, merged
weights, several active adapters, dropout, DoRA and other variants, extra forward
arguments) runs peft's own forward, so the switch is per call, not per model.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn


def _lean_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """peft's ``lora.Linear.forward`` for one plain active adapter, fused into one addmm_."""

    adapters = self.active_adapters
    name = adapters[0] if len(adapters) == 1 else None
    if (args or kwargs or self.disable_adapters or self.merged or name is None
            or name not in self.lora_A or name in self.lora_variant
            or not isinstance(self.lora_dropout[name], nn.Identity)
            or (x.dtype != self.lora_A[name].weight.dtype
                and not torch.is_autocast_enabled(x.device.type))):
        return type(self).forward(self, x, *args, **kwargs)
    # 2-D from the start: an in-place op on a *view* of the output would make autograd copy
    # the whole gradient back through it (CopySlices, a device-to-device copy per linear)
    rows = x.reshape(-1, x.shape[-1])
    result = self.base_layer(rows)
    lora_a = self.lora_A[name](rows)  # under autocast: bf16 GEMM, the tiny A cast, not x
    weight_b = self.lora_B[name].weight
    result.addmm_(lora_a, weight_b.to(lora_a.dtype).t(), alpha=self.scaling[name])
    return result.view(*x.shape[:-1], result.shape[-1])


def use_lean_lora_forward(model: nn.Module) -> int:
    """Give every peft LoRA ``Linear`` of ``model`` the lean forward; returns how many."""

    from peft.tuners.lora.layer import Linear as LoraLinear

    count = 0
    for module in model.modules():
        if type(module) is LoraLinear and not module.fan_in_fan_out:
            module.forward = types.MethodType(_lean_forward, module)
            count += 1
    return count
