"""Rollouts overlapped with the update: one step's batch collected while the last one trains.

With ``train.max_staleness = 1`` the rollouts of step k+1 are sampled while step k's update
runs, from the adapter that was served when they started (version k-1): one-step off-policy,
as in ART, verl and PipelineRL. The GRPO loss already takes the importance ratio against the
sampler's log-probs, which is what makes training on them correct.

Policy versions: version 0 is what step 1 samples from (the base model or the warm start),
version N the adapter of ``checkpoints/step-N``. A batch's version is the oldest version any
of its turns was sampled with (each turn records it, :class:`~mcprl_trainer.records.
TurnRecord`); its staleness is the trainer's version (the weights the update starts from)
minus that. A new adapter is published only while no collection is in flight, so every
rollout samples from one version from its first turn to its last.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from mcprl_trainer.groups import GroupBatch

log = logging.getLogger(__name__)


@dataclass
class CollectedBatch:
    """One step's scored groups and the policy they were sampled from."""

    step: int
    served_version: int  # the version served when the collection started
    model: str  # the served name sampled from
    batch: GroupBatch

    @property
    def version(self) -> int:
        """The oldest version any turn of the batch was sampled with (what staleness counts);
        the served version when no turn says (a sampler that does not track versions)."""

        seen = [r.policy_version for g in self.batch.groups for r in g.results
                if r.policy_version is not None]
        return min(seen, default=self.served_version)


def staleness(trainer_version: int, batch: CollectedBatch) -> int:
    """How many updates the weights are ahead of the policy that sampled ``batch``."""

    return trainer_version - batch.version


def sample_version(trainer_version: int, max_staleness: int, available: set[int]) -> int:
    """The version a step's batch is sampled from when it is collected there and then (the
    first step, or the first after a resume): in overlapped runs the one the schedule gives
    it (one behind the trainer), so a resumed run samples what the uninterrupted one did;
    the trainer's own version when that adapter is gone, or when nothing overlaps."""

    if max_staleness <= 0:
        return trainer_version
    want = max(trainer_version - 1, 0)
    return want if want in available else trainer_version


class Prefetch:
    """At most one collection running in the background, for a known step."""

    def __init__(self) -> None:
        self._task: asyncio.Task[CollectedBatch] | None = None
        self.step: int | None = None

    def start(self, step: int, collect: Coroutine[Any, Any, CollectedBatch]) -> None:
        assert self._task is None, "one collection at a time"
        self.step = step
        self._task = asyncio.create_task(collect, name=f"rollouts-step-{step}")

    def holds(self, step: int) -> bool:
        return self._task is not None and self.step == step

    async def settle(self) -> None:
        """Wait until the collection is done (kept for :meth:`take`): nothing samples now."""

        if self._task is not None:
            await asyncio.wait([self._task])

    async def take(self) -> CollectedBatch:
        assert self._task is not None
        task, self._task, self.step = self._task, None, None
        return await task

    async def cancel(self) -> None:
        """Stop an in-flight collection and wait for it to wind down (MCP sessions closed,
        engine requests dropped): nothing of it is trained on."""

        task, self._task, self.step = self._task, None, None
        if task is None:
            return
        if not task.done():
            log.info("cancelling the prefetched rollouts", extra={"task": task.get_name()})
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
