"""``create_app(settings)``: the judge as a FastAPI app; nothing is built at import time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from mcprl_common.logging import redact
from mcprl_common.metrics import new_registry
from mcprl_common.service_app import add_ops_routes
from mcprl_judge import __version__
from mcprl_judge.routes import router
from mcprl_judge.service import JudgeService
from mcprl_judge.settings import JudgeSettings

SERVICE = "judge"
log = logging.getLogger(__name__)


def create_app(settings: JudgeSettings | None = None) -> FastAPI:
    settings = settings or JudgeSettings()
    registry = new_registry()
    service = JudgeService(settings, registry)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        log.info("judge ready", extra={
            "base_url": redact(settings.base_url), "model": settings.model,
            "structured_output": settings.structured_output, "default_mode": settings.default_mode,
            "cache": str(settings.cache_path) if settings.cache_enabled else None})
        try:
            yield
        finally:
            await service.aclose()

    app = FastAPI(title="mcp-rl judge", version=__version__, lifespan=lifespan,
                  summary="RULER scoring and verifiable rewards for groups of agent trajectories")
    app.state.judge = service
    app.state.settings = settings
    app.include_router(router)
    add_ops_routes(app, service=SERVICE, registry=registry, health=service.health,
                   version=__version__)
    return app
