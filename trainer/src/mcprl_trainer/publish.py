"""Publishing adapters to the engine, and sleeping a same-GPU engine during the update.

After each step the checkpoint's adapter is loaded into the engine under one served name
(``/v1/load_lora_adapter`` with the same name replaces it), so the next rollouts sample from
the policy just trained. The path must be the one the *engine* sees: on one host it is the
trainer's own path; in containers it is where the shared volume is mounted in the engine
(``policy.engine_output_dir``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from mcprl_trainer.config import RunConfig
from mcprl_trainer.policy import PolicyClient

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
