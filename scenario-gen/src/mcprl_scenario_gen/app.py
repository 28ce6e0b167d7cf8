"""``create_app(settings)``: the FastAPI app of scenario-gen; nothing is built at import."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from mcprl_common.service_app import add_ops_routes
from mcprl_common.settings import UpstreamSettings, upstream_settings
from mcprl_scenario_gen import __version__
from mcprl_scenario_gen.metrics import GenMetrics
from mcprl_scenario_gen.routes import router
from mcprl_scenario_gen.service import ScenarioGenService
from mcprl_scenario_gen.settings import ScenarioGenSettings

SERVICE = "scenario-gen"


def create_app(settings: ScenarioGenSettings | None = None, *,
               generator: UpstreamSettings | None = None) -> FastAPI:
    """The app; ``generator`` defaults to the ``GENERATOR_*`` environment."""

    settings = settings or ScenarioGenSettings()
    metrics = GenMetrics()
    service = ScenarioGenService(settings, upstream=generator or upstream_settings("GENERATOR_"),
                                 metrics=metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop(timeout_s=settings.graceful_shutdown_s)

    app = FastAPI(title="mcp-rl scenario-gen", version=__version__, lifespan=lifespan)
    app.state.service = service
    app.state.settings = settings
    add_ops_routes(app, service=SERVICE, registry=metrics.registry, health=service.health,
                   version=__version__)
    app.include_router(router)
    return app
