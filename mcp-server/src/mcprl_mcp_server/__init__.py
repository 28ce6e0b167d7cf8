"""The company-db MCP server.

A SQLite "company" database (departments, employees, projects) exposed to agents through
three MCP tools (``list_tables``, ``describe_table``, ``run_query``) over Streamable HTTP
(``/mcp``) and legacy SSE (``/sse``) from one uvicorn app. Read-only is enforced by SQLite
itself (read-only connection + authorizer), every query has a time limit, a row cap and a
result-size cap, and every failure comes back as an MCP tool error the agent can act on.

Build an app with :func:`mcprl_mcp_server.app.create_app`; tests of other services use
:func:`mcprl_mcp_server.loopback.serve_mcp`.
"""

__version__ = "0.1.0"
