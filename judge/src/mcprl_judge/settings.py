"""The judge's settings: one class, env prefix ``JUDGE_``.

It is both a :class:`ServiceSettings` (host, port, logs) and an :class:`UpstreamSettings`
(``JUDGE_BASE_URL``, ``JUDGE_MODEL``, ``JUDGE_API_KEY``, timeouts, retries, concurrency), so
the same object configures the HTTP service and the OpenAI-compatible judge model behind it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mcprl_common.settings import ServiceSettings, UpstreamSettings
from mcprl_common.wire import RewardMode

StructuredOutput = Literal["auto", "json_schema", "none"]


class JudgeSettings(ServiceSettings, UpstreamSettings):
    """Everything the judge reads from the environment (``JUDGE_*``)."""

    model_config = SettingsConfigDict(env_prefix="JUDGE_", extra="ignore", env_file=None,
                                      populate_by_name=True)

    port: int = Field(8920, ge=0, le=65535, description="TCP port to listen on.")

    # upstream behaviour beyond UpstreamSettings
    retry_after_s: int = Field(
        10, ge=1, description="Retry-After (seconds) we send with a 503 when the judge model "
        "is unreachable and the upstream gave no hint of its own."
    )
    structured_output: StructuredOutput = Field(
        "auto", description="How to get JSON from the judge: 'json_schema' (response_format, "
        "constrained decoding), 'none' (instructions + JSON extraction from text), 'auto' "
        "(json_schema, falling back to 'none' for models whose provider rejects it)."
    )
    schema_bounds: bool = Field(
        True, description="Put the score range and explanation length into the json_schema; "
        "turn off for providers that reject 'minimum'/'maxLength' keywords."
    )
    max_parse_retries: int = Field(
        2, ge=0, description="Extra judge calls when its answer is not valid JSON of the "
        "expected shape or scores a wrong number of trajectories (the error is sent back)."
    )
    max_output_tokens: int = Field(
        4096, ge=16, description="max_tokens of one judge call (all explanations together)."
    )
    explanation_max_chars: int = Field(
        400, ge=16, description="Longest explanation per trajectory asked of the judge."
    )
    temperature: float | None = Field(
        None, ge=0, le=2, description="Sampling temperature sent upstream; unset sends none "
        "(some reasoning models reject the parameter)."
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Extra JSON fields for each upstream chat request, "
        "e.g. OpenRouter's provider routing (JSON in the env var)."
    )
    default_rubric: str | None = Field(
        None, description="Deployment-wide RULER rubric; requests may still override it. "
        "Unset: the built-in rubric."
    )

    # request limits and defaults
    default_mode: RewardMode = Field(
        "ruler", description="Reward mode used when a request does not name one."
    )
    max_group_size: int = Field(
        64, ge=1, description="Most trajectories one request may score (413 above)."
    )
    max_request_chars: int = Field(
        2_000_000, ge=1000, description="Most characters of serialised trajectories one "
        "request may send to the judge (413 above), a guard on upstream context and cost."
    )

    # cache
    cache_enabled: bool = Field(
        True, description="Reuse judgements of identical groups (content-hash SQLite cache)."
    )
    cache_path: Path = Field(
        Path("data/judge-cache.sqlite3"), description="SQLite file of the judgement cache."
    )
    cache_ttl_s: float = Field(
        0.0, ge=0, description="Cached judgements older than this are ignored; 0 keeps them "
        "forever."
    )

    # cost account
    cost_per_prompt_token_usd: float = Field(
        0.0, ge=0, description="Price of one prompt token of the judge model, for the cost "
        "account when the upstream reports no cost itself."
    )
    cost_per_completion_token_usd: float = Field(
        0.0, ge=0, description="Price of one completion token of the judge model (see above)."
    )
