"""mcp-rl trainer: agent rollouts over MCP, GRPO on a LoRA adapter, adapters published to
the inference engine after every step.

The pipeline runs in named stages (see :mod:`mcprl_trainer.trainer`): sample groups of
rollouts (:mod:`rollout`, :mod:`groups`), score them (judge), turn rewards into advantages
(:mod:`advantages`), update the adapter (:mod:`grpo` with a loss from :mod:`loss`), then
checkpoint and publish (:mod:`checkpoint`, :mod:`publish`).
"""

__version__ = "0.1.0"
