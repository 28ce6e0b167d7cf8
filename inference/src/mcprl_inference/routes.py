"""HTTP routes: thin; each fetches its serving object from ``app.state`` (vLLM's layout)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from mcprl_common.errors import UpstreamUnavailableError
from mcprl_inference.api import (
    ChatCompletionRequest,
    CompletionRequest,
    IsSleepingResponse,
    LoadLoRAAdapterRequest,
    UnloadLoRAAdapterRequest,
)

openai_router = APIRouter(tags=["openai"])
lora_router = APIRouter(tags=["lora"])
sleep_router = APIRouter(tags=["sleep"])


def _state(request: Request) -> Any:
    return request.app.state.serving


@openai_router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> JSONResponse:
    result = await _state(request).chat.create(body)
    return JSONResponse(result.model_dump())


@openai_router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> JSONResponse:
    result = await _state(request).completions.create(body)
    return JSONResponse(result.model_dump())


@openai_router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    return JSONResponse(_state(request).models.list().model_dump())


_EMPTY_OK = {200: {"description": "Done (empty body, as vLLM answers).", "content": {}}}
_TEXT_OK = {200: {"description": "Done (a plain-text message, as vLLM answers).",
                  "content": {"text/plain": {"schema": {"type": "string"}}}}}


@openai_router.get("/health", response_class=Response, responses=_EMPTY_OK)
async def health(request: Request) -> Response:
    if not _state(request).engine.alive:
        raise UpstreamUnavailableError("the engine thread is not running")
    return Response(status_code=200)


@lora_router.post("/v1/load_lora_adapter", response_class=PlainTextResponse,
                  responses=_TEXT_OK)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> Response:
    return PlainTextResponse(await _state(request).models.load_lora(body))


@lora_router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse,
                  responses=_TEXT_OK)
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> Response:
    return PlainTextResponse(await _state(request).models.unload_lora(body))


@sleep_router.post("/sleep", response_class=Response, responses=_EMPTY_OK)
async def sleep(request: Request, level: int = Query(1, ge=1, le=2)) -> Response:
    await _state(request).sleep(level)
    return Response(status_code=200)


@sleep_router.post("/wake_up", response_class=Response, responses=_EMPTY_OK)
async def wake_up(request: Request, tags: list[str] | None = Query(None)) -> Response:
    await _state(request).wake_up()
    return Response(status_code=200)


@sleep_router.get("/is_sleeping")
async def is_sleeping(request: Request) -> JSONResponse:
    engine = _state(request).engine
    return JSONResponse(IsSleepingResponse(is_sleeping=engine.is_sleeping).model_dump())
