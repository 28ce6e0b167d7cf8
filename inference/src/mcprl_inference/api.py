"""Wire models of the engine's HTTP API: vLLM's (>= 0.10.2) OpenAI-compatible shapes.

Request models accept and ignore unknown fields (as vLLM does, with its extensions such as
``return_token_ids``, ``top_k``, ``stop_token_ids``); responses carry vLLM's extra fields
(``token_ids``, ``prompt_token_ids``, ``stop_reason``) next to OpenAI's.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mcprl_common.wire.tool_calls import ToolCall


class _Request(BaseModel):
    # strict: a field is the type its schema says (no `false` for an integer, no "0.5" for a
    # number, which lax mode would coerce and the OpenAPI document does not allow)
    model_config = ConfigDict(extra="ignore", populate_by_name=True, protected_namespaces=(),
                              strict=True)


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())


# ---- shared request pieces ------------------------------------------------------------------
class JsonSchemaSpec(_Request):
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class SamplingFields(_Request):
    """Sampling fields both endpoints share (OpenAI's plus vLLM's extensions)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=1024)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    response_format: ResponseFormat | None = None
    stream: bool = False
    user: str | None = None


# ---- chat ------------------------------------------------------------------------------------
class ChatMessage(_Request):
    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ToolFunction(_Request):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"] = "function"
    function: ToolFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class TopLogprob(_Wire):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobEntry(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(_Wire):
    content: list[ChatLogprobEntry] | None = None


class ChatResponseMessage(_Wire):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning_content: str | None = None


class ChatChoice(_Wire):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class UsageInfo(_Wire):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class _Response(_Wire):
    """What both completion responses carry, in vLLM's field order (subclasses narrow
    ``object`` and ``choices`` in place)."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Any]
    usage: UsageInfo


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    prompt_logprobs: None = None
    prompt_token_ids: list[int] | None = None


# ---- completions -----------------------------------------------------------------------------
class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None


class CompletionLogprobs(_Wire):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(_Wire):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


# ---- models, LoRA, sleep ---------------------------------------------------------------------
class ModelCard(_Wire):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "mcprl-inference"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(_Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(_Request):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(_Request):
    lora_name: str | None = None
    lora_int_id: int | None = None


class IsSleepingResponse(_Wire):
    is_sleeping: bool
