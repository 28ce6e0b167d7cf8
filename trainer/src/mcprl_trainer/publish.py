"""Publishing adapters to the engine, and sleeping a same-GPU engine during the update.

After each step the checkpoint's adapter is loaded into the engine under one served name
(``/v1/load_lora_adapter`` with the same name replaces it), so the next rollouts sample from
the policy just trained. The path must be the one the *engine* sees: on one host it is the
trainer's own path; in containers it is where the shared volume is mounted in the engine
(``policy.engine_output_dir``).

An engine that restarts forgets its adapters and answers 404 for the served name.
:class:`AdapterPublisher` samples through the engine client and, on that 404, loads the
latest adapter again and repeats the request, so rollouts go on with the policy they were
meant to sample from, never silently with the base model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from mcprl_trainer.config import RunConfig
from mcprl_trainer.policy import PolicyClient, PolicyError, SampledTurn
from mcprl_trainer.recovery import RetryWindow

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


class AdapterPublisher:
    """Publishes each checkpoint's adapter and keeps it served across engine restarts.

    Also the run's :class:`~mcprl_trainer.rollout.Sampler`: it forwards to the engine client.
    """

    def __init__(self, policy: PolicyClient, config: RunConfig, retry: RetryWindow, *,
                 on_retry: Callable[[BaseException], None] | None = None,
                 on_republish: Callable[[], None] | None = None) -> None:
        self.policy = policy
        self.config = config
        self.retry = retry
        self.on_retry = on_retry
        self.on_republish = on_republish
        self.latest: Path | None = None
        self._loads = 0  # adapter loads so far; tells a waiter someone else reloaded it
        self._lock = asyncio.Lock()

    async def publish(self, checkpoint_path: Path) -> str:
        """Load ``checkpoint_path``'s adapter (retrying while the engine is down)."""

        async with self._lock:
            name = await self.retry.call(
                lambda: publish_adapter(self.policy, self.config, checkpoint_path),
                what="publishing the adapter", on_retry=self.on_retry)
            self.latest = checkpoint_path
            self._loads += 1
        return name

    async def _republish(self, loads_seen: int) -> None:
        async with self._lock:
            if self._loads != loads_seen or self.latest is None:
                return  # another rollout already loaded it again
            log.warning("engine lost the adapter (restarted?): publishing it again",
                        extra={"adapter": self.config.served_adapter,
                               "path": str(self.latest)})
            await self.retry.call(
                lambda: publish_adapter(self.policy, self.config, self.latest),  # type: ignore[arg-type]
                what="republishing the adapter", on_retry=self.on_retry)
            self._loads += 1
        if self.on_republish is not None:
            self.on_republish()

    async def complete(self, model: str, prompt_ids: list[int], *, max_tokens: int,
                       temperature: float, top_p: float = 1.0, seed: int | None = None,
                       stop_token_ids: list[int] | None = None) -> SampledTurn:
        async def sample() -> SampledTurn:
            return await self.policy.complete(
                model, prompt_ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                seed=seed, stop_token_ids=stop_token_ids)

        loads_seen = self._loads
        try:
            return await sample()
        except PolicyError as exc:
            lost = (exc.status == 404 and self.latest is not None
                    and model == self.config.served_adapter)
            if not lost:
                raise
        await self._republish(loads_seen)
        return await sample()


@asynccontextmanager
async def engine_asleep(policy: PolicyClient, enabled: bool) -> AsyncIterator[None]:
    """Free the engine's GPU memory (weights and KV cache) while the trainer needs it."""

    if not enabled:
        yield
        return
    await policy.sleep(level=1)
    try:
        yield
    finally:
        await policy.wake_up()
