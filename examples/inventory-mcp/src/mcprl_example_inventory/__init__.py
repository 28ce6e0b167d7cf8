"""A second, small MCP server of another domain (warehouse inventory).

It exists to show that the mcp-rl pipeline (scenario-gen, judge, trainer) works unchanged
against any MCP server: point ``MCP_URL`` at it.
"""

__version__ = "0.1.0"
