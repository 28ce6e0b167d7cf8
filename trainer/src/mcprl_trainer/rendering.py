"""Chat-template rendering owned by the trainer: token in, token out.

The prompt of turn k is *exactly* the token ids of turn k-1's prompt, plus the ids the model
sampled, plus newly rendered ids for what came back (tool results, template glue and the
next generation prompt). Sampled text is never decoded and re-tokenised: a BPE re-encoding
of the same text can differ from what was sampled, and training on other tokens than the
sampled ones biases the gradient.

The new ids are found by rendering the conversation with the tokenizer's chat template twice
(before and after the new messages) and tokenising only the suffix. Message contents go
through the template as placeholders and are tokenised apart with control tokens split, so
a tool result containing ``<|im_end|>`` is text to the model, never a turn boundary.

The model format (:mod:`mcprl_common.model_formats`, the same registry the engine reads) says
how tool calls are read back from sampled text and which tokens end a turn; a tokenizer
without a chat template gets the format's.
"""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass
from typing import Any

from mcprl_common.model_formats import (
    DEFAULT_MODEL_FORMAT,
    ModelFormat,
    ParsedAssistant,
    get_model_format,
    parse_assistant,
)

_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use characters: never produced by templates


class RenderError(ValueError):
    """The chat template is not append-only for this conversation (prefix changed)."""


@dataclass(frozen=True)
class Encoded:
    ids: list[int]
    text: str  # the rendered text, for logs and the judge; never re-tokenised


def _slot(i: int) -> str:
    return f"{_OPEN}{i}{_CLOSE}"


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI messages carry tool-call arguments as a JSON string; templates (Qwen's
    ``arguments | tojson``) expect the object, as HF and vLLM pass it."""

    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        fn = dict(call.get("function", call))
        if isinstance(fn.get("arguments"), str):
            with contextlib.suppress(json.JSONDecodeError):  # else rendered as the string
                fn["arguments"] = json.loads(fn["arguments"])
        fixed.append({**call, "function": fn} if "function" in call else fn)
    return {**message, "tool_calls": fixed}


class ChatRenderer:
    """Renders conversations with ``tokenizer``'s chat template into token ids."""

    def __init__(self, tokenizer: Any, model_format: str = DEFAULT_MODEL_FORMAT) -> None:
        self.tokenizer = tokenizer
        self.model_format: ModelFormat = get_model_format(model_format)
        self.eos_token_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token
        if self.eos_token_id is None or not self.eos_text:
            raise ValueError("the tokenizer needs an eos token (the end of an assistant turn)")
        # what the engine stops on: the eos first, then the format's other stop tokens
        extra = self.model_format.stop_token_ids(tokenizer)
        self.stop_token_ids: list[int] = [self.eos_token_id, *(
            i for i in dict.fromkeys(extra) if i != self.eos_token_id)]
        self._chat_template = (None if getattr(tokenizer, "chat_template", None)
                               else self.model_format.chat_template())

    def parse_assistant(self, text: str) -> ParsedAssistant:
        """Content and tool calls of a sampled turn's text, read with the format's parser."""

        return parse_assistant(text, self.model_format)

    # -- tokenisation ------------------------------------------------------------------------
    def encode_glue(self, text: str) -> list[int]:
        """Template text: control tokens (``<|im_start|>``...) are control tokens here."""

        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_content(self, text: str) -> list[int]:
        """Message contents: control-token strings inside are encoded as plain text."""

        if not text:
            return []
        return list(
            self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        )

    def _encode_slotted(self, text: str, contents: dict[int, str]) -> Encoded:
        ids: list[int] = []
        parts: list[str] = []
        rest = text
        while _OPEN in rest:
            before, _, after = rest.partition(_OPEN)
            key, _, rest = after.partition(_CLOSE)
            ids += self.encode_glue(before)
            content = contents[int(key)]
            ids += self.encode_content(content)
            parts += [before, content]
        ids += self.encode_glue(rest)
        parts.append(rest)
        return Encoded(ids, "".join(parts))

    # -- rendering ---------------------------------------------------------------------------
    @staticmethod
    def _with_slots(messages: list[dict[str, Any]], start: int = 0):
        slotted, contents = [], {}
        for i, msg in enumerate(messages, start):
            m = copy.deepcopy(msg)
            if isinstance(m.get("content"), str) and m["content"]:
                contents[i] = m["content"]
                m["content"] = _slot(i)
            slotted.append(m)
        return slotted, contents

    def _render(self, messages: list[dict[str, Any]], tools: list[dict] | None,
                add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [_template_message(m) for m in messages], tools=tools or None, tokenize=False,
            add_generation_prompt=add_generation_prompt, chat_template=self._chat_template,
        )

    def initial_prompt(self, messages: list[dict[str, Any]],
                       tools: list[dict] | None) -> Encoded:
        """The first prompt: system (with the tool schemas) + user + generation prompt."""

        slotted, contents = self._with_slots(messages)
        return self._encode_slotted(self._render(slotted, tools, True), contents)

    def continuation(
        self,
        history: list[dict[str, Any]],
        new_messages: list[dict[str, Any]],
        tools: list[dict] | None,
        *,
        sampled_ended_with_eos: bool,
    ) -> Encoded:
        """Ids to append after a sampled assistant turn: the rest of that turn's template glue
        (after the eos the model sampled, or a closing eos when it was cut off), the new
        messages and the next generation prompt.

        ``history`` ends with the assistant message of the sampled turn; its rendering only
        matters for where the turn ends, so its content is a placeholder.
        """

        if not history or history[-1].get("role") != "assistant":
            raise ValueError("history must end with the sampled assistant message")
        n = len(history)
        closed = [*history[:-1], {"role": "assistant", "content": _slot(n - 1)}]
        new_slotted, contents = self._with_slots(new_messages, start=n)
        before = self._render(closed, tools, False)
        after = self._render(closed + new_slotted, tools, True)
        if not after.startswith(before):
            raise RenderError("chat template re-renders earlier turns differently")
        tail = before[before.rindex(_slot(n - 1)) + len(_slot(n - 1)):]
        if sampled_ended_with_eos:
            if not tail.startswith(self.eos_text):
                raise RenderError(f"assistant turn does not end with {self.eos_text!r}")
            tail = tail[len(self.eos_text):]
        return self._encode_slotted(tail + after[len(before):], contents)

    def assistant_turn(
        self,
        history: list[dict[str, Any]],
        message: dict[str, Any],
        tools: list[dict] | None,
    ) -> Encoded:
        """The ids a model would have to sample to produce ``message`` (ending with eos): for
        expert demonstrations (SFT) and scripted policies, never for sampled turns."""

        prompt = self._render(history, tools, True)
        full = self._render([*history, message], tools, False)
        if not full.startswith(prompt):
            raise RenderError("chat template re-renders earlier turns differently")
        body = full[len(prompt):]
        end = body.rindex(self.eos_text)
        text = body[:end]
        return Encoded([*self.encode_glue(text), self.eos_token_id], text + self.eos_text)
