"""``POST /v1/chat/completions``: render the chat template, generate, parse tool calls."""

from __future__ import annotations

import json
import uuid
from typing import Any

from mcprl_common.errors import BadRequestError
from mcprl_common.model_formats import ToolParser
from mcprl_inference.api import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobEntry,
    ChatMessage,
    ChatResponseMessage,
    TopLogprob,
    UsageInfo,
)
from mcprl_inference.engine import SequenceOutput
from mcprl_inference.serving_engine import ServingBase


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    """OpenAI content (string or parts) as the plain string Qwen-style templates expect."""

    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequestError(f"message content part of type {part.get('type')!r} is not "
                                  "supported (text only)", param="messages")
        texts.append(part["text"])
    return "\n".join(texts)


def to_template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template wants them; tool-call arguments parsed to dicts (as vLLM)."""

    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {"role": m.role, "content": _text_of(m.content)}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            calls = []
            for j, call in enumerate(m.tool_calls):
                call = dict(call)
                fn = dict(call.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError as exc:
                        raise BadRequestError(
                            f"messages[{i}].tool_calls[{j}].function.arguments is not valid "
                            f"JSON: {exc}", param="messages") from exc
                call["function"] = fn
                calls.append(call)
            msg["tool_calls"] = calls
        out.append(msg)
    return out


class ServingChat(ServingBase):
    """Chat completions with Hermes tool calls, structured output and token ids."""

    def __init__(self, *args: Any, tool_parser: type[ToolParser] | None,
                 chat_template: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tool_parser = tool_parser(self.tokenizer) if tool_parser else None
        self.chat_template = chat_template

    def render(self, req: ChatCompletionRequest) -> list[int]:
        messages = to_template_messages(req.messages)
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        kwargs = dict(req.chat_template_kwargs or {})
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, chat_template=self.chat_template,
                add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message, **kwargs)
        except Exception as exc:  # jinja errors, missing fields: the client's messages
            raise BadRequestError(f"could not apply the chat template to these messages: "
                                  f"{type(exc).__name__}: {exc}", param="messages") from exc
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _parse_tools(self, req: ChatCompletionRequest) -> bool:
        choice = req.tool_choice
        if choice is None:
            choice = "auto" if req.tools else "none"
        if isinstance(choice, dict) or choice not in ("auto", "none"):
            raise BadRequestError(f"tool_choice {choice!r} is not supported by this engine; use "
                                  "'auto' or 'none'", param="tool_choice")
        if choice == "auto" and req.tools:
            if self.tool_parser is None:
                raise BadRequestError('"auto" tool choice requires tool-call parsing to be '
                                      "enabled (INFERENCE_ENABLE_AUTO_TOOL_CHOICE)",
                                      param="tool_choice")
            return True
        return False

    async def create(self, req: ChatCompletionRequest) -> ChatCompletionResponse:
        adapter = self.models.resolve(req.model)
        parse_tools = self._parse_tools(req)
        if req.top_logprobs is not None and not req.logprobs and req.top_logprobs > 0:
            raise BadRequestError("top_logprobs needs logprobs=true", param="top_logprobs")
        prompt = self.render(req)
        grammar = await self.grammar_for(req.response_format)
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens=req.max_completion_tokens or req.max_tokens,
                                      prompt_len=len(prompt), logprobs=logprobs, grammar=grammar)
        self.check(len(prompt), params)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        result = await self.generate(prompt, params, adapter, request_id)
        choices = [self._choice(req, o, params, parse_tools) for o in result.outputs]
        completion = sum(len(o.token_ids) for o in result.outputs)
        return ChatCompletionResponse(
            id=request_id, model=req.model or self.models.base_name, choices=choices,
            usage=UsageInfo(prompt_tokens=len(prompt), completion_tokens=completion,
                            total_tokens=len(prompt) + completion),
            prompt_token_ids=list(result.prompt_token_ids) if req.return_token_ids else None,
        )

    def _choice(self, req: ChatCompletionRequest, out: SequenceOutput, params: Any,
                parse_tools: bool) -> ChatChoice:
        text = self.output_text(out.token_ids, out.finish_reason, out.stop_reason, params,
                                req.include_stop_str_in_output, req.skip_special_tokens)
        message = ChatResponseMessage(content=text)
        finish = out.finish_reason
        if parse_tools and self.tool_parser is not None:
            parsed = self.tool_parser.extract_tool_calls(text)
            if parsed.tools_called:
                message = ChatResponseMessage(content=parsed.content, tool_calls=parsed.tool_calls)
                finish = "tool_calls"
        logprobs = None
        if req.logprobs:
            logprobs = ChatChoiceLogprobs(content=[
                ChatLogprobEntry(**self._lp(tid, lp), top_logprobs=[
                    TopLogprob(**self._lp(t, p)) for t, p in (tops or [])])
                for tid, lp, tops in zip(out.token_ids, out.logprobs,
                                         out.top_logprobs or [None] * len(out.token_ids),
                                         strict=True)])
        return ChatChoice(index=out.index, message=message, logprobs=logprobs,
                          finish_reason=finish, stop_reason=out.stop_reason,
                          token_ids=list(out.token_ids) if req.return_token_ids else None)

    def _lp(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.token_text(token_id)
        return {"token": token, "logprob": max(logprob, -9999.0),
                "bytes": list(token.encode("utf-8", errors="replace"))}
