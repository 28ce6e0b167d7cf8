"""Repository-wide test fixtures: where the tiny models are, and thread limits for 2 cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_test_model() -> Path:
    """The ~1M-parameter Qwen2-architecture model built by ``make tiny-model``."""

    path = MODELS / "tiny-test"
    if not (path / "config.json").exists():
        pytest.fail("models/tiny-test is missing: run `make tiny-model` (make test does it)")
    return path


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct converted by ``make base-model`` (the pretrained policy)."""

    path = MODELS / "smollm2-135m-instruct"
    if not (path / "mcprl-base.json").exists():
        pytest.fail("models/smollm2-135m-instruct is missing: run `make base-model` "
                    "(make test does it)")
    return path
