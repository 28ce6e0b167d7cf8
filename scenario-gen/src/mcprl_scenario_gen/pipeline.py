"""One generation, in named stages: connect and discover, generate candidates (the strategy,
with validation and dedup as they arrive), select by difficulty mix, split without leakage,
store. Whatever happens, what was made is stored: a failure or a cancellation still writes
the set, with its status and error, from the candidates gathered so far.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from mcprl_common.settings import UpstreamSettings
from mcprl_common.wire import Scenario
from mcprl_scenario_gen.errors import NothingGeneratedError, NoToolsError, failure_kind
from mcprl_scenario_gen.mcp_client import McpConnection, ServerInfo
from mcprl_scenario_gen.metrics import GenMetrics
from mcprl_scenario_gen.quality import difficulty_counts, select_by_mix
from mcprl_scenario_gen.settings import ScenarioGenSettings
from mcprl_scenario_gen.split import split_scenarios
from mcprl_scenario_gen.store import ScenarioStore, StoredManifest
from mcprl_scenario_gen.strategies import GenerationContext, GenerationParams, Progress, Strategy
from mcprl_scenario_gen.strategies.registry import get_strategy

log = logging.getLogger(__name__)
ProgressHook = Callable[[Progress], Awaitable[None] | None]


def new_manifest(set_id: str, params: GenerationParams) -> StoredManifest:
    return StoredManifest(
        id=set_id, status="pending", server_url=params.mcp_url, strategy=params.strategy,
        model=params.model, seed=params.seed, requested=params.n, created_at=time.time(),
        params=params.public(),
    )


def assemble(pool: list[Scenario], params: GenerationParams
             ) -> tuple[list[Scenario], list[Scenario], list[str], int]:
    """Split the pool without leakage, then pick each side by the difficulty mix.

    Returns train, val, warnings and how many candidates the holdout had to drop.
    """

    split = split_scenarios(pool, params.val_fraction, params.seed,
                            holdout_templates=params.holdout_templates,
                            holdout_entities=params.holdout_entities)
    n_val = round(params.n * params.val_fraction)
    n_train = params.n - n_val
    rng = random.Random(f"select:{params.seed}")
    train, w_train = select_by_mix(split.train, n_train, params.difficulty_mix, rng)
    val, w_val = select_by_mix(split.val, n_val, params.difficulty_mix, rng) if n_val else (
        [], [])
    warnings = [f"train: {w}" for w in w_train] + [f"val: {w}" for w in w_val]
    if split.dropped:
        warnings.append(f"holdout dropped {split.dropped} candidates that mixed train and val "
                        "templates/entities")
    return ([s.model_copy(update={"split": "train"}) for s in train],
            [s.model_copy(update={"split": "val"}) for s in val], warnings, split.dropped)


def finish(store: ScenarioStore, manifest: StoredManifest, pool: list[Scenario],
           params: GenerationParams, *, status: str, error: str | None,
           warnings: list[str] = ()) -> StoredManifest:
    """Write the set from ``pool`` with its final status (also after failures)."""

    train, val, more, dropped = assemble(pool, params)
    manifest.status = status  # type: ignore[assignment]
    manifest.error = error
    manifest.finished_at = time.time()
    manifest.warnings = [*warnings, *more]
    manifest.counts = {"train": len(train), "val": len(val), "total": len(train) + len(val),
                       "pool": len(pool), "dropped_by_holdout": dropped}
    manifest.difficulty_counts = difficulty_counts([*train, *val])
    store.write_set(manifest, train, val)
    store.drop_checkpoint(manifest.id)
    return manifest


@asynccontextmanager
async def open_server(params: GenerationParams, settings: ScenarioGenSettings,
                      strategy: Strategy, progress: Progress | None = None
                      ) -> AsyncIterator[tuple[McpConnection, ServerInfo]]:
    """Connect and discover the server ``params`` names, checked for ``strategy`` (a server
    without tools, or without what the strategy needs, is an error naming what is missing)."""

    async with McpConnection(params.mcp_url, auth_token=params.auth_token,
                             transport=params.transport,  # type: ignore[arg-type]
                             timeout_s=settings.mcp_timeout_s,
                             connect_timeout_s=settings.mcp_connect_timeout_s) as conn:
        if progress is not None:
            progress.phase = "discovering"
        server = await conn.discover()
        if not server.tools:
            raise NoToolsError(f"the MCP server at {params.mcp_url} offers no tools",
                               param="mcp_url")
        strategy.check_server(server)
        yield conn, server


async def generate_pool(params: GenerationParams, *, settings: ScenarioGenSettings,
                        pool_target: int | None = None) -> tuple[list[Scenario], ServerInfo]:
    """The candidates one generation accepts (validated, deduplicated), sorted by id, before
    selection and split; and the server they were made against. For a caller that splits
    the whole pool itself (the warm start wants every candidate for training).
    ``pool_target`` defaults to the strategy's."""

    strategy = get_strategy(params.strategy)
    async with open_server(params, settings, strategy) as (conn, server):
        ctx = GenerationContext(conn=conn, server=server, params=params, settings=settings,
                                pool_target=pool_target or strategy.pool_target(params))
        await strategy.generate(ctx)
    return sorted(ctx.accepted, key=lambda s: s.id), server


