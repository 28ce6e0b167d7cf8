"""Scenario strategies behind one base class and a name registry (one module each)."""

from mcprl_scenario_gen.strategies.base import (
    GenerationContext,
    GenerationParams,
    Progress,
    Strategy,
)
from mcprl_scenario_gen.strategies.registry import get_strategy, register, strategy_names

__all__ = [
    "GenerationContext",
    "GenerationParams",
    "Progress",
    "Strategy",
    "get_strategy",
    "register",
    "strategy_names",
]
