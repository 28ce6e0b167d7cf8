"""What the chat and completions endpoints share: sampling parameters from a request, structured
output grammars, running a request on the engine, and turning token ids back into text.

No FastAPI here (vLLM's ``serving_*`` split): errors are mcprl_common ServiceErrors that the
app's handlers turn into OpenAI-shaped JSON.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anyio

from mcprl_common.errors import (
    BadRequestError,
    NotFoundError,
    ServiceError,
    UpstreamUnavailableError,
)
from mcprl_inference.api import ResponseFormat, SamplingFields
from mcprl_inference.engine import EngineError, LLMEngine, RequestOutput, SamplingParams
from mcprl_inference.engine.engine import SEED_MASK
from mcprl_inference.engine.grammar import GrammarCompiler, GrammarError
from mcprl_inference.serving_models import ServingModels
from mcprl_inference.settings import InferenceSettings

log = logging.getLogger(__name__)


class GatewayTimeoutError(ServiceError):
    status_code = 504
    error_type = "TimeoutError"


def engine_error_to_service(exc: EngineError) -> ServiceError:
    if exc.kind == "not_found":
        return NotFoundError(str(exc), param="model")
    if exc.kind == "unavailable":
        return UpstreamUnavailableError(str(exc), retry_after_s=5)
    if exc.kind == "bad_request":
        return BadRequestError(str(exc))
    return ServiceError(str(exc))


class ServingBase:
    """Shared logic of the generation endpoints."""

    def __init__(self, engine: LLMEngine, models: ServingModels, settings: InferenceSettings,
                 defaults: dict[str, Any]) -> None:
        self.engine = engine
        self.models = models
        self.settings = settings
        self.tokenizer = engine.tokenizer
        self.defaults = defaults
        self._grammar: GrammarCompiler | None = None

    # parameters --------------------------------------------------------------------------
    def sampling_params(self, req: SamplingFields, *, max_tokens: int | None, prompt_len: int,
                        logprobs: int | None, grammar: Any) -> SamplingParams:
        if req.stream:
            raise BadRequestError("stream=true is not supported by this engine; send "
                                  "non-streaming requests", param="stream")
        d = self.defaults

        def pick(value: Any, key: str, fallback: Any) -> Any:
            return value if value is not None else d.get(key, fallback)

        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if max_tokens is None:
            max_tokens = max(self.engine.max_model_len - prompt_len, 1)
        for tid in req.stop_token_ids or []:
            if tid < 0 or tid >= self.engine.vocab_size:
                raise BadRequestError(f"stop_token_ids: token id {tid} is out of vocabulary",
                                      param="stop_token_ids")
        top_k = pick(req.top_k, "top_k", 0)
        return SamplingParams(
            n=req.n,
            max_tokens=max_tokens,
            temperature=float(pick(req.temperature, "temperature", 1.0)),
            top_p=float(pick(req.top_p, "top_p", 1.0)),
            top_k=int(top_k) if top_k and top_k > 0 else 0,
            min_p=float(pick(req.min_p, "min_p", 0.0)),
            repetition_penalty=float(pick(req.repetition_penalty, "repetition_penalty", 1.0)),
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=None if req.seed is None else req.seed & SEED_MASK,
            stop=stop,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            grammar=grammar,
            extra={"skip_special_tokens": req.skip_special_tokens},
        )

    def grammar_compiler(self) -> GrammarCompiler:
        if self._grammar is None:
            self._grammar = GrammarCompiler(self.tokenizer, self.engine.vocab_size,
                                            sorted(self.engine.eos_ids))
        return self._grammar

    async def grammar_for(self, fmt: ResponseFormat | None) -> Any:
        """Compile ``response_format`` (json_schema / json_object) off the event loop."""

        if fmt is None or fmt.type == "text":
            return None
        compiler = await anyio.to_thread.run_sync(self.grammar_compiler)
        if fmt.type == "json_object":
            return await anyio.to_thread.run_sync(compiler.any_json)
        spec = fmt.json_schema
        if spec is None or spec.json_schema is None:
            raise BadRequestError("response_format of type json_schema needs "
                                  "json_schema.schema", param="response_format")
        schema = spec.json_schema
        try:
            return await anyio.to_thread.run_sync(
                lambda: compiler.json_schema(schema, strict=spec.strict is not False))
        except GrammarError as exc:
            raise BadRequestError(str(exc), param="response_format") from exc

    # running -----------------------------------------------------------------------------
    def check(self, prompt_len: int, params: SamplingParams) -> None:
        try:
            self.engine.check(prompt_len, params)
        except EngineError as exc:
            raise engine_error_to_service(exc) from exc

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       adapter: str | None, request_id: str) -> RequestOutput:
        try:
            future = self.engine.add_request(prompt_ids, params, adapter, request_id)
        except EngineError as exc:
            raise engine_error_to_service(exc) from exc
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future),
                                          self.settings.request_timeout_s)
        except EngineError as exc:
            raise engine_error_to_service(exc) from exc
        except TimeoutError as exc:
            self.engine.abort(request_id)
            raise GatewayTimeoutError(f"request {request_id} did not finish within "
                                      f"{self.settings.request_timeout_s:.0f}s") from exc
        except asyncio.CancelledError:
            self.engine.abort(request_id)
            raise

    # text --------------------------------------------------------------------------------
    def output_text(self, token_ids: list[int], finish_reason: str,
                    stop_reason: int | str | None, params: SamplingParams,
                    include_stop: bool, skip_special: bool) -> str:
        """Detokenize as vLLM: drop a final stop/eos token, cut at a matched stop string."""

        ids = token_ids
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos
                                                 else self.engine.eos_ids)
        if (finish_reason == "stop" and not isinstance(stop_reason, str) and ids
                and ids[-1] in stop_ids and not include_stop):
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special)
        if finish_reason == "stop" and isinstance(stop_reason, str):
            at = text.find(stop_reason)
            if at >= 0:
                text = text[: at + len(stop_reason)] if include_stop else text[:at]
        return text

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])
