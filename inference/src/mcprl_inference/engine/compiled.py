"""``torch.compile`` with a way back: the engine's small fused kernels (the rotary, the SiLU
product, the sampler's noise) must never stop it from serving where compiling fails (no
compiler toolchain), so the first failure falls back to the eager function for good."""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


def compiled_or_eager(fn: Any, what: str) -> Any:
    """``fn`` through ``torch.compile`` (dynamic shapes, one graph), or ``fn`` itself once
    compiling has failed. A failure while a CUDA graph is being captured is raised: the
    capture is broken either way. The wrapper's ``_mcprl_state["fn"]`` is what it calls."""

    state: dict[str, Any] = {"fn": torch.compile(fn, dynamic=True, fullgraph=True)}

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return state["fn"](*args, **kwargs)
        except Exception as exc:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise
            log.warning("compiled %s failed, using the eager one: %s", what, exc)
            state["fn"] = fn
            return fn(*args, **kwargs)

    call._mcprl_state = state  # type: ignore[attr-defined]
    return call
