"""mcp-rl services as local processes: what ``make stack``, ``make demo`` and the
integration tests start.

The processes get the same environment variable names as the containers of ``compose.yaml``
(``MCP_URL``, ``JUDGE_BASE_URL``, ``SCENARIO_GEN_DATA_DIR`` ...), so a setting means the same
thing in both. ``LocalStack(config).start()`` / ``.stop()`` (or ``with LocalStack(config)``)
is the Python API; ``mcprl-stack up`` runs until Ctrl-C or SIGTERM.
"""

from mcprl_stack.config import StackSettings
from mcprl_stack.local_stack import LocalStack, StackError
from mcprl_stack.services import SERVICES, ServiceSpec

__all__ = ["SERVICES", "LocalStack", "ServiceSpec", "StackError", "StackSettings"]
__version__ = "0.1.0"
