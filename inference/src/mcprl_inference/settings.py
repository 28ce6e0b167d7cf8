"""Settings of the inference service (env prefix ``INFERENCE_``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from mcprl_common.settings import ServiceSettings
from mcprl_inference.engine import fusions
from mcprl_inference.engine.config import EngineConfig


class InferenceSettings(ServiceSettings):
    """One engine serving one base model and its LoRA adapters over vLLM's OpenAI API."""

    model_config = SettingsConfigDict(env_prefix="INFERENCE_", extra="ignore",
                                      populate_by_name=True, protected_namespaces=())

    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on (vLLM's 8000).")
    model: str = Field("Qwen/Qwen2.5-3B-Instruct",
                       description="HF model id or local folder of the base model.")
    served_model_name: str | None = Field(
        None, description="Name clients send as `model`; defaults to `model` (as vLLM).")
    dtype: str = Field("auto", description="auto (bf16 on CUDA, fp32 on CPU), bfloat16, "
                                           "float16 or float32.")
    device: str = Field("auto", description="auto (CUDA if visible, else CPU), cpu, cuda, cuda:N.")
    max_model_len: int | None = Field(
        None, ge=16, description="Prompt + completion tokens at most; default: the model's "
                                 "max_position_embeddings.")
    max_batch_size: int = Field(64, ge=1, le=4096,
                                description="Sequences decoded together at most (vLLM "
                                            "--max-num-seqs).")
    max_prefill_tokens: int | None = Field(
        None, ge=16, description="Prompt tokens per prefill pass; default 16384 CUDA / 2048 CPU.")
    kv_cache_memory_gb: float | None = Field(
        None, gt=0, description="KV-cache budget in GiB; default: from gpu_memory_utilization "
                                "on CUDA, 4 GiB on CPU.")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1,
                                          description="Share of GPU memory the engine may use.")
    cuda_graphs: bool = Field(True, description="Capture decode steps in CUDA graphs (CUDA only).")
    capture_all_batch_sizes: bool = Field(
        True, description="With the split-K decode attention, capture the graphs of every "
                          "batch bucket the KV cache holds at the first decode (vLLM captures "
                          "at startup); false: each bucket when a step first needs it.")
    enable_lora: bool = Field(True, description="Serve /v1/load_lora_adapter and "
                                                "/v1/unload_lora_adapter (vLLM --enable-lora).")
    max_loras: int = Field(8, ge=1, description="LoRA adapters in memory at once at most; "
                           "loading another evicts the least recently used, which a request "
                           "for it loads again from its folder (vLLM's LRU).")
    max_lora_rank: int = Field(64, ge=1, description="Largest LoRA rank accepted "
                                                     "(vLLM --max-lora-rank).")
    lora_mode: Literal["auto", "merged", "unmerged"] = Field(
        "auto", description="Run the active adapter merged into the weights (the base model's "
                            "speed) or as peft's LoRA branch; auto merges float32 weights only "
                            "(bf16 would round a small delta away).")
    strict_lora_reload: bool = Field(
        False, description="As vLLM: loading a lora_name that is loaded needs "
                           "load_inplace=true (else 400). Default false: the new weights "
                           "replace the old ones either way.")
    lora_modules: str = Field("", description="Adapters to load at start: 'name=path,name2=path2' "
                                              "(vLLM --lora-modules).")
    enable_sleep_mode: bool = Field(True, description="Serve /sleep, /wake_up, /is_sleeping "
                                                      "(vLLM --enable-sleep-mode + dev mode).")
    enable_auto_tool_choice: bool = Field(True, description="Parse tool calls out of chat "
                                                            "completions (vLLM "
                                                            "--enable-auto-tool-choice).")
    tool_call_parser: str = Field("hermes", description="The model format whose tool-call "
                                                        "parser reads tool calls (registry in "
                                                        "mcprl_common.model_formats).")
    chat_template: str | None = Field(None, description="Path of a Jinja chat template that "
                                                        "replaces the tokenizer's.")
    max_logprobs: int = Field(20, ge=0, description="Largest top_logprobs/logprobs a request may "
                                                    "ask for (vLLM default 20).")
    generation_config: str = Field("auto", description="'auto': sampling defaults from the "
                                                       "model's generation_config.json (as "
                                                       "vLLM); 'vllm': none.")
    seed: int = Field(0, description="Seed of the RNG that seeds requests that bring none.")
    trust_remote_code: bool = Field(False, description="Allow model code from the model folder.")
    decode_attention: str = Field("auto", description="Decode attention kernel: auto (triton "
                                                      "on CUDA, sdpa elsewhere), sdpa, matmul, "
                                                      "or triton (split-K, CUDA: each row reads "
                                                      "its own length).")
    fuse: str = Field("auto", description="Fused kernels: auto (all on CUDA, none on "
                                          "CPU), none, or kinds joined by '+': norm "
                                          "(fused RMSNorm), rotary (compiled rotary embedding), "
                                          "proj (q/k/v and gate/up as one GEMM each), mlp "
                                          "(compiled silu(gate)*up), residual (residual adds "
                                          "inside add+RMSNorm and the down GEMM), kv (one "
                                          "Triton kernel writes a decode step's K/V, with the "
                                          "split-K attention), rope (with kv or attn: the "
                                          "rotary inside that write and the attention), attn "
                                          "(the split-K attention writes the K/V and merges "
                                          "its chunks itself: one kernel a layer) and sample "
                                          "(the common sampling case in two Triton kernels), "
                                          "all but norm in decode steps only; e.g. norm+proj.")
    enable_prefix_caching: bool = Field(
        True, description="Reuse the KV of earlier sequences for prompts that start with the "
                          "same tokens (vLLM --enable-prefix-caching): an agent's next turn and "
                          "every rollout's shared system prompt skip their cached start.")
    prefix_cache_memory_gb: float | None = Field(
        None, gt=0, description="Memory of the prefix cache in GiB; unset: 1 GiB on CPU, 10% "
                                "of the KV cache budget (at most 8 GiB) on CUDA.")
    async_scheduling: bool | None = Field(
        None, description="Launch each decode step before the host reads the step before "
                          "(vLLM --async-scheduling), so the GPU does not wait while the host "
                          "takes tokens and checks stops; unset: on with CUDA, off on CPU.")
    scheduler_delay_factor: float = Field(
        0.0, ge=0, le=100, description="While a batch decodes, hold new prompts until the "
        "oldest has waited this many times the last prefill's time (vLLM "
        "--scheduler-delay-factor): a burst of requests arriving over a few milliseconds "
        "prefills in one pass. 0: admit at every step; an idle engine admits at once.")
    profile: bool = Field(
        False, description="Time each decode step's forward pass and sampling apart with CUDA "
                           "events (mcprl_inference_decode_forward_seconds_total, "
                           "mcprl_inference_sample_seconds_total); it syncs the stream every "
                           "step, so it costs a little speed. CUDA only; for benchmarks.")
    request_timeout_s: float = Field(600.0, gt=0, description="A request still queued or "
                                                              "running after this fails (504).")

    @field_validator("fuse")
    @classmethod
    def _known_fusions(cls, value: str) -> str:
        fusions.parse(value, "cuda")  # raises ValueError naming the kinds
        return value

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            device=self.device, dtype=self.dtype, max_batch_size=self.max_batch_size,
            max_model_len=self.max_model_len, max_prefill_tokens=self.max_prefill_tokens,
            kv_cache_memory_gb=self.kv_cache_memory_gb,
            gpu_memory_utilization=self.gpu_memory_utilization, cuda_graphs=self.cuda_graphs,
            capture_all_batch_sizes=self.capture_all_batch_sizes,
            max_loras=self.max_loras, max_lora_rank=self.max_lora_rank, lora_mode=self.lora_mode,
            max_logprobs=self.max_logprobs, seed=self.seed,
            decode_attention=self.decode_attention, fuse=self.fuse,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_cache_memory_gb=self.prefix_cache_memory_gb, profile=self.profile,
            async_scheduling=self.async_scheduling,
            scheduler_delay_factor=self.scheduler_delay_factor,
        )

    def static_loras(self) -> list[tuple[str, str]]:
        out = []
        for item in filter(None, (x.strip() for x in self.lora_modules.split(","))):
            name, sep, path = item.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"INFERENCE_LORA_MODULES item {item!r} is not name=path")
            out.append((name.strip(), path.strip()))
        return out
