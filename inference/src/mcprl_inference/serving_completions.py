"""``POST /v1/completions``: text or token-id prompts in, text and token ids out."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from mcprl_common.errors import BadRequestError
from mcprl_inference.api import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from mcprl_inference.engine import SequenceOutput
from mcprl_inference.serving_engine import ServingBase


class ServingCompletions(ServingBase):
    """Legacy completions, vLLM's way: several prompts, token-in/token-out, per-choice ids."""

    def prompts(self, req: CompletionRequest) -> list[tuple[list[int], str | None]]:
        """Each prompt's token ids (and its text, for ``echo``)."""

        p = req.prompt
        if isinstance(p, str):
            items: list[Any] = [p]
        elif p and all(isinstance(x, int) for x in p):
            items = [p]
        else:
            items = list(p)
        if not items:
            raise BadRequestError("prompt is empty", param="prompt")
        out: list[tuple[list[int], str | None]] = []
        for item in items:
            if isinstance(item, str):
                out.append((list(self.tokenizer.encode(item)), item))
            else:
                ids = [int(t) for t in item]
                bad = [t for t in ids if t < 0 or t >= self.engine.vocab_size]
                if bad:
                    raise BadRequestError(f"Token id {bad[0]} is out of vocabulary (vocab size "
                                          f"{self.engine.vocab_size}).", param="prompt")
                out.append((ids, None))
        return out

    async def create(self, req: CompletionRequest) -> CompletionResponse:
        adapter = self.models.resolve(req.model)
        if req.suffix is not None:
            raise BadRequestError("suffix is not supported", param="suffix")
        if req.echo and req.logprobs is not None:
            raise BadRequestError("echo together with logprobs is not supported by this engine",
                                  param="echo")
        prompts = self.prompts(req)
        grammar = await self.grammar_for(req.response_format)
        params_list = []
        request_id = f"cmpl-{uuid.uuid4().hex}"
        for ids, _ in prompts:  # validate every prompt before any starts
            params = self.sampling_params(req, max_tokens=req.max_tokens, prompt_len=len(ids),
                                          logprobs=req.logprobs, grammar=grammar)
            self.check(len(ids), params)
            params_list.append(params)
        results = await asyncio.gather(*(
            self.generate(ids, params, adapter, f"{request_id}-{i}")
            for i, ((ids, _), params) in enumerate(zip(prompts, params_list, strict=True))))
        choices: list[CompletionChoice] = []
        prompt_tokens = completion_tokens = 0
        for i, (result, (ids, text), params) in enumerate(
                zip(results, prompts, params_list, strict=True)):
            prompt_tokens += len(ids)
            for out in result.outputs:
                completion_tokens += len(out.token_ids)
                choices.append(self._choice(req, i * req.n + out.index, out, params, ids, text))
        return CompletionResponse(
            id=request_id, model=req.model or self.models.base_name, choices=choices,
            usage=UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                            total_tokens=prompt_tokens + completion_tokens))

    def _choice(self, req: CompletionRequest, index: int, out: SequenceOutput, params: Any,
                prompt_ids: list[int], prompt_text: str | None) -> CompletionChoice:
        text = self.output_text(out.token_ids, out.finish_reason, out.stop_reason, params,
                                req.include_stop_str_in_output, req.skip_special_tokens)
        if req.echo:
            prefix = prompt_text if prompt_text is not None else self.tokenizer.decode(
                prompt_ids, skip_special_tokens=req.skip_special_tokens)
            text = prefix + text
        logprobs = None
        if req.logprobs is not None:
            logprobs = CompletionLogprobs()
            offset = 0
            tops = out.top_logprobs or [[] for _ in out.token_ids]
            for tid, lp, top in zip(out.token_ids, out.logprobs, tops, strict=True):
                token = self.token_text(tid)
                logprobs.tokens.append(token)
                logprobs.token_logprobs.append(max(lp, -9999.0))
                logprobs.text_offset.append(offset)
                offset += len(token)
                entry = {self.token_text(t): max(p, -9999.0) for t, p in top}
                entry.setdefault(token, max(lp, -9999.0))
                logprobs.top_logprobs.append(entry)
        return CompletionChoice(
            index=index, text=text, logprobs=logprobs, finish_reason=out.finish_reason,
            stop_reason=out.stop_reason,
            prompt_token_ids=list(prompt_ids) if req.return_token_ids else None,
            token_ids=list(out.token_ids) if req.return_token_ids else None)
