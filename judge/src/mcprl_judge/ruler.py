"""RULER: relative scoring of a group of trajectories by one LLM call.

The published algorithm (OpenPipe ART, ``art.rewards.ruler``): every trajectory of a group
tried the same task, so the judge sees them side by side and scores them relative to each
other; the messages all of them share (system prompt, task) are sent once as context and
only each trajectory's own continuation is serialised, numbered. GRPO only uses differences
within a group, which a judge gives far more reliably than absolute grades.

What we add to close its gaps: identical trajectories are judged once and their score fanned
back out; the tools are listed; the answer has a json_schema with one required entry per
trajectory (a constrained decoder cannot miscount), and providers without structured output
get instructions plus JSON extraction; an unusable answer or a wrong number of scores is sent
back to the judge with the error, a bounded number of times, instead of aborting the run; the
judge model is chosen per request.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from textwrap import dedent
from typing import Any

from mcprl_common.errors import UpstreamError
from mcprl_common.wire import Trajectory, Usage
from mcprl_judge.judge_output import (
    Judgement,
    JudgeOutputError,
    format_instructions,
    parse_judgements,
    response_schema,
)
from mcprl_judge.metrics import JudgeMetrics
from mcprl_judge.settings import JudgeSettings
from mcprl_judge.upstream import JudgeUpstream, StructuredOutputRejected, add_usage

log = logging.getLogger(__name__)

DEFAULT_RUBRIC = dedent(
    """\
    - A trajectory that reaches the goal scores clearly higher than one that does not.
    - Between two that reach it, the one that gets there more directly (fewer useless or
      repeated tool calls, no detours) scores higher.
    - Small differences in quality deserve small differences in score, large ones large.
    - Progress toward the goal without reaching it earns partial credit.
    - A final answer that is not supported by the tool results it saw (made up) is worse
      than admitting it could not find out."""
)

JUDGE_INSTRUCTIONS = dedent(
    """\
    You judge AI agents. Each trajectory below is one attempt by an agent at the same task,
    using the tools listed. Read them all, then give each a score between 0 and 1 relative
    to the others, with a short explanation. Use your best understanding of the task.

    Grading standards:
    {rubric}

    {format}"""
)


@dataclass
class RulerPrompt:
    """The judge's input for one group, and how trajectories map onto the judged ones."""

    messages: list[dict[str, Any]]
    ids: list[str]  # ids of the unique trajectories, "1".."m"
    assignment: list[int]  # for each trajectory of the group, its unique index
    prefix_len: int = 0
    chars: int = 0

    @property
    def unique(self) -> int:
        return len(self.ids)


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    """Drop empty fields so the judge reads (and we pay for) only what carries meaning."""

    return {k: v for k, v in message.items() if v is not None and v != [] and v != ""}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def common_prefix_len(message_lists: list[list[dict[str, Any]]]) -> int:
    """How many leading messages every list shares."""

    if not message_lists:
        return 0
    first = message_lists[0]
    n = 0
    while n < len(first) and all(len(ms) > n and ms[n] == first[n] for ms in message_lists):
        n += 1
    return n


def _tool_listing(trajectories: list[Trajectory]) -> list[dict[str, Any]]:
    """The group's tools (union by name), as name, description, parameters."""

    seen: dict[str, dict[str, Any]] = {}
    for trajectory in trajectories:
        for tool in trajectory.tools or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else {}
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str) or name in seen:
                continue
            entry: dict[str, Any] = {"name": name}
            if fn.get("description"):
                entry["description"] = fn["description"]
            params = fn.get("parameters") or fn.get("inputSchema")
            if params:
                entry["parameters"] = params
            seen[name] = entry
    return list(seen.values())


