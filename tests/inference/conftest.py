"""Fixtures of the engine tests: our server on 127.0.0.1 (uvicorn thread) and openai clients."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

# The service stack (httpx, openai, fastapi) is imported inside the fixtures, so the engine
# tests (test_engine.py, test_cuda_graphs.py) also run on a GPU box that has only torch.
if not torch.cuda.is_available():
    torch.set_num_threads(1)  # two cores shared by the whole team

MAX_MODEL_LEN = 512


class Server:
    """A running engine: its URL, an openai client and the model name to send."""

    def __init__(self, thread: Any, model: str) -> None:
        import httpx
        from openai import OpenAI

        self.thread = thread
        self.url = thread.url
        self.model = model
        self.client = OpenAI(base_url=f"{self.url}/v1", api_key="EMPTY", max_retries=0,
                             timeout=60.0)
        self.http = httpx.Client(base_url=self.url, timeout=60.0)

    def metric(self, name: str) -> float:
        """Sum of a metric's samples in /metrics (all label sets)."""

        total, found = 0.0, False
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        assert found, f"{name} not in /metrics"
        return total


@contextlib.contextmanager
def serve(model: Path | str, **overrides: Any) -> Iterator[Server]:
    from mcprl_common.process import UvicornThread
    from mcprl_inference.app import create_app
    from mcprl_inference.settings import InferenceSettings

    settings = InferenceSettings(model=str(model), max_model_len=MAX_MODEL_LEN,
                                 max_batch_size=16, log_json=False, **overrides)
    thread = UvicornThread(create_app(settings))
    with thread:
        server = Server(thread, settings.model_name)
        try:
            yield server
        finally:
            server.http.close()
            server.client.close()


@pytest.fixture(scope="session")
def serve_factory() -> Callable[..., contextlib.AbstractContextManager[Server]]:
    return serve


@pytest.fixture(scope="module")
def server(tiny_test_model: Path) -> Iterator[Server]:
    """One shared tiny-test server per module (its state is not changed by the tests using it)."""

    with serve(tiny_test_model) as srv:
        yield srv


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_test_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_test_model)


@pytest.fixture(scope="session")
def tiny_reference(tiny_test_model: Path) -> Any:
    """The tiny model loaded plainly by transformers (fp32, sdpa): the reference forward pass."""

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    return model.eval()


def reference_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """log p(completion[i] | prompt + completion[:i]) from one plain forward pass."""

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1
    return [lp[start + i, t].item() for i, t in enumerate(completion)]


@pytest.fixture(scope="session")
def ref_logprobs(tiny_reference: Any) -> Callable[..., list[float]]:
    """``ref_logprobs(prompt_ids, completion_ids, model=None)`` from a plain HF forward pass."""

    def _ref(prompt: list[int], completion: list[int], model: Any = None) -> list[float]:
        return reference_logprobs(model or tiny_reference, prompt, completion)

    return _ref
