"""Publishing adapters to the engines, and sleeping a same-GPU engine during the update.

After each step the checkpoint's adapter is loaded into every engine replica under one
served name (``/v1/load_lora_adapter`` with the same name replaces it), and the step's
rollouts start only once each replica that is up lists it with the new path in
``/v1/models``: no group samples from last step's policy. The path must be the one the
*engine* sees: on one host it is the trainer's own path; in containers it is where the
shared volume is mounted in the engine (``policy.engine_output_dir``).

Where the engines share the trainer's host, the adapter they load is the copy in the publish
folder (:mod:`mcprl_trainer.publish_dir`, tmpfs); a replica elsewhere, or one that answers 404
for that path, loads the checkpoint's. Replicas are still tracked by the checkpoint path (the
version's identity), whichever copy they loaded. When the run ends the replicas are pointed
at the checkpoint's copy before the folder is removed, so what they list stays readable.

An engine that restarts forgets its adapters and answers 404 for the served name; a replica
that was left out (:mod:`mcprl_trainer.engines`) may come back without them. Before a replica
samples from the served adapter it is loaded there if that replica's version is not known to
be the latest, so rollouts go on with the policy they were meant to sample from, never
silently with the base model or an older adapter.

Each sampled turn is stamped with the policy version of what sampled it (the version given
to :meth:`AdapterPublisher.publish` for the adapter the replica holds; 0 for the base
model), which is what the overlapped loop checks staleness against
(:mod:`mcprl_trainer.overlap`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from mcprl_common.http import request_json
from mcprl_trainer.config import RunConfig
from mcprl_trainer.engines import EnginePool, Replica
from mcprl_trainer.policy import PolicyClient, PolicyError, SampledTurn
from mcprl_trainer.publish_dir import PublishDir, is_local_url
from mcprl_trainer.recovery import RetryWindow, ServiceUnavailableError, is_transient

log = logging.getLogger(__name__)


def engine_adapter_path(config: RunConfig, checkpoint_path: Path) -> str:
    """The checkpoint's path as the engine sees it (an adapter outside the run outputs, such
    as a warm start, must be at the same path on both sides)."""

    local = checkpoint_path.resolve()
    if not config.policy.engine_output_dir or not local.is_relative_to(
            config.output_dir.resolve()):
        return str(local)
    relative = local.relative_to(config.output_dir.resolve())
    return str(Path(config.policy.engine_output_dir) / relative)


async def publish_adapter(policy: PolicyClient, config: RunConfig, checkpoint_path: Path) -> str:
    """Load the adapter into the engine; returns the served name to sample from."""

    name = config.served_adapter
    await policy.load_adapter(name, engine_adapter_path(config, checkpoint_path))
    log.info("adapter published", extra={"adapter": name, "path": str(checkpoint_path)})
    return name


class AdapterVersionError(ServiceUnavailableError):
    """A replica accepted the adapter but does not list it with the new path (yet)."""


async def served_adapter_path(policy: PolicyClient, name: str) -> str | None:
    """The path the engine lists for adapter ``name`` in ``/v1/models`` (vLLM and ours put
    it in ``root``); None when it does not serve it."""

    data = await request_json(policy.http, "GET", f"{policy.base_url}/models",
                              retry=policy.retry)
    for card in (data or {}).get("data", []):
        if card.get("id") == name:
            return card.get("root")
    return None


class AdapterPublisher:
    """Publishes each checkpoint's adapter to every replica and keeps it served there.

    Also the run's :class:`~mcprl_trainer.rollout.Sampler`: ``complete`` sends a request to
    the least-loaded replica, :meth:`for_group` gives a group a sampler bound to one.
    """

    def __init__(self, pool: EnginePool | PolicyClient, config: RunConfig, retry: RetryWindow,
                 *, on_retry: Callable[[BaseException], None] | None = None,
                 on_republish: Callable[[], None] | None = None,
                 publish_dir: PublishDir | None = None,
                 on_loaded: Callable[[str], None] | None = None,
                 on_fallback: Callable[[], None] | None = None) -> None:
        self.pool = pool if isinstance(pool, EnginePool) else EnginePool([pool])
        self.config = config
        self.retry = retry
        self.on_retry = on_retry
        self.on_republish = on_republish
        self.publish_dir = publish_dir
        self.on_loaded = on_loaded  # (source): "publish_dir" or "checkpoint", per replica load
        self.on_fallback = on_fallback  # a replica could not see the publish folder
        # replicas that load from the checkpoint: not on this host, or blind to the folder
        self.from_checkpoint = {r.url for r in self.pool.replicas if not is_local_url(r.url)}
        self.latest: Path | None = None
        self.versions: dict[Path, int] = {}  # adapter path -> policy version
        self._lock = asyncio.Lock()

    @property
    def policy(self) -> PolicyClient:
        """The first replica's client (what a single-engine caller knows)."""

        return self.pool.first

    # -- publishing -----------------------------------------------------------------------
    async def _load(self, replica: Replica, checkpoint_path: Path) -> None:
        """Load the adapter into one replica (from the publish folder where it can) and check
        that it serves the new path."""

        staged = None
        if self.publish_dir is not None and replica.url not in self.from_checkpoint:
            staged = self.publish_dir.lookup(checkpoint_path)
        if staged is not None:
            try:
                await self._load_from(replica, checkpoint_path, str(staged.path), "publish_dir")
                return
            except PolicyError as exc:
                if exc.status != 404:
                    raise
                self.from_checkpoint.add(replica.url)
                log.warning("engine replica cannot see the publish dir: it loads adapters from "
                            "the checkpoint folder from now on", extra={
                                "replica": replica.url, "path": str(staged.path),
                                "checkpoint": str(checkpoint_path)})
                if self.on_fallback is not None:
                    self.on_fallback()
                if staged.on_disk is not None:  # the writer thread copies it there
                    await asyncio.wrap_future(staged.on_disk)
        await self._load_from(replica, checkpoint_path,
                              engine_adapter_path(self.config, checkpoint_path), "checkpoint")

    async def _load_from(self, replica: Replica, checkpoint_path: Path, want: str,
                         source: str) -> None:
        name = self.config.served_adapter
        t0 = time.perf_counter()
        await replica.client.load_adapter(name, want)
        got = await served_adapter_path(replica.client, name)
        if got is not None and got != want:
            raise AdapterVersionError(f"{replica.url} serves {name} from {got}, not {want}")
        replica.adapter = checkpoint_path
        self.pool.mark_ok(replica)
        if self.on_loaded is not None:
            self.on_loaded(source)
        log.info("adapter published", extra={
            "adapter": name, "path": want, "checkpoint": str(checkpoint_path),
            "source": source, "replica": replica.url,
            "seconds": round(time.perf_counter() - t0, 4)})

    async def _publish_all(self, checkpoint_path: Path) -> None:
        targets = self.pool.up() or [self.pool.pick()]
        outcomes = await asyncio.gather(*(self._load(r, checkpoint_path) for r in targets),
                                        return_exceptions=True)
        failed = [(r, o) for r, o in zip(targets, outcomes, strict=True)
                  if isinstance(o, BaseException)]
        for replica, exc in failed:
            if not is_transient(exc):
                raise exc  # a wrong path or a bad adapter: every replica would say the same
            self.pool.mark_down(replica, exc)
        if len(failed) == len(targets):
            raise ServiceUnavailableError(
                f"no engine replica took the adapter: {failed[0][1]}") from failed[0][1]

    async def publish(self, checkpoint_path: Path, version: int | None = None) -> str:
        """Load ``checkpoint_path``'s adapter into every replica that is up (retrying while
        none is); a replica left out gets it when it is back, before it samples. ``version``
        is the policy version turns sampled from it are stamped with."""

        async with self._lock:
            self.latest = checkpoint_path
            if version is not None:
                self.versions[checkpoint_path] = version
            await self.retry.call(lambda: self._publish_all(checkpoint_path),
                                  what="publishing the adapter", on_retry=self.on_retry)
        return self.config.served_adapter

    async def detach_publish_dir(self) -> None:
        """Load the latest adapter from its checkpoint into the replicas that hold the publish
        folder's copy (the run ended: the folder goes, and an engine reloads an evicted
        adapter from the path it lists). Best effort: a replica that is down keeps it in
        memory, and the run's result does not depend on it."""

        publish_dir, self.publish_dir = self.publish_dir, None
        latest = self.latest
        if publish_dir is None or latest is None or publish_dir.lookup(latest) is None:
            return
        async with self._lock:
            replicas = [r for r in self.pool.replicas
                        if r.adapter == latest and r.url not in self.from_checkpoint]
            outcomes = await asyncio.gather(*(self._load(r, latest) for r in replicas),
                                            return_exceptions=True)
        for replica, outcome in zip(replicas, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("engine replica keeps the adapter from the removed publish dir: "
                            "%s", outcome, extra={"replica": replica.url})

    async def _ensure(self, replica: Replica, model: str) -> None:
        """``replica`` serves the latest adapter before it samples from it."""

        if model != self.config.served_adapter or self.latest is None:
            return
        async with replica.lock:
            latest = self.latest
            if replica.adapter == latest:
                return
            lost = replica.requests > 0 or replica.failures > 0
            try:
                await self._load(replica, latest)
            except Exception as exc:
                if is_transient(exc):
                    self.pool.mark_down(replica, exc)
                raise
        if lost:
            log.warning("engine replica lost the adapter (restarted?): publishing it again",
                        extra={"adapter": self.config.served_adapter, "path": str(latest),
                               "replica": replica.url})
            if self.on_republish is not None:
                self.on_republish()

    # -- sampling -------------------------------------------------------------------------
    def _version(self, replica: Replica, model: str) -> int | None:
        if model != self.config.served_adapter:
            return 0  # the base model: what step 1 samples without a warm start
        return None if replica.adapter is None else self.versions.get(replica.adapter)

    async def complete_on(self, replica: Replica, model: str, prompt_ids: list[int], *,
                          max_tokens: int, temperature: float, top_p: float = 1.0,
                          seed: int | None = None, stop_token_ids: list[int] | None = None,
                          ignore_eos: bool = False) -> SampledTurn:
        for attempt in range(2):
            await self._ensure(replica, model)
            before = self._version(replica, model)
            replica.open_requests += 1
            replica.requests += 1
            try:
                turn = await replica.client.complete(
                    model, prompt_ids, max_tokens=max_tokens, temperature=temperature,
                    top_p=top_p, seed=seed, stop_token_ids=stop_token_ids,
                    ignore_eos=ignore_eos)
            except PolicyError as exc:
                lost = (exc.status == 404 and self.latest is not None
                        and model == self.config.served_adapter)
                if lost and attempt == 0:
                    replica.adapter = None  # it restarted between two requests: load again
                    continue
                if is_transient(exc):
                    self.pool.mark_down(replica, exc)
                raise
            finally:
                replica.open_requests -= 1
            self.pool.mark_ok(replica)
            after = self._version(replica, model)  # a publish during the request: the older
            known = [v for v in (before, after) if v is not None]
            return dataclasses.replace(turn, policy_version=min(known, default=None))
        raise AssertionError("unreachable")

    async def complete(self, model: str, prompt_ids: list[int], *, max_tokens: int,
                       temperature: float, top_p: float = 1.0, seed: int | None = None,
                       stop_token_ids: list[int] | None = None,
                       ignore_eos: bool = False) -> SampledTurn:
        return await self.complete_on(
            self.pool.pick(), model, prompt_ids, max_tokens=max_tokens,
            temperature=temperature, top_p=top_p, seed=seed, stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos)

    def for_group(self) -> GroupSampler:
        return GroupSampler(self)


class GroupSampler:
    """One group's sampler: every rollout of the group on one replica (its shared prefix is
    cached there), moved to another only when that one is left out."""

    def __init__(self, publisher: AdapterPublisher) -> None:
        self.publisher = publisher
        self.pool = publisher.pool
        self.replica = self.pool.pick()
        self.replica.groups += 1

    def _current(self) -> Replica:
        if not self.pool.is_up(self.replica) and self.pool.up():
            self.replica.groups -= 1
            self.replica = self.pool.pick()
            self.replica.groups += 1
        return self.replica

    async def complete(self, model: str, prompt_ids: list[int], **kwargs) -> SampledTurn:
        return await self.publisher.complete_on(self._current(), model, prompt_ids, **kwargs)

    def release(self) -> None:
        self.replica.groups -= 1


@asynccontextmanager
async def engine_asleep(pool: EnginePool | PolicyClient, enabled: bool) -> AsyncIterator[None]:
    """Free the engines' GPU memory (weights and KV cache) while the trainer needs it."""

    if not enabled:
        yield
        return
    clients = [r.client for r in pool.replicas] if isinstance(pool, EnginePool) else [pool]
    await asyncio.gather(*(c.sleep(level=1) for c in clients))
    try:
        yield
    finally:
        await asyncio.gather(*(c.wake_up() for c in clients))
