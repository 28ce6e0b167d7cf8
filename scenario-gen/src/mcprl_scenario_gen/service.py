"""The scenario-gen service logic (no web framework): accept generations, run them as
bounded, cancellable background tasks, and answer status and scenario queries.

Requests are checked before anything is queued: N against the configured maximum, the
strategy by name, and the MCP server by a short pre-flight (reachable, has tools, has what
the strategy needs), so bad input gets a 4xx naming the problem instead of a failed job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from mcprl_common.errors import BadRequestError, ConflictError
from mcprl_common.settings import UpstreamSettings
from mcprl_common.wire import Scenario
from mcprl_scenario_gen.api import CreateScenarioSetRequest
from mcprl_scenario_gen.errors import NoToolsError, StorageError, TooManyJobsError
from mcprl_scenario_gen.mcp_client import McpConnection, ServerInfo
from mcprl_scenario_gen.metrics import GenMetrics
from mcprl_scenario_gen.pipeline import finish, new_manifest, recover_interrupted, run_generation
from mcprl_scenario_gen.settings import ScenarioGenSettings
from mcprl_scenario_gen.store import ScenarioStore, SplitName, StoredManifest
from mcprl_scenario_gen.strategies import GenerationParams, Progress
from mcprl_scenario_gen.strategies.registry import get_strategy

log = logging.getLogger(__name__)
FINISHED = ("succeeded", "failed", "cancelled")


@dataclass
class Job:
    params: GenerationParams
    manifest: StoredManifest
    progress: Progress = field(default_factory=Progress)
    task: asyncio.Task | None = None
    state: str = "queued"


def params_from_request(req: CreateScenarioSetRequest,
                        settings: ScenarioGenSettings) -> GenerationParams:
    """Validate what pydantic cannot know (configured limits, registered strategies)."""

    if req.n > settings.max_scenarios:
        raise BadRequestError(
            f"n={req.n} is larger than the maximum of {settings.max_scenarios} "
            "(SCENARIO_GEN_MAX_SCENARIOS)", param="n")
    strategy = get_strategy(req.strategy)
    if not strategy.uses_llm and (req.model or req.json_schema):
        raise BadRequestError(f"model and json_schema apply to the llm strategy, not "
                              f"{req.strategy!r}", param="model" if req.model else "json_schema")
    url, token = req.mcp_url, req.auth_token
    if url is None:
        if not settings.default_mcp_url:
            raise BadRequestError("mcp_url is required (the service has no default MCP_URL)",
                                  param="mcp_url")
        url, token = settings.default_mcp_url, token or settings.default_mcp_auth_token
    return GenerationParams(
        mcp_url=url, strategy=req.strategy, n=req.n, seed=req.seed,
        val_fraction=req.val_fraction, difficulty_mix=req.difficulty_mix,
        holdout_templates=req.holdout_templates, holdout_entities=req.holdout_entities,
        model=req.model, json_schema=req.json_schema, transport=req.transport,
        auth_token=token.get_secret_value() if token else None,
    )


async def preflight(params: GenerationParams, settings: ScenarioGenSettings) -> ServerInfo:
    """Connect once and check the server suits the strategy; raises a 4xx error if not."""

    strategy = get_strategy(params.strategy)
    async with McpConnection(params.mcp_url, auth_token=params.auth_token,
                             transport=params.transport,  # type: ignore[arg-type]
                             timeout_s=settings.mcp_connect_timeout_s,
                             connect_timeout_s=settings.mcp_connect_timeout_s) as conn:
        server = await conn.discover()
    if not server.tools:
        raise NoToolsError(f"the MCP server at {params.mcp_url} offers no tools",
                           param="mcp_url")
    strategy.check_server(server)
    return server


class ScenarioGenService:
    """Owns the store, the jobs and the metrics; one per app."""

    def __init__(self, settings: ScenarioGenSettings, *, upstream: UpstreamSettings | None = None,
                 metrics: GenMetrics | None = None) -> None:
        self.settings = settings
        self.upstream = upstream
        self.metrics = metrics or GenMetrics()
        self.store = ScenarioStore(settings.data_dir)
        self.jobs: dict[str, Job] = {}
        # Sets whose final write failed (disk full, read-only): their failed manifest lives
        # here, so status says why instead of "running" forever.
        self.unsaved: dict[str, StoredManifest] = {}
        self.llm_support: dict[str, bool] = {}
        self._slots = asyncio.Semaphore(settings.max_concurrent_jobs)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        recovered = await asyncio.to_thread(recover_interrupted, self.store)
        if recovered:
            log.warning("marked interrupted generations as failed", extra={"ids": recovered})

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel what runs; each job stores its partial set as ``cancelled``."""

        tasks = [j.task for j in self.jobs.values() if j.task and not j.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def health(self) -> dict[str, Any]:
        root = self.settings.data_dir
        writable = root.is_dir() and os.access(root, os.W_OK)
        return {"ok": writable, "data_dir_writable": writable,
                "jobs_running": sum(j.state == "running" for j in self.jobs.values()),
                "jobs_queued": sum(j.state == "queued" for j in self.jobs.values())}

    # -- generations --------------------------------------------------------------------
    async def create(self, req: CreateScenarioSetRequest) -> Job:
        params = params_from_request(req, self.settings)
        limit = self.settings.max_concurrent_jobs + self.settings.max_queued_jobs
        if len(self.jobs) >= limit:
            raise TooManyJobsError(f"{len(self.jobs)} generations are running or waiting "
                                   f"(at most {limit}); retry later")
        await preflight(params, self.settings)
        manifest = new_manifest(self.store.new_set_id(), params)
        if get_strategy(params.strategy).uses_llm:
            manifest.model = params.model or (self.upstream.model if self.upstream else None)
        self.store.save_manifest(manifest)
        job = Job(params=params, manifest=manifest)
        job.progress.target = params.n
        self.jobs[manifest.id] = job
        job.task = asyncio.create_task(self._run(job), name=f"generate:{manifest.id}")
        log.info("generation queued", extra={"set_id": manifest.id, "strategy": params.strategy,
                                             "n": params.n})
        return job

    async def _run(self, job: Job) -> None:
        self.metrics.jobs.labels("queued").inc()
        started = False
        try:
            async with self._slots:
                self.metrics.jobs.labels("queued").dec()
                started = True
                job.state = "running"
                self.metrics.jobs.labels("running").inc()
                try:
                    job.manifest = await run_generation(
                        job.params, settings=self.settings, store=self.store,
                        manifest=job.manifest, upstream=self.upstream, metrics=self.metrics,
                        on_progress=lambda p: setattr(job, "progress", p),
                        llm_support=self.llm_support)
                finally:
                    self.metrics.jobs.labels("running").dec()
        except asyncio.CancelledError:
            if not started:  # cancelled in the queue: record it, nothing was made
                self.metrics.jobs.labels("queued").dec()
                finish(self.store, job.manifest, [], job.params, status="cancelled",
                       error="cancelled before it started")
            raise
        except StorageError as exc:
            log.error("generation could not be stored", extra={"set_id": job.manifest.id,
                                                                "reason": exc.message})
            self.metrics.failures.labels(exc.kind).inc()
            failed = job.manifest.model_copy()
            failed.status, failed.error = "failed", f"{exc.kind}: {exc.message}"
            self.unsaved[failed.id] = failed
        except Exception:
            log.exception("generation crashed", extra={"set_id": job.manifest.id})
        finally:
            job.state = "done"
            self.jobs.pop(job.manifest.id, None)

    def status(self, set_id: str) -> tuple[StoredManifest, dict[str, Any]]:
        job = self.jobs.get(set_id)
        if job is not None:
            manifest = job.manifest.model_copy()
            if job.state == "queued":
                manifest.status = "pending"
            return manifest, job.progress.as_dict()
        if set_id in self.unsaved:
            return self.unsaved[set_id], self.unsaved[set_id].progress
        manifest = self.store.load_manifest(set_id)
        return manifest, manifest.progress

    def list_sets(self) -> list[StoredManifest]:
        return self.store.list_sets()

    def scenarios(self, set_id: str, split: SplitName) -> tuple[StoredManifest, list[Scenario]]:
        manifest, _ = self.status(set_id)
        if manifest.status not in FINISHED:
            raise ConflictError(f"scenario set {set_id} is still {manifest.status}; poll "
                                f"GET /v1/scenario-sets/{set_id} until it has finished",
                                param="id")
        if set_id in self.unsaved:
            return manifest, []
        return manifest, self.store.load_split(set_id, split)

    async def cancel(self, set_id: str) -> StoredManifest:
        job = self.jobs.get(set_id)
        if job is None or job.task is None or job.task.done():
            manifest = self.store.load_manifest(set_id)
            raise ConflictError(f"scenario set {set_id} already {manifest.status}", param="id")
        job.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(job.task), timeout=15)
        return self.store.load_manifest(set_id)

    async def delete(self, set_id: str) -> None:
        if set_id in self.jobs:
            with contextlib.suppress(ConflictError):
                await self.cancel(set_id)
        self.store.delete(set_id)
