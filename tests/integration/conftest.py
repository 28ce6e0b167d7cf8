"""The pipeline stack (every service as a local process, tiny model, loopback, free ports),
started once per session and shared with tests/examples."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcprl_stack import LocalStack
from mcprl_testing.stack import shared_stack


@pytest.fixture(scope="session")
def pipeline(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             tiny_test_model: Path) -> LocalStack:
    return shared_stack(request.config, tmp_path_factory.mktemp("stack"), tiny_test_model)