async def run_generation(
    params: GenerationParams,
    *,
    settings: ScenarioGenSettings,
    store: ScenarioStore,
    manifest: StoredManifest | None = None,
    upstream: UpstreamSettings | None = None,
    metrics: GenMetrics | None = None,
    on_progress: ProgressHook | None = None,
    llm_support: dict[str, bool] | None = None,
) -> StoredManifest:
    """Run a generation to the end and return its stored manifest.

    Failures do not raise: they end in a ``failed`` manifest naming the error (and in the
    failures metric). Cancellation stores a ``cancelled`` set, then re-raises.
    """

    strategy = get_strategy(params.strategy)
    manifest = manifest or new_manifest(store.new_set_id(), params)
    manifest.status = "running"
    if strategy.uses_llm:
        manifest.model = params.model or (upstream.model if upstream else None)
    store.save_manifest(manifest)
    progress = Progress(target=params.n)
    holder: dict[str, GenerationContext] = {}
    last_checkpoint = [time.monotonic()]
    started = time.monotonic()

    async def hook(p: Progress) -> None:
        if on_progress is not None:
            result = on_progress(p)
            if result is not None:
                await result
        now = time.monotonic()
        if "ctx" in holder and now - last_checkpoint[0] >= settings.checkpoint_every_s:
            last_checkpoint[0] = now
            manifest.progress = p.as_dict()
            store.save_checkpoint(manifest.id, holder["ctx"].accepted)
            store.save_manifest(manifest)

    status, error = "succeeded", None
    try:
        progress.phase = "connecting"
        await hook(progress)
        async with open_server(params, settings, strategy, progress) as (conn, server):
            manifest.tools_hash = server.tools_hash
            ctx = GenerationContext(conn=conn, server=server, params=params, settings=settings,
                                    upstream=upstream, metrics=metrics, progress=progress,
                                    on_progress=hook, pool_target=strategy.pool_target(params),
                                    llm_support=llm_support if llm_support is not None else {})
            holder["ctx"] = ctx
            await strategy.generate(ctx)
            if not ctx.accepted:
                reasons = ", ".join(f"{k}: {v}" for k, v in progress.rejected.items())
                raise NothingGeneratedError(
                    f"strategy {params.strategy!r} produced no usable scenario "
                    f"({progress.candidates} candidates; rejected: {reasons or 'none'})")
    except asyncio.CancelledError:
        _finish_safely(store, manifest, holder, params, progress, "cancelled",
                       "cancelled before it finished", metrics, started)
        raise
    except Exception as exc:
        kind = failure_kind(exc)
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        status, error = "failed", f"{kind}: {message}"
        if kind == "internal":
            log.exception("generation failed", extra={"set_id": manifest.id})
        else:
            log.warning("generation failed", extra={"set_id": manifest.id, "kind": kind,
                                                    "reason": message})
        if metrics is not None:
            metrics.failures.labels(kind).inc()
    return _finish_safely(store, manifest, holder, params, progress, status, error, metrics,
                          started)


def _finish_safely(store: ScenarioStore, manifest: StoredManifest,
                   holder: dict[str, GenerationContext], params: GenerationParams,
                   progress: Progress, status: str, error: str | None,
                   metrics: GenMetrics | None, started: float) -> StoredManifest:
    ctx = holder.get("ctx")
    pool = ctx.accepted if ctx else []
    if ctx is not None and ctx.model:
        manifest.model = ctx.model
    progress.phase = status
    manifest.progress = progress.as_dict()
    manifest.usage = {"llm_calls": progress.llm_calls,
                      "llm_failed_calls": progress.llm_failed_calls,
                      "prompt_tokens": progress.prompt_tokens,
                      "completion_tokens": progress.completion_tokens,
                      "tool_calls": progress.tool_calls}
    finish(store, manifest, pool, params, status=status, error=error,
           warnings=ctx.warnings if ctx else [])
    if metrics is not None:
        metrics.scenarios.labels(params.strategy).inc(manifest.counts.get("total", 0))
        metrics.duration.labels(params.strategy, status).observe(time.monotonic() - started)
    return manifest


def recover_interrupted(store: ScenarioStore) -> list[str]:
    """Sets left ``pending``/``running`` by a dead process become ``failed``, keeping their
    checkpointed candidates. Returns their ids."""

    store.cleanup_tmp()
    recovered = []
    for manifest in store.interrupted():
        params = GenerationParams.from_public(manifest.params)
        pool = store.load_checkpoint(manifest.id)
        finish(store, manifest, pool, params, status="failed",
               error="interrupted: the process stopped before the generation finished",
               warnings=manifest.warnings)
        recovered.append(manifest.id)
    return recovered
