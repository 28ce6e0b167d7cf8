"""Load a causal LM and its tokenizer from a HF id or a local folder, on the right device/dtype."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

_DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}  # fmt: skip


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA when a GPU is visible, else the CPU."""

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but no CUDA GPU is visible")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA (what vLLM serves Qwen2.5 in), float32 on CPU (exact tests)."""

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of auto, {', '.join(_DTYPES)}") from None


def load_model(path: str, device: torch.device, dtype: torch.dtype,
               trust_remote_code: bool = False) -> Any:
    """The model in eval mode on ``device``; local folder or HF id (offline cache in this repo)."""

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, trust_remote_code=trust_remote_code, low_cpu_mem_usage=True
    )
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    log.info("model loaded", extra={"model": path, "device": str(device), "dtype": str(dtype)})
    return model


def load_tokenizer(path: str, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def eos_token_ids(model: Any, tokenizer: Any | None) -> list[int]:
    """Stop tokens as vLLM derives them: generation_config's eos ids plus the tokenizer's eos."""

    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.append(eos)
    elif eos:
        ids.extend(int(e) for e in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return sorted(set(ids))


def generation_defaults(model: Any) -> dict[str, float | int]:
    """Sampling defaults from ``generation_config.json`` (vLLM's ``--generation-config auto``)."""

    gen = getattr(model, "generation_config", None)
    if gen is None:
        return {}
    out: dict[str, float | int] = {}
    for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
        value = getattr(gen, key, None)
        if value is not None:
            out[key] = value
    # HF's own defaults (top_k=50 etc.) count only when the file sets them.
    try:
        from transformers import GenerationConfig

        bare = GenerationConfig()
        out = {k: v for k, v in out.items() if getattr(bare, k, None) != v or k in _explicit(gen)}
    except Exception:  # pragma: no cover - older transformers
        pass
    return out


def _explicit(gen: Any) -> set[str]:
    try:
        return set(gen.to_diff_dict())
    except Exception:  # pragma: no cover
        return set()
