"""What every strategy gets and must do.

A strategy turns a connected MCP server into candidate scenarios and hands each batch to
:meth:`GenerationContext.offer`, which validates and deduplicates them. It stops when
``ctx.enough()`` says the pool is large enough, or when it runs out of ideas.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from mcprl_common.settings import UpstreamSettings
from mcprl_common.wire import Scenario
from mcprl_scenario_gen.errors import UnsupportedServerError
from mcprl_scenario_gen.mcp_client import McpConnection, ServerInfo
from mcprl_scenario_gen.quality import Deduplicator, mix_targets, validate
from mcprl_scenario_gen.settings import JsonSchemaMode, ScenarioGenSettings

if TYPE_CHECKING:
    from mcprl_scenario_gen.metrics import GenMetrics


@dataclass
class Progress:
    """Live counters of one generation (shown by the CLI, the API and the manifest)."""

    phase: str = "pending"
    target: int = 0
    pool_target: int = 0
    candidates: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    llm_calls: int = 0
    llm_failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    started_at: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "target": self.target, "pool_target": self.pool_target,
            "candidates": self.candidates, "accepted": self.accepted,
            "rejected": dict(self.rejected), "llm_calls": self.llm_calls,
            "llm_failed_calls": self.llm_failed_calls, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens, "tool_calls": self.tool_calls,
            "elapsed_s": round(time.time() - self.started_at, 3),
        }


@dataclass
class GenerationParams:
    """A generation request, already validated (see ``api.CreateScenarioSetRequest``)."""

    mcp_url: str
    strategy: str
    n: int
    seed: int = 0
    val_fraction: float = 0.2
    difficulty_mix: dict[int, float] | None = None
    holdout_templates: bool = False
    holdout_entities: bool = False
    model: str | None = None
    json_schema: JsonSchemaMode | None = None
    auth_token: str | None = None
    transport: str = "auto"

    def public(self) -> dict[str, Any]:
        """The parameters as recorded in the manifest (never the token)."""

        return {
            "mcp_url": self.mcp_url, "strategy": self.strategy, "n": self.n, "seed": self.seed,
            "val_fraction": self.val_fraction,
            "difficulty_mix": {str(k): v for k, v in (self.difficulty_mix or {}).items()} or None,
            "holdout_templates": self.holdout_templates,
            "holdout_entities": self.holdout_entities, "model": self.model,
            "json_schema": self.json_schema, "auth": bool(self.auth_token),
            "transport": self.transport,
        }

    @classmethod
    def from_public(cls, data: dict[str, Any]) -> GenerationParams:
        """Back from a manifest's ``params`` (the token is never there)."""

        mix = data.get("difficulty_mix") or None
        return cls(
            mcp_url=data["mcp_url"], strategy=data["strategy"], n=int(data["n"]),
            seed=int(data.get("seed", 0)), val_fraction=float(data.get("val_fraction", 0.2)),
            difficulty_mix={int(k): float(v) for k, v in mix.items()} if mix else None,
            holdout_templates=bool(data.get("holdout_templates")),
            holdout_entities=bool(data.get("holdout_entities")), model=data.get("model"),
            json_schema=data.get("json_schema"), transport=data.get("transport", "auto"),
        )


ProgressFn = Callable[[Progress], Awaitable[None] | None]


@dataclass
class GenerationContext:
    conn: McpConnection
    server: ServerInfo
    params: GenerationParams
    settings: ScenarioGenSettings
    upstream: UpstreamSettings | None = None
    metrics: GenMetrics | None = None
    progress: Progress = field(default_factory=Progress)
    on_progress: ProgressFn | None = None
    known_tables: list[str] = field(default_factory=list)
    accepted: list[Scenario] = field(default_factory=list)
    pool_target: int = 0
    model: str | None = None
    llm_support: dict[str, bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    _dedup: Deduplicator | None = None

    def __post_init__(self) -> None:
        self._dedup = Deduplicator(self.settings.near_duplicate_threshold)
        self.progress.target = self.params.n
        self.progress.pool_target = self.pool_target = self.pool_target or self.params.n

    def enough(self) -> bool:
        return len(self.accepted) >= self.pool_target

    def accepted_by_difficulty(self) -> dict[int, int]:
        counts = dict.fromkeys(range(1, 6), 0)
        for s in self.accepted:
            counts[s.difficulty] += 1
        return counts

    def missing_by_difficulty(self) -> dict[int, int]:
        """How many more of each difficulty the pool needs to meet the requested mix."""

        want = mix_targets(self.pool_target, self.params.difficulty_mix)
        have = self.accepted_by_difficulty()
        return {d: max(0, want[d] - have[d]) for d in range(1, 6)}

    def reject(self, reason: str) -> None:
        self.progress.rejected[reason] = self.progress.rejected.get(reason, 0) + 1

    async def offer(self, scenarios: list[Scenario]) -> int:
        """Validate, deduplicate and keep; returns how many were kept."""

        kept = 0
        for s in scenarios:
            self.progress.candidates += 1
            problem = validate(s, self.known_tables)
            if problem is not None:
                self.reject(problem.split(":")[0])
                continue
            assert self._dedup is not None
            reason = self._dedup.why_duplicate(s)
            if reason is not None:
                self.reject(reason)
                continue
            self._dedup.add(s)
            self.accepted.append(s)
            kept += 1
        self.progress.accepted = len(self.accepted)
        self.progress.tool_calls = self.conn.tool_calls
        await self.report()
        return kept

    async def report(self) -> None:
        if self.on_progress is not None:
            result = self.on_progress(self.progress)
            if result is not None:
                await result


class Strategy(abc.ABC):
    """Base of the strategies; subclasses register themselves by ``name``."""

    name: ClassVar[str]
    required_tools: ClassVar[tuple[str, ...]] = ()
    uses_llm: ClassVar[bool] = False

    def check_server(self, server: ServerInfo) -> None:
        """Refuse servers this strategy cannot work with, naming what is missing."""

        missing = [t for t in self.required_tools if t not in server.tool_names]
        if missing:
            have = ", ".join(server.tool_names) or "none"
            raise UnsupportedServerError(
                f"strategy {self.name!r} needs the tools {', '.join(self.required_tools)}; "
                f"the server lacks {', '.join(missing)} (it has: {have})", param="strategy")

    def pool_target(self, params: GenerationParams) -> int:
        """How many accepted candidates to collect before selection (mix, split, holdout)."""

        return params.n

    @abc.abstractmethod
    async def generate(self, ctx: GenerationContext) -> None:
        """Offer candidates to ``ctx`` until ``ctx.enough()`` or nothing new can be made."""
