"""Name -> strategy class. Modules register on import; :func:`get_strategy` imports them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, TypeVar

from mcprl_common.errors import BadRequestError

if TYPE_CHECKING:
    from mcprl_scenario_gen.strategies.base import Strategy

_REGISTRY: dict[str, type[Strategy]] = {}
_BUILTIN = ("mcprl_scenario_gen.strategies.sql", "mcprl_scenario_gen.strategies.llm")
S = TypeVar("S", bound="type[Strategy]")


def register(cls: S) -> S:
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    for module in _BUILTIN:
        importlib.import_module(module)


def strategy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def get_strategy(name: str) -> Strategy:
    _load_builtin()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise BadRequestError(
            f"unknown strategy {name!r}; known: {', '.join(sorted(_REGISTRY))}", param="strategy"
        ) from None
