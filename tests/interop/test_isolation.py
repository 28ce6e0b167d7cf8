"""The ART extra stays optional: no service imports it, and what importing ``art`` does to a
process (a patched transformers function, .env loading, a price-list download) is undone or
turned off by ``mcprl_art``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
SERVICE_SOURCES = ["common", "mcp-server", "inference", "scenario-gen", "judge", "trainer",
                   "stack", "demo", "examples/inventory-mcp"]
ART_SIDE = {"art", "litellm", "weave", "polars", "mcprl_art"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_service_imports_the_art_side() -> None:
    files = [f for d in SERVICE_SOURCES for f in (REPO / d).rglob("*.py")]
    assert len(files) > 100
    offenders = {str(f.relative_to(REPO)): sorted(_imports(f) & ART_SIDE) for f in files
                 if _imports(f) & ART_SIDE}
    assert offenders == {}


def test_services_load_without_art_in_the_process() -> None:
    code = ("import sys\n"
            "import mcprl_judge.app, mcprl_trainer.trainer, mcprl_scenario_gen.app, "
            "mcprl_inference.app, mcprl_mcp_server.app, mcprl_stack.local_stack\n"
            f"print(sorted(m for m in {sorted(ART_SIDE)!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_mcprl_art_undoes_what_importing_art_does(tmp_path) -> None:
    pytest.importorskip("mcprl_art", reason="the ART extra is not installed (make setup-art)")
    code = ("import art\n"  # art first, as a user might
            "from transformers import masking_utils as mu\n"
            "patched = mu._preprocess_mask_arguments.__module__\n"
            "import mcprl_art\n"
            "print(patched, mu._preprocess_mask_arguments.__module__)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LITELLM", "PYTHON_DOTENV"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100, check=True, cwd=tmp_path, env=env)
    assert out.stdout.split() == ["art.transformers.patches", "transformers.masking_utils"]
    # imported first, mcprl_art also keeps .env loading and the price-list fetch off
    code = ("import mcprl_art, os\n"
            "print(os.environ['PYTHON_DOTENV_DISABLED'], "
            "os.environ['LITELLM_LOCAL_MODEL_COST_MAP'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100, check=True, cwd=tmp_path, env=env)
    assert out.stdout.split() == ["1", "True"]
