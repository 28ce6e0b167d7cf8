"""The generation engine: scheduler thread, static slot KV cache, CUDA-graph decode, sampler.

Imports only torch and transformers (safetensors and xgrammar lazily; LoRA runs without
peft), so it runs where the service's web stack is not installed.
"""

from mcprl_inference.engine.config import EngineConfig
from mcprl_inference.engine.engine import (
    EngineError,
    EngineObserver,
    LLMEngine,
    RequestOutput,
    SequenceOutput,
)
from mcprl_inference.engine.sampling import SamplingParams

__all__ = [
    "EngineConfig",
    "EngineError",
    "EngineObserver",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "SequenceOutput",
]
