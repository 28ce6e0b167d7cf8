"""``create_app(settings)``: the FastAPI app; the model loads in the lifespan, not at import."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import FastAPI

from mcprl_common.metrics import new_registry
from mcprl_common.model_formats import get_tool_parser
from mcprl_common.service_app import add_ops_routes
from mcprl_inference.engine import LLMEngine
from mcprl_inference.engine.loader import generation_defaults
from mcprl_inference.metrics import EngineMetrics
from mcprl_inference.routes import lora_router, openai_router, sleep_router
from mcprl_inference.serving_chat import ServingChat
from mcprl_inference.serving_completions import ServingCompletions
from mcprl_inference.serving_models import ServingModels
from mcprl_inference.settings import InferenceSettings

log = logging.getLogger(__name__)
SERVICE = "inference"


@dataclass
class ServingState:
    """Everything the routes need, built once the model is loaded."""

    engine: LLMEngine
    models: ServingModels
    chat: ServingChat
    completions: ServingCompletions
    metrics: EngineMetrics

    async def sleep(self, level: int) -> None:
        await asyncio.wrap_future(self.engine.sleep(level))
        self.metrics.sleeping.labels(self.metrics.model_name).set(1)

    async def wake_up(self) -> None:
        await asyncio.wrap_future(self.engine.wake_up())
        self.metrics.sleeping.labels(self.metrics.model_name).set(0)


def build_state(settings: InferenceSettings, metrics: EngineMetrics) -> ServingState:
    """Load the model and wire the serving objects (blocking: runs in a worker thread)."""

    engine = LLMEngine.from_pretrained(settings.model, settings.engine_config(), observer=metrics,
                                       trust_remote_code=settings.trust_remote_code)
    for name, path in settings.static_loras():
        engine.lora.load(name, path)
    metrics.watch_lora(engine.lora)
    metrics.watch_engine(engine)
    engine.start()
    models = ServingModels(engine, settings.model_name, settings.model,
                           on_load=lambda _: metrics.lora_loads.labels(metrics.model_name).inc(),
                           strict_reload=settings.strict_lora_reload)
    defaults = generation_defaults(engine.model) if settings.generation_config == "auto" else {}
    parser = (get_tool_parser(settings.tool_call_parser)
              if settings.enable_auto_tool_choice else None)
    template = None
    if settings.chat_template:
        with open(settings.chat_template, encoding="utf-8") as fh:
            template = fh.read()
    chat = ServingChat(engine, models, settings, defaults, tool_parser=parser,
                       chat_template=template)
    completions = ServingCompletions(engine, models, settings, defaults)
    return ServingState(engine, models, chat, completions, metrics)


def create_app(settings: InferenceSettings | None = None) -> FastAPI:
    settings = settings or InferenceSettings()
    get_tool_parser(settings.tool_call_parser)  # fail fast on a bad name
    registry = new_registry()
    metrics = EngineMetrics(registry, settings.model_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = await anyio.to_thread.run_sync(build_state, settings, metrics)
        app.state.serving = state
        try:
            yield
        finally:
            await anyio.to_thread.run_sync(state.engine.shutdown)

    app = FastAPI(title="mcprl-inference", version="0.1.0", lifespan=lifespan)

    async def health() -> dict[str, Any]:
        state: ServingState | None = getattr(app.state, "serving", None)
        if state is None:
            return {"ok": False, "reason": "model loading"}
        engine = state.engine
        return {"ok": engine.alive, "model": settings.model_name, "sleeping": engine.is_sleeping,
                "running": engine.num_running, "waiting": engine.num_waiting,
                "device": str(engine.device)}

    add_ops_routes(app, service=SERVICE, registry=registry, health=health)
    app.include_router(openai_router)
    if settings.enable_lora:
        app.include_router(lora_router)
    if settings.enable_sleep_mode:
        app.include_router(sleep_router)
    return app
