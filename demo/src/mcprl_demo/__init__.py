"""mcp-rl demo: the whole loop on a laptop CPU, and the recipe of its warm-started agent.

- ``python -m mcprl_demo`` (``make demo``): starts the stack as local processes, evaluates the
  warm-started agent, runs a few GRPO steps, evaluates again and prints a before/after table.
- ``python -m mcprl_demo.warmstart`` (``make warm-start``): a scripted expert solves ``sql``
  scenarios through the real MCP tools; its trajectories fine-tune a small random-init model
  until it acts (imperfectly), so RL has room to improve it.

Importing this package is cheap (no torch, no services): the SFT stage runs on a bare GPU box
with only torch, transformers and PyYAML.
"""

__version__ = "0.1.0"
