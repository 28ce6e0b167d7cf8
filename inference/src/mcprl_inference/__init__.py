"""OpenAI-compatible rollout engine (vLLM API subset) and the tiny models."""
