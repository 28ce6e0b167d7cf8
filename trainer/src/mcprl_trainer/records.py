"""What one rollout leaves behind: the trajectory for the judge and the token record for
training, kept apart so the trainer never has to reconstruct tokens from messages."""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mcprl_common.wire import Scenario, Trajectory


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (run seed, step, group, member, turn)."""

    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass
class TurnRecord:
    """One model turn: the sampled ids exactly as the engine returned them."""

    prompt_len: int  # tokens before this turn's sampled ids
    sampled_ids: list[int]
    sampled_logprobs: list[float]
    finish_reason: str
    model: str  # the served model (base or adapter) that sampled the turn
    appended_ids: list[int] = field(default_factory=list)  # glue + tool results + next prompt
    seconds: float = 0.0
    # The policy version that sampled it (0 = base or warm start, N = checkpoint step-N's
    # adapter) as the publisher knew the replica's adapter; None = not tracked (scripted).
    policy_version: int | None = None


@dataclass
class TokenRecord:
    """The rollout's token sequence: initial prompt, then per turn sampled + appended ids."""

    prompt_ids: list[int]
    turns: list[TurnRecord] = field(default_factory=list)

    def flatten(self) -> tuple[list[int], list[int], list[float]]:
        """``(input_ids, mask, sampler_logprobs)``: mask 1 exactly on sampled ids."""

        ids = list(self.prompt_ids)
        mask = [0] * len(ids)
        lps = [0.0] * len(ids)
        for turn in self.turns:
            ids += turn.sampled_ids
            mask += [1] * len(turn.sampled_ids)
            lps += turn.sampled_logprobs
            ids += turn.appended_ids
            mask += [0] * len(turn.appended_ids)
            lps += [0.0] * len(turn.appended_ids)
        # The last turn's trailing non-model ids are never trained on: drop them.
        while mask and mask[-1] == 0:
            ids.pop()
            mask.pop()
            lps.pop()
        return ids, mask, lps

    @property
    def sampled_tokens(self) -> int:
        return sum(len(t.sampled_ids) for t in self.turns)


@dataclass
class RolloutResult:
    scenario: Scenario
    trajectory: Trajectory
    tokens: TokenRecord
    seconds: float
    tool_errors: Counter = field(default_factory=Counter)  # by kind
    reward: float | None = None
    components: dict[str, float] = field(default_factory=dict)
    explanation: str = ""  # the judge's, for the run report
    advantage: float | None = None  # set when the step's batch is built

    @property
    def policy_version(self) -> int | None:
        """The oldest policy version among its turns (what its staleness is counted from)."""

        return min((t.policy_version for t in self.tokens.turns
                    if t.policy_version is not None), default=None)
