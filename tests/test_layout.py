"""Test helpers live in tests/helpers (the mcprl_testing package), never inside a service's
package, so no image ships them and no service can come to depend on them."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_no_testing_modules_in_production_packages() -> None:
    sources = [p for p in REPO.glob("*/src") if p.is_dir()] + list(REPO.glob("*/*/src"))
    sources = [p for p in sources if ".venv" not in p.parts and "tests" not in p.parts]
    assert len(sources) >= 6
    found = [p.relative_to(REPO).as_posix() for src in sources for p in src.rglob("*.py")
             if p.stem in ("testing", "fakes") or p.stem.endswith("_testing")]
    assert found == []
