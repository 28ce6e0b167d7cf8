"""Shared building blocks of the mcp-rl services.

Everything two or more services need lives here exactly once: the wire models of the
messages between services, the settings base classes, the HTTP client with timeouts and
retries, the error shape, Prometheus and logging helpers, and process helpers used by
tests, the demo and ``make stack``.
"""

__version__ = "0.1.0"
