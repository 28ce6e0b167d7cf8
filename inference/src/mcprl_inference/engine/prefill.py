"""Prompts into their KV slots in as few forward passes as the prompts allow.

What an RL trainer sends is very repetitive: the G rollouts of a task arrive as G requests
with one prompt, and an agent's turn k+1 is its turn k plus what it sampled plus a tool
result. So the engine's prefill, given the requests admitted together and their first slots:

- runs nothing for a prompt equal to an earlier one of the same admission: its slot gets that
  prompt's KV and its row that prompt's logits, as the sequences of an ``n > 1`` request do;
- serves each prompt's longest cached start from the :class:`PrefixCache` and runs the rests
  of all such prompts together, in as few right-padded passes as ``max_prefill_tokens``
  allows;
- prefills the other prompts together (in passes that keep their padded shape within
  ``max_prefill_tokens``), and stores each in the cache at once, as vLLM does:
  copies of it that arrive a little later (over HTTP, a few at a time) find it there, and so
  do prompts admitted with it that share its start (the followers, run after it).

Sampling stays per sequence with its own seed, so a request's tokens are those it would get
alone; tests/inference/test_prefill_sharing.py checks them against a cold prefill.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from mcprl_inference.engine.prefix_cache import PrefixCache
from mcprl_inference.engine.sequence import EngineRequest, SequenceState


class PromptPrefiller:
    """The engine's prefill through the prefix cache (see the module docstring)."""

    def __init__(self, runner: Any, cache: PrefixCache, max_prefill_tokens: int) -> None:
        self.runner, self.cache = runner, cache
        self.max_prefill_tokens = max_prefill_tokens

    def work(self, prompt: Sequence[int], adapter: Hashable,
             admitted: set[tuple[int, ...]]) -> int:
        """Prompt tokens a request would run through the model: none for a copy of a prompt
        ``admitted`` in this round (it shares that prefill), else its uncached rest (an
        agent's next turn is mostly cached), so many such requests fill one prefill."""

        if tuple(prompt) in admitted:
            return 0
        return len(prompt) - self.cache.cached_len(adapter, prompt)

    def logits(self, requests: list[EngineRequest], slots: list[int], adapter: Hashable
               ) -> torch.Tensor:
        """Write each request's prompt into its first slot; logits ``[len(requests), V]``
        after each prompt's last token. Sets each request's ``cached_tokens``."""

        first: dict[tuple[int, ...], int] = {}
        copies: dict[int, int] = {}  # request -> the earlier request of the same prompt
        for i, req in enumerate(requests):
            j = first.setdefault(tuple(req.prompt_ids), i)
            if j != i:
                copies[i] = j
        rows = self._distinct(requests, slots, [i for i in range(len(requests))
                                                if i not in copies], adapter)
        for i, j in copies.items():
            # into the copy's first slot now: the engine then copies that slot to the other
            # sequences of an n > 1 request, the copy's as well as the original's
            self.runner.cache.move(slots[i], slots[j], len(requests[i].prompt_ids))
            rows[i] = rows[j]
            # what vLLM reports for a full prefix hit: all but the last token, which vLLM
            # runs again for its logits (here the original's logits stand in for it); it
            # keeps cached_tokens < prompt_tokens, as clients of vLLM expect
            requests[i].cached_tokens = len(requests[i].prompt_ids) - 1
        return torch.cat([rows[i] for i in range(len(requests))])

    def remember(self, finished: list[SequenceState], adapter: Hashable) -> None:
        """Keep the KV of finished sequences for later prompts (before their slots are
        reused): every position but the last sampled token, which was never run."""

        if not self.cache.enabled:
            return
        for seq in finished:
            if seq.finish_reason == "abort" or seq.slot < 0:
                continue
            tokens = [*seq.request.prompt_ids, *seq.output_ids][: seq.total_len - 1]
            self.cache.store(adapter, tokens, self.runner.cache.slot_kv(seq.slot, len(tokens)))

    def _distinct(self, requests: list[EngineRequest], slots: list[int], which: list[int],
                  adapter: Hashable) -> dict[int, torch.Tensor]:
        """Logits rows ``[1, V]`` of ``requests[i]`` for ``i`` in ``which`` (distinct
        prompts): cold prompts first (leaders), then the rests of those with a cached start
        (an agent's next turns, and the followers of a leader), batched."""

        cache = self.cache
        hits = {i: cache.lookup(adapter, requests[i].prompt_ids) for i in which}
        rows: dict[int, torch.Tensor] = {}
        misses = [i for i, hit in hits.items() if hit is None]
        followers = self._followers(requests, misses) if cache.enabled else set()
        leaders = [i for i in misses if i not in followers]
        if leaders:
            for chunk in self._padded_chunks({i: len(requests[i].prompt_ids) for i in leaders}):
                out = self.runner.prefill([requests[i].prompt_ids for i in chunk],
                                          [slots[i] for i in chunk])
                rows.update({i: out[j:j + 1] for j, i in enumerate(chunk)})
            if cache.enabled:
                for i in leaders:
                    prompt = requests[i].prompt_ids
                    cache.store(adapter, prompt,
                                self.runner.cache.slot_kv(slots[i], len(prompt)))
        for i in sorted(followers):
            hit = cache.lookup(adapter, requests[i].prompt_ids, again=True)
            if hit is None:  # evicted meanwhile (a tiny cache): a full prefill of its own
                rows[i] = self.runner.prefill([requests[i].prompt_ids], [slots[i]])
            hits[i] = hit
        found = {i: hit for i, hit in hits.items() if hit is not None}
        for i, hit in found.items():
            requests[i].cached_tokens = hit.tokens
        rests = {i: len(requests[i].prompt_ids) - hit.tokens for i, hit in found.items()}
        for chunk in self._padded_chunks(rests):
            out = self.runner.prefill_extend_batch(
                [requests[i].prompt_ids for i in chunk], [slots[i] for i in chunk],
                [found[i].blocks for i in chunk])
            rows.update({i: out[j:j + 1] for j, i in enumerate(chunk)})
        return rows

    def _padded_chunks(self, lengths: dict[int, int]) -> list[list[int]]:
        """Prompts (or the uncached rests of prompts) grouped into forward passes: shortest
        first, as many per pass as keep rows x longest (the right-padded shape the pass
        really runs) within ``max_prefill_tokens``. Admission bounds the sum of the lengths;
        this bounds what padding makes of it, so one long prompt never pads many short ones
        into an activation the size of their count times its length."""

        chunks: list[list[int]] = []
        for i in sorted(lengths, key=lambda i: (lengths[i], i)):
            if chunks and (len(chunks[-1]) + 1) * lengths[i] <= self.max_prefill_tokens:
                chunks[-1].append(i)
            else:
                chunks.append([i])
        return chunks

    def _followers(self, requests: list[EngineRequest], misses: list[int]) -> set[int]:
        """The misses whose first cache block another, earlier miss also starts with."""

        bs = self.cache.block_size
        seen: set[tuple[int, ...]] = set()
        followers: set[int] = set()
        for i in misses:
            prompt = requests[i].prompt_ids
            if len(prompt) <= bs:  # no full block would be served from the cache
                continue
            first = tuple(prompt[:bs])
            if first in seen:
                followers.add(i)
            seen.add(first)
        return followers
