"""Structured output with xgrammar: compile JSON schemas once, one matcher per sequence.

xgrammar is imported lazily so the engine core (and the GPU benchmark) runs without it.
"""

from __future__ import annotations

import json
import threading
from typing import Any


class GrammarError(ValueError):
    """The schema cannot be compiled (the client's mistake: HTTP 400)."""


class GrammarCompiler:
    """Thread-safe front of ``xgrammar.GrammarCompiler`` for one tokenizer and vocabulary."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info, max_threads=2)
        self._lock = threading.Lock()
        self.vocab_size = vocab_size

    def json_schema(self, schema: dict[str, Any] | str, strict: bool = True) -> Any:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GrammarError(f"response_format json_schema is not valid JSON: {exc}") from exc
        if not isinstance(parsed, dict):
            raise GrammarError("response_format json_schema.schema must be a JSON object")
        _check_schema(parsed)
        try:
            with self._lock:
                return self._compiler.compile_json_schema(text, strict_mode=strict)
        except Exception as exc:
            raise GrammarError(f"invalid JSON schema: {exc}") from exc

    def any_json(self) -> Any:
        with self._lock:
            return self._compiler.compile_builtin_json_grammar()

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    def bitmask(self, rows: int) -> Any:
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)


_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}


def _check_schema(schema: Any, path: str = "$") -> None:
    """Catch what xgrammar would silently accept as 'anything': unknown ``type`` names etc."""

    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise GrammarError(f"invalid JSON schema at {path}: expected an object or a boolean")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _TYPES:
            raise GrammarError(f"invalid JSON schema at {path}: unknown type {k!r}")
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise GrammarError(f"invalid JSON schema at {path}: 'properties' must be an object")
        for name, sub in props.items():
            _check_schema(sub, f"{path}.properties.{name}")
    required = schema.get("required")
    if required is not None and not (isinstance(required, list)
                                     and all(isinstance(r, str) for r in required)):
        raise GrammarError(f"invalid JSON schema at {path}: 'required' must be a list of names")
    items = schema.get("items")
    if items is not None:
        _check_schema(items, f"{path}.items")
    for key in ("anyOf", "oneOf", "allOf"):
        subs = schema.get(key)
        if subs is not None:
            if not isinstance(subs, list):
                raise GrammarError(f"invalid JSON schema at {path}: '{key}' must be a list")
            for i, sub in enumerate(subs):
                _check_schema(sub, f"{path}.{key}[{i}]")