def build_prompt(
    task: str,
    trajectories: list[Trajectory],
    rubric: str,
    explanation_max_chars: int,
) -> RulerPrompt:
    """Dedupe the group, split off the shared prefix and write the judge's two messages."""

    lists = [[_clean(m) for m in t.messages] for t in trajectories]
    unique: list[list[dict[str, Any]]] = []
    index: dict[str, int] = {}
    assignment: list[int] = []
    for messages in lists:
        key = json.dumps(messages, sort_keys=True, ensure_ascii=False)
        if key not in index:
            index[key] = len(unique)
            unique.append(messages)
        assignment.append(index[key])
    ids = [str(i + 1) for i in range(len(unique))]

    # One unique trajectory: nothing to compare, send it whole (no shared-prefix split).
    prefix = common_prefix_len(unique) if len(unique) > 1 else 0
    parts = [f"<task>\n{task}\n</task>"]
    tools = _tool_listing(trajectories)
    if tools:
        parts.append(f"<tools>\n{_dumps(tools)}\n</tools>")
    if prefix:
        parts.append(f"<context>\n{_dumps(unique[0][:prefix])}\n</context>")
    body = "\n\n".join(
        f'<trajectory id="{tid}">\n{_dumps(messages[prefix:])}\n</trajectory>'
        for tid, messages in zip(ids, unique, strict=True)
    )
    parts.append("Trajectories:\n\n" + body)
    user = "\n\n".join(parts)
    system = JUDGE_INSTRUCTIONS.format(
        rubric=rubric.strip(), format=format_instructions(ids, explanation_max_chars))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return RulerPrompt(messages, ids, assignment, prefix, len(system) + len(user))


@dataclass
class RulerVerdict:
    judgements: list[Judgement]  # one per unique trajectory, in id order
    usage: Usage = field(default_factory=Usage)
    structured: bool = True


class RulerJudge:
    """Asks the judge model for a group's scores until it gives a usable answer."""

    def __init__(self, settings: JudgeSettings, upstream: JudgeUpstream,
                 metrics: JudgeMetrics) -> None:
        self.settings = settings
        self.upstream = upstream
        self.metrics = metrics
        self._no_schema: set[str] = set()  # models whose provider rejected json_schema

    def _response_format(self, prompt: RulerPrompt) -> dict[str, Any]:
        schema = response_schema(prompt.ids, bounds=self.settings.schema_bounds,
                                 explanation_max_chars=self.settings.explanation_max_chars)
        return {"type": "json_schema",
                "json_schema": {"name": "ruler_scores", "schema": schema, "strict": True}}

    async def judge(self, prompt: RulerPrompt, model: str, *,
                    model_overridden: bool = False) -> RulerVerdict:
        mode = self.settings.structured_output
        use_schema = mode == "json_schema" or (mode == "auto" and model not in self._no_schema)
        usage = Usage()
        messages = list(prompt.messages)
        attempts = self.settings.max_parse_retries + 1
        last: JudgeOutputError | None = None
        for attempt in range(attempts):
            fmt = self._response_format(prompt) if use_schema else None
            try:
                completion = await self.upstream.complete(
                    messages, model=model, response_format=fmt,
                    max_tokens=self.settings.max_output_tokens, model_overridden=model_overridden)
            except StructuredOutputRejected as exc:
                if mode != "auto":
                    raise UpstreamError(
                        f"the judge upstream rejected response_format=json_schema ({exc}); "
                        "set JUDGE_STRUCTURED_OUTPUT=auto or none for this provider") from None
                self.metrics.failures.labels("structured_output_unsupported").inc()
                log.warning("judge upstream rejected json_schema; falling back to text JSON",
                            extra={"model": model, "reason": str(exc)})
                use_schema = False
                completion = await self.upstream.complete(
                    messages, model=model, response_format=None,
                    max_tokens=self.settings.max_output_tokens, model_overridden=model_overridden)
                self._no_schema.add(model)
            add_usage(usage, completion)
            try:
                parsed = parse_judgements(completion.text, prompt.ids)
            except JudgeOutputError as exc:
                self.metrics.failures.labels(exc.kind).inc()
                reason = str(exc)
                if completion.finish_reason == "length":
                    reason += " (the answer was cut off at the token limit: be briefer)"
                last = JudgeOutputError(reason, exc.kind)
                log.info("judge answer unusable", extra={"attempt": attempt + 1,
                                                         "reason": reason, "model": model})
                messages = [
                    *prompt.messages,
                    {"role": "assistant", "content": completion.text[:8000]},
                    {"role": "user", "content": f"That answer could not be used: {reason}. "
                     + format_instructions(prompt.ids, self.settings.explanation_max_chars)},
                ]
                continue
            return RulerVerdict([parsed[i] for i in prompt.ids], usage, use_schema)
        raise UpstreamError(
            f"the judge model gave no usable answer in {attempts} attempts; last problem: {last}")
