"""``python -m mcprl_mcp_server``: same as the ``mcprl-mcp-server`` console script."""

from mcprl_mcp_server.cli import main

if __name__ == "__main__":
    main()
