"""``python -m mcprl_scenario_gen`` is the CLI (``mcprl-scenario-gen``)."""

from mcprl_scenario_gen.cli import main

if __name__ == "__main__":
    main()
