"""Fewer, fused kernels for the decode step (CUDA): the step is launch-bound, not memory-bound.

A CUDA graph removes the CPU cost of a step but still runs every small kernel; HF's RMSNorm
is ~7 elementwise kernels and rotary embeddings ~10 per layer. While the engine's forward passes
run (``active()``), allow-listed RMSNorm modules use PyTorch's fused ``rms_norm`` and, with
``rotary``, the model's ``apply_rotary_pos_emb`` is replaced by a ``torch.compile``d one,
with ``proj``, q/k/v and gate/up run as one GEMM each (:mod:`.merged_linears`), and with
``mlp``, a SiLU MLP's ``silu(gate) * up`` is one compiled kernel instead of two, and with
``residual``, a decoder layer's two residual adds run inside other kernels: the first in a
compiled add + RMSNorm, the second in the down projection's GEMM (cuBLAS adds its ``C``
input, ``beta = 1``; a lean LoRA branch's delta is added in place after it). With ``kv`` and
the split-K decode attention, a decode step's new keys and values go into the cache with
one Triton kernel a layer (``decode_attention``'s ``write_decode_kv``), not two
``index_put``s. With ``rope`` as well, the rotary embedding
runs in no kernel of its own in decode steps: ``apply_rotary_pos_emb`` hands back the query
and key unrotated and keeps the model's (cos, sin), the KV write rotates the key on its way
into the cache and the split-K attention the query heads each program loads (the compiled
rotary was one kernel a layer, ~6 us each at batch 64 on an H100; with ``rope`` a step at
batch 64 took 3.96 ms against 4.23 on an H200). With ``attn`` and the split-K attention, a
layer's decode attention is one kernel, not three: it writes the step's new keys and values
itself (in place of ``kv``'s kernel) and the last program of each row and KV head merges
the chunks (in place of the merge kernel). With ``sample``, the sampler's common case (no
penalty, grammar mask or filter, at most the top-1 log-prob) is two Triton kernels after
the step instead of about a dozen (:mod:`.sampling_kernel`). The model runner turns
all but ``norm`` on in decode steps only: prefills are bound by compute, not by kernel
count, and the compiled rotary was slower there. Outside the engine (training, plain
``generate``) the model behaves exactly as before.

The rotary function is patched in the model's module, which every model of that class in
the process shares; so what is active is per thread (a context variable, each engine steps
in its own thread) and names the fusions of the engine that runs: an engine installed
without ``rotary`` keeps the eager one even after another engine patched the module.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
import torch.nn.functional as F

from mcprl_inference.engine.compiled import compiled_or_eager
from mcprl_inference.engine.lora_layers import LoraLinear

log = logging.getLogger(__name__)

# RMSNorm classes computing weight * x / rms(x) (not Gemma's (1 + weight)).
_NORMS = {"Qwen2RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Qwen3RMSNorm", "Qwen2MoeRMSNorm"}
# MLP classes computing down(act(gate(x)) * up(x)); fused where act is SiLU.
_MLPS = {"Qwen2MLP", "LlamaMLP", "MistralMLP", "Qwen3MLP"}
# Decoder layers computing h += attn(norm1(h)); h += mlp(norm2(h)), nothing else.
_LAYERS = {"Qwen2DecoderLayer", "LlamaDecoderLayer", "MistralDecoderLayer", "Qwen3DecoderLayer"}
NORM, ROTARY, PROJ, MLP, RESIDUAL, KV, ROPE, ATTN, SAMPLE = (
    "norm", "rotary", "proj", "mlp", "residual", "kv", "rope", "attn", "sample")
KINDS = (NORM, ROTARY, PROJ, MLP, RESIDUAL, KV, ROPE, ATTN, SAMPLE)
AUTO_CUDA = KINDS  # each measured faster on a GPU
_ACTIVE: ContextVar[frozenset[str]] = ContextVar("mcprl_fusions", default=frozenset())
# With ``rope`` active: the (cos, sin) of the layer whose query and key were left unrotated,
# None where they were rotated as usual.
_PENDING_ROPE: ContextVar[tuple[torch.Tensor, torch.Tensor] | None] = ContextVar(
    "mcprl_pending_rope", default=None)


@contextlib.contextmanager
def active(kinds: frozenset[str] = frozenset(KINDS)) -> Iterator[None]:
    """Within the block, in this thread, the fusions ``kinds`` run where installed."""

    token = _ACTIVE.set(frozenset(kinds))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def parse(fuse: str, device_type: str) -> frozenset[str]:
    """``auto``, ``none`` or kinds joined by ``+`` (``norm+proj``) -> the kinds to run.

    ``auto`` on CUDA is ``AUTO_CUDA``: on an H100 (docs/benchmarks.md) ``norm+rotary+proj``
    took a decode step at batch 64 from 7.44 to 6.21 ms, 9.50 to 7.54 with an unmerged LoRA,
    ``mlp`` then from 5.79 to 5.68 ms (7.13 to 7.00 with the LoRA), ``kv+residual`` from
    5.52 to 5.15 ms (another H100, the split-K attention), ``rope`` from 4.23 to 3.96 ms
    (an H200; 6.70 to 6.30 at batch 256), ``attn`` from 4.66 to 4.60 ms and ``sample`` then
    to 4.24 (an H100, 2026-12-07), and each passed the CUDA tests. ``kv``, ``rope`` and
    ``attn`` need the split-K attention (the CUDA default); the runner leaves them out
    without it (and ``kv``'s own kernel with ``attn``, which writes the K/V itself).
    On a CPU it is nothing: ``proj`` measured no steady gain there
    (bench/bench_inference.py --fuse none,proj)."""

    if fuse == "auto":
        return frozenset(AUTO_CUDA if device_type == "cuda" else ())
    if fuse == "none":
        return frozenset()
    kinds = [k.strip() for k in fuse.split("+")]
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"fuse must be auto, none or kinds of {', '.join(KINDS)} joined by "
                         f"'+', got {fuse!r}")
    return frozenset(kinds)


def is_active(kind: str) -> bool:
    """Whether the fusion ``kind`` runs now, in this thread."""

    return kind in _ACTIVE.get()


def pending_rope() -> tuple[torch.Tensor, torch.Tensor] | None:
    """(cos, sin) when this layer's query and key are still unrotated (``rope`` active):
    the KV write and the decode attention rotate them. None otherwise."""

    return _PENDING_ROPE.get() if ROPE in _ACTIVE.get() else None


def _defer_rope(q: torch.Tensor, cos: torch.Tensor, rest: tuple, kwargs: dict) -> bool:
    """Whether this call's rotary can be left to the KV write and attention kernels: one
    token a row (a decode step), HF's call with tables of the whole head size."""

    return (ROPE in _ACTIVE.get() and not rest and not kwargs and q.dim() == 4
            and q.shape[2] == 1 and cos.dim() == 3 and cos.shape[-1] == q.shape[-1])


def _norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    if NORM not in _ACTIVE.get():
        return type(self).forward(self, hidden_states)
    return F.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight,
                      self.variance_epsilon)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


