"""The trainer reads the model format from the common package, never from the engine's code:
the trainer's image ships without the inference package."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import mcprl_trainer

TRAINER_SRC = Path(mcprl_trainer.__file__).parent
TRAINER_PYPROJECT = TRAINER_SRC.parents[1] / "pyproject.toml"


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``source`` names (lazy ones too)."""

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_scanner_sees_nested_imports() -> None:
    src = "import os\ndef f():\n    from mcprl_inference.api import ToolCall\n"
    assert imported_modules(src) == {"os", "mcprl_inference.api"}


def test_trainer_never_imports_the_engine() -> None:
    files = sorted(TRAINER_SRC.rglob("*.py"))
    assert len(files) > 10
    offenders = {
        f.relative_to(TRAINER_SRC).as_posix(): sorted(m for m in imported_modules(f.read_text())
                                                     if m.split(".")[0] == "mcprl_inference")
        for f in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_trainer_does_not_depend_on_the_inference_package() -> None:
    deps = tomllib.loads(TRAINER_PYPROJECT.read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.startswith("mcprl-inference")]
    dockerfile = (TRAINER_PYPROJECT.parent / "Dockerfile").read_text()
    assert "inference/" not in dockerfile
