"""``ignore_eos`` on the trainer's request path: PolicyClient -> our engine over HTTP.

The tiny model rarely samples its real eos, so the test makes one of its sampled tokens the
eos: a copy of the model whose generation_config names that token. The same seeded request
then stops on it without ``ignore_eos`` and samples past it, to ``max_tokens``, with it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from mcprl_common.process import UvicornThread
from mcprl_inference.app import create_app
from mcprl_inference.settings import InferenceSettings
from mcprl_trainer.policy import PolicyClient

PROMPT = [101, 57, 230, 18, 999, 4, 312, 77]
MAX_TOKENS = 10


def _sample(model: Path, *, ignore_eos: bool) -> tuple[list[int], str]:
    settings = InferenceSettings(model=str(model), device="cpu", max_model_len=256,
                                 kv_cache_memory_gb=0.1, log_json=False)

    async def ask(url: str):
        client = PolicyClient(f"{url}/v1", max_retries=0)
        try:
            return await client.complete(settings.model_name, PROMPT, max_tokens=MAX_TOKENS,
                                         temperature=1.0, seed=7, ignore_eos=ignore_eos)
        finally:
            await client.aclose()

    with UvicornThread(create_app(settings)) as server:
        turn = asyncio.run(ask(server.url))
    return turn.token_ids, turn.finish_reason


@pytest.mark.timeout(120)
def test_ignore_eos_samples_past_the_eos_token(tiny_test_model: Path, tmp_path: Path) -> None:
    ids, reason = _sample(tiny_test_model, ignore_eos=True)
    assert len(ids) == MAX_TOKENS and reason == "length"
    # The first sampled token not seen before it becomes the eos of a copy of the model.
    cut = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    model = tmp_path / "eos-model"
    shutil.copytree(tiny_test_model, model)
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": ids[cut]}))

    stopped, reason = _sample(model, ignore_eos=False)
    assert stopped == ids[: cut + 1] and reason == "stop"
    kept, reason = _sample(model, ignore_eos=True)
    assert kept == ids and reason == "length"  # the eos id sampled, then sampling went on
