"""Automatic prefix caching: the KV of finished sequences, reused by prompts that start alike.

An agent's turn k+1 is its turn-k prompt plus what it sampled plus the tool result, and every
rollout of a run starts with the same system prompt and tool schemas. Without a cache each
turn prefills the whole conversation again; with it, a prompt's longest cached start is
copied into its slot and only the rest runs through the model.

Like vLLM's, the cache works on blocks of ``block_size`` tokens: a block is identified by
the hash of (its parent block's hash, the adapter's identity, its tokens), so a block is
reused only after the very same tokens under the very same weights, and shared starts are
stored once. The tokens are kept and compared on a hit: a hash collision can never serve a
wrong block. Blocks are evicted least recently used first when ``capacity_tokens`` is
reached; a prompt's match stops at its first missing block. The adapter key carries its
version, so a republished adapter never reads KV written by the previous weights.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class _Block:
    tokens: tuple[int, ...]
    parent: int | None
    kv: torch.Tensor  # [layers, 2, kv_heads, block_size, head_dim]


@dataclass(frozen=True)
class PrefixHit:
    """The cached start of a prompt: ``tokens`` positions, their KV block by block (each
    ``[layers, 2, kv_heads, block_size, head_dim]``), copied into a slot without a concat."""

    tokens: int
    blocks: tuple[torch.Tensor, ...]

    @property
    def kv(self) -> torch.Tensor:
        """The blocks as one ``[layers, 2, kv_heads, tokens, head_dim]`` tensor."""

        return torch.cat(self.blocks, dim=3)


class PrefixCache:
    """Content-addressed KV blocks with LRU eviction (see the module docstring)."""

    def __init__(self, block_size: int, capacity_tokens: int) -> None:
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens // block_size)
        self._blocks: OrderedDict[int, _Block] = OrderedDict()
        self.query_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of which served from the cache
        self.evicted_blocks = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    @property
    def cached_tokens(self) -> int:
        return len(self._blocks) * self.block_size

    def clear(self) -> None:
        self._blocks.clear()

    def _chain(self, adapter: Hashable, tokens: Sequence[int], limit: int):
        """(hash, parent hash, block tokens) of the first ``limit`` full blocks."""

        parent: int | None = None
        bs = self.block_size
        for i in range(limit):
            block = tuple(tokens[i * bs:(i + 1) * bs])
            key = hash((parent, adapter, block))
            yield key, parent, block
            parent = key

    def lookup(self, adapter: Hashable, prompt: Sequence[int], *, again: bool = False
               ) -> PrefixHit | None:
        """The longest cached start of ``prompt``, leaving at least its last token to run
        (the model must produce the logits that follow the prompt). ``again``: a second
        look for the same prompt, whose tokens were already counted as looked up."""

        if not self.enabled:
            return None
        if not again:
            self.query_tokens += len(prompt)
        found = self._match(adapter, prompt)
        if not found:
            return None
        for key in found:
            self._blocks.move_to_end(key)
        tokens = len(found) * self.block_size
        self.hit_tokens += tokens
        return PrefixHit(tokens, tuple(self._blocks[key].kv for key in found))

    def cached_len(self, adapter: Hashable, prompt: Sequence[int]) -> int:
        """How many start tokens :meth:`lookup` would serve now, without counting a lookup
        or touching the LRU order: the scheduler's estimate of a prompt's prefill work."""

        if not self.enabled:
            return 0
        return len(self._match(adapter, prompt)) * self.block_size

    def _match(self, adapter: Hashable, prompt: Sequence[int]) -> list[int]:
        """Keys of the cached blocks that start ``prompt``, leaving its last token out."""

        found: list[int] = []
        for key, parent, block in self._chain(adapter, prompt,
                                              (len(prompt) - 1) // self.block_size):
            entry = self._blocks.get(key)
            if entry is None or entry.tokens != block or entry.parent != parent:
                break
            found.append(key)
        return found

    def store(self, adapter: Hashable, tokens: Sequence[int], kv: torch.Tensor) -> int:
        """Keep the full blocks of ``tokens`` whose KV is ``kv`` ``[layers, 2, kv_heads, >=len,
        head_dim]`` (a slot's view); returns how many blocks were new."""

        if not self.enabled:
            return 0
        added = 0
        bs = self.block_size
        for i, (key, parent, block) in enumerate(self._chain(adapter, tokens,
                                                             len(tokens) // bs)):
            entry = self._blocks.get(key)
            if entry is not None and entry.tokens == block and entry.parent == parent:
                self._blocks.move_to_end(key)
                continue
            self._blocks[key] = _Block(block, parent, kv[:, :, :, i * bs:(i + 1) * bs].clone())
            self._blocks.move_to_end(key)
            added += 1
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.evicted_blocks += 1
        return added
