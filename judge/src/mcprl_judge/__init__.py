"""mcp-rl judge: RULER (relative LLM-as-judge) scores for groups of agent trajectories, in
front of any OpenAI-compatible model, plus verifiable rewards from scenario ground truths."""

__version__ = "0.1.0"
