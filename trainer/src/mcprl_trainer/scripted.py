"""A scripted policy: plays back given token ids turn by turn, through the same agent loop.

Used by the warm-start expert (whose turns are computed from tool results) and wherever the
agent loop must be driven deterministically, e.g. to check token-in/token-out bookkeeping
with ids no sampler would produce by chance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mcprl_trainer.policy import SampledTurn

NextTurn = Callable[[list[int]], list[int]]  # prompt ids -> the turn's ids


class ScriptedSampler:
    """Returns ``turns[k]`` for the k-th request (or ``next_turn(prompt_ids)``)."""

    def __init__(self, turns: Sequence[Sequence[int]] | NextTurn, *, logprob: float = 0.0,
                 name: str = "scripted") -> None:
        self._turns = turns
        self.logprob = logprob
        self.name = name
        self.prompts: list[list[int]] = []  # every prompt it was sent, in order

    async def complete(self, model: str, prompt_ids: list[int], *, max_tokens: int,
                       temperature: float, top_p: float = 1.0, seed: int | None = None,
                       stop_token_ids: list[int] | None = None) -> SampledTurn:
        self.prompts.append(list(prompt_ids))
        if callable(self._turns):
            ids = list(self._turns(list(prompt_ids)))
        else:
            ids = list(self._turns[len(self.prompts) - 1])
        finish = "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        return SampledTurn(ids, [self.logprob] * len(ids), finish, self.name)
