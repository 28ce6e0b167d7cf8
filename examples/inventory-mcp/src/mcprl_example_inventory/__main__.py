"""``mcprl-example-inventory``: serve the inventory MCP server in the foreground."""

from __future__ import annotations

from mcprl_common.service_app import run_service
from mcprl_example_inventory.app import SERVICE, create_app
from mcprl_example_inventory.settings import InventorySettings


def main() -> None:
    settings = InventorySettings()
    run_service(create_app(settings), settings, SERVICE)


if __name__ == "__main__":
    main()