_SILU_MUL = compiled_or_eager(_silu_mul, "silu * up")


def _gated(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    """``silu(gate(x)) * up(x)``: one compiled kernel for the product with ``mlp`` active."""

    gate, up = mlp.gate_proj(x), mlp.up_proj(x)
    return _SILU_MUL(gate, up) if MLP in _ACTIVE.get() else F.silu(gate) * up


def _mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    if MLP not in _ACTIVE.get():
        return type(self).forward(self, x)
    return self.down_proj(_gated(self, x))


def _add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = x + residual
    return hidden, F.rms_norm(hidden, (hidden.shape[-1],), weight, eps)


_ADD_RMS_NORM = compiled_or_eager(_add_rms_norm, "residual add + rms_norm")


def _plain_linear(module: Any) -> bool:
    """An ``nn.Linear`` without bias whose forward nobody replaced (a LoRA branch, a merged
    group): its output may be computed by another GEMM call."""

    return type(module) is torch.nn.Linear and module.bias is None and "forward" not in vars(
        module)


def _into(module: Any) -> Any:
    """``f(x, residual) = residual + module(x)`` with the add in the GEMM, for a plain linear
    or one with a lean LoRA branch (:class:`LoraLinear`, the served adapters: its delta is
    added in place after the GEMM); else None."""

    lora = None
    if not _plain_linear(module):
        lora = getattr(vars(module).get("forward"), "__self__", None)
        if not isinstance(lora, LoraLinear) or lora.linear is not module or module.bias is not None:
            return None

    def into(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out = torch.addmm(residual.reshape(-1, residual.shape[-1]), x.reshape(-1, x.shape[-1]),
                          module.weight.t()).view(residual.shape)
        if lora is not None:
            lora.add_to(out, x)
        return out

    return into


def _mlp_into(mlp: Any, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + mlp(x)``, the add in the down projection's GEMM where it can be."""

    into = _into(mlp.down_proj) if type(mlp).__name__ in _MLPS and getattr(
        mlp.config, "hidden_act", None) == "silu" else None
    if into is None:
        return residual + mlp(x)
    return into(_gated(mlp, x), residual)


def _layer_forward(self: Any, hidden_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> torch.Tensor:
    if RESIDUAL not in _ACTIVE.get() or args:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    residual = hidden_states
    hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states),
                                      **kwargs)
    norm = self.post_attention_layernorm
    hidden, normed = _ADD_RMS_NORM(hidden_states, residual, norm.weight,
                                   norm.variance_epsilon)
    return _mlp_into(self.mlp, normed, hidden)


def install(model: Any, *, norm: bool = True, rotary: bool = False,
            mlp: bool = False, residual: bool = False, rope: bool = False) -> list[str]:
    """Patch ``model`` in place; returns what was fused. ``rope`` is for the model runner
    to ask only with the KV write and split-K attention that take the rotary over."""

    done: list[str] = []
    if norm and hasattr(F, "rms_norm"):
        count = 0
        for module in model.modules():
            if type(module).__name__ in _NORMS and hasattr(module, "variance_epsilon"):
                module.forward = _norm_forward.__get__(module)
                count += 1
        if count:
            done.append(f"rms_norm x{count}")
    if rotary or rope:
        attn = next((m for m in model.modules() if type(m).__name__.endswith("Attention")), None)
        mod = sys.modules.get(type(attn).__module__) if attn is not None else None
        original = getattr(mod, "apply_rotary_pos_emb", None)
        if original is not None and not getattr(original, "_mcprl_patched", False):
            compiled = compiled_or_eager(original, "rotary")

            def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                     sin: torch.Tensor, *rest: Any, **kwargs: Any) -> Any:
                active = _ACTIVE.get()
                if ROPE in active:
                    if _defer_rope(q, cos, rest, kwargs):
                        _PENDING_ROPE.set((cos, sin))
                        return q, k
                    _PENDING_ROPE.set(None)
                if ROTARY not in active:
                    return original(q, k, cos, sin, *rest, **kwargs)
                return compiled(q, k, cos, sin, *rest, **kwargs)

            apply_rotary_pos_emb._mcprl_patched = True  # type: ignore[attr-defined]
            apply_rotary_pos_emb._mcprl_state = compiled._mcprl_state  # type: ignore[attr-defined]
            mod.apply_rotary_pos_emb = apply_rotary_pos_emb
        if original is not None and rotary:  # patched here or by an earlier engine
            done.append("rotary (torch.compile)")
        if original is not None and rope:
            done.append("rotary in the kv write + attention (triton)")
    if mlp:
        count = 0
        for module in model.modules():
            if (type(module).__name__ in _MLPS
                    and getattr(getattr(module, "config", None), "hidden_act", None) == "silu"):
                module.forward = _mlp_forward.__get__(module)
                count += 1
        if count:
            done.append(f"silu*up (torch.compile) x{count}")
    if residual:
        count = 0
        for module in model.modules():
            norm_module = getattr(module, "post_attention_layernorm", None)
            if (type(module).__name__ in _LAYERS and type(norm_module).__name__ in _NORMS
                    and hasattr(norm_module, "variance_epsilon")):
                module.forward = _layer_forward.__get__(module)
                count += 1
        if count:
            done.append(f"residual adds fused x{count}")
    if done:
        log.info("decode fusions installed", extra={"fusions": done})
    return done
