"""Optional bearer-token protection of the MCP endpoints, on FastMCP's auth API."""

from __future__ import annotations

import hmac

from fastmcp.server.auth import AccessToken, TokenVerifier


class BearerTokenVerifier(TokenVerifier):
    """Accept exactly one shared token (``MCP_AUTH_TOKEN``), compared in constant time."""

    def __init__(self, token: str) -> None:
        super().__init__()
        if not token:
            raise ValueError("an empty token would accept anyone")
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token="***", client_id="mcp-client", scopes=[])
        return None
