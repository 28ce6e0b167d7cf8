"""scenario-gen: train/val scenario sets from any MCP server's tools (strategies ``llm``
and ``sql``), as a FastAPI service and a CLI (``mcprl-scenario-gen``)."""

__version__ = "0.1.0"
