"""Client of the policy engine (vLLM >= 0.10.2 or ours): token ids in, token ids out.

Only the parts of vLLM's API the trainer needs: ``POST /v1/completions`` with a prompt of
token ids and ``return_token_ids`` (the sampled ids and their log-probs come back), LoRA
hot-loading (``/v1/load_lora_adapter``) and sleep mode (``/sleep``, ``/wake_up``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from mcprl_common.http import RetryPolicy, ServiceCallError, request_json


class PolicyError(RuntimeError):
    """The engine failed for good (after retries) or answered something unusable.

    ``status`` is the engine's HTTP status (None: no answer), as in
    :class:`~mcprl_common.http.ServiceCallError`; 404 means it does not serve the model.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SampledTurn:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    model: str
    seconds: float = 0.0
    policy_version: int | None = None  # set by the publisher (mcprl_trainer.publish)


def _root(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class PolicyClient:
    def __init__(self, base_url: str, *, api_key: str = "EMPTY", timeout_s: float = 300.0,
                 max_retries: int = 3) -> None:
        self.base_url = base_url.rstrip("/")
        self.root = _root(base_url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(timeout=timeout_s, headers=headers,
                                      limits=httpx.Limits(max_connections=256))
        self.retry = RetryPolicy(max_retries=max_retries)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def complete(
        self,
        model: str,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: list[int] | None = None,
        ignore_eos: bool = False,
    ) -> SampledTurn:
        """Sample one turn from ``prompt_ids``. ``ignore_eos`` (vLLM's extra parameter) keeps
        sampling past the end-of-sequence token up to ``max_tokens``: fixed-length rollouts,
        as benchmarks need; the eos ids stay in the output like any other token."""

        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "n": 1,
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if seed is not None:
            body["seed"] = seed
        if stop_token_ids:
            body["stop_token_ids"] = stop_token_ids
        if ignore_eos:
            body["ignore_eos"] = True
        started = time.perf_counter()
        try:
            data = await request_json(self.http, "POST", f"{self.base_url}/completions",
                                      json=body, retry=self.retry)
        except ServiceCallError as exc:
            raise PolicyError(str(exc), status=exc.status) from exc
        try:
            choice = data["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lps = [float(x) if x is not None else 0.0
                   for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, IndexError, TypeError) as exc:
            raise PolicyError(f"engine answer lacks token_ids/logprobs: {exc!r}") from exc
        if len(ids) != len(lps):
            raise PolicyError(f"engine returned {len(ids)} token ids but {len(lps)} logprobs")
        return SampledTurn(ids, lps, choice.get("finish_reason") or "stop",
                           str(data.get("model", model)), time.perf_counter() - started)

    async def _command(self, url: str, *, json: Any = None,
                       params: dict[str, Any] | None = None) -> None:
        """POST a control request. vLLM answers these with plain text (or nothing), not
        JSON: a 2xx whose body is not JSON is a success."""

        try:
            await request_json(self.http, "POST", url, json=json, params=params,
                               retry=self.retry)
        except ValueError:  # 2xx with a text body (request_json raises on errors first)
            return
        except ServiceCallError as exc:
            raise PolicyError(f"{url}: {exc.message}", status=exc.status) from exc

    async def load_adapter(self, name: str, path: str) -> None:
        """Load (or replace) the LoRA served as ``name`` from ``path`` (seen by the engine).

        ``load_inplace`` makes vLLM >= 0.11 replace an adapter of the same name instead of
        answering 400; our engine and older vLLM accept it too.
        """

        await self._command(f"{self.base_url}/load_lora_adapter",
                            json={"lora_name": name, "lora_path": path, "load_inplace": True})

    async def unload_adapter(self, name: str) -> None:
        await self._command(f"{self.base_url}/unload_lora_adapter", json={"lora_name": name})

    async def sleep(self, level: int = 1) -> None:
        await self._command(f"{self.root}/sleep", params={"level": level})

    async def wake_up(self) -> None:
        await self._command(f"{self.root}/wake_up")

    async def is_sleeping(self) -> bool:
        data = await request_json(self.http, "GET", f"{self.root}/is_sleeping", retry=self.retry)
        return bool((data or {}).get("is_sleeping", False))
