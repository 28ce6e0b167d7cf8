from __future__ import annotations

import json
import logging

from mcprl_common.logging import JsonFormatter, redact


def test_redact_hides_keys_and_bearer_tokens() -> None:
    text = "Authorization: Bearer abc.def-123 api_key=sk-or-v1-abcdefgh12345678 ok"
    out = redact(text)
    assert "abc.def-123" not in out
    assert "sk-or-v1-abcdefgh12345678" not in out
    assert out.endswith("ok")


def test_json_formatter_carries_extra_fields() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("w",), None)
    record.step = 3
    line = json.loads(JsonFormatter("svc").format(record))
    assert line["msg"] == "hello w" and line["step"] == 3 and line["service"] == "svc"
