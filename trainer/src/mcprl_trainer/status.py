"""The trainer's status server: ``/healthz``, ``/metrics`` and ``GET /v1/status``.

Served from a background thread of the training process (``TRAINER_PORT``, default 8930),
so Prometheus and humans can watch a run; the training loop only writes to
:class:`RunStatus`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from fastapi import FastAPI, Request

from mcprl_common.process import UvicornThread
from mcprl_common.service_app import add_ops_routes
from mcprl_trainer import __version__
from mcprl_trainer.metrics import TrainerMetrics


class RunStatus:
    """What the run is doing now; thread-safe snapshot for the status endpoint."""

    def __init__(self, run: str, total_steps: int) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {
            "run": run, "phase": "starting", "step": 0, "total_steps": total_steps,
            "started_at": time.time(), "last_step": None, "last_eval": None, "error": None,
        }

    def update(self, **fields: Any) -> None:
        with self._lock:
            self._data.update(fields)
            self._data["updated_at"] = time.time()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._data)


def create_app(status: RunStatus, metrics: TrainerMetrics) -> FastAPI:
    app = FastAPI(title="mcprl-trainer", version=__version__)
    app.state.status = status

    async def health() -> dict[str, Any]:
        snap = status.snapshot()
        return {"ok": snap.get("phase") != "failed", "phase": snap.get("phase"),
                "step": snap.get("step")}

    add_ops_routes(app, service="trainer", registry=metrics.registry, health=health,
                   version=__version__)

    @app.get("/v1/status")
    async def get_status(request: Request) -> dict[str, Any]:
        return request.app.state.status.snapshot()

    return app


def start_status_server(status: RunStatus, metrics: TrainerMetrics, host: str,
                        port: int) -> UvicornThread:
    return UvicornThread(create_app(status, metrics), host=host, port=port or None).start()
