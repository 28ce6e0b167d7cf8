"""Build the project's tiny models, deterministically and offline.

No weights can be downloaded where the tests and the demo run, so the project makes its own
small causal LMs with Qwen2.5-3B-Instruct's *architecture* (``Qwen2ForCausalLM``) and *chat
format* (Qwen2.5's template with tools and Hermes ``<tool_call>`` blocks). They are saved in
HF format, so the same loading path serves them and ``Qwen/Qwen2.5-3B-Instruct``.

- ``tiny-test`` (~1M parameters): unit tests, fast on 2 CPU cores.
- ``tiny-learn`` (~15M parameters): learning runs (warm start, demo, GPU experiments).

The byte-level BPE tokenizer is trained with ``tokenizers`` on a generated corpus of the
project's domain (chat turns, tool calls, SQL over the company database, numbers) with Qwen2's
pre-tokenizer rules (digits split one by one), so tool calls and SQL tokenize compactly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from mcprl_common.files import make_readable
from mcprl_common.model_formats import get_model_format

# Qwen2's pre-tokenization pattern: contractions, words, single digits, punctuation, spaces.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special: they survive skip_special_tokens, as in Qwen2.5's tokenizer.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 8192


@dataclass(frozen=True)
class TinySpec:
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


SPECS = {
    "tiny-test": TinySpec("tiny-test", 128, 384, 3, 4, 2),
    "tiny-learn": TinySpec("tiny-learn", 384, 1152, 8, 6, 2),
}

_WORDS = (  # noqa: SIM905 - a word list reads better as one string
    "the of and to in is for on with that how many which what list show find average total "
    "sum count number employees employee department departments project projects budget salary "
    "salaries location role hired hire date since before after between active completed on_hold "
    "status lead leads highest lowest top most least per each name names answer tables table "
    "schema columns column query database result results error please use tools tool call "
    "describe run complete task final give only return order by descending ascending year years "
    "engineer manager analyst scientist director sales marketing engineering operations data "
    "science finance support research design product legal people hr london new york san "
    "francisco berlin tokyo austin toronto singapore paris are was were has have more than less "
    "equal at least over under whose who work works working currently every there all distinct"
).split()
_SQL = [
    "SELECT COUNT(*) FROM employees",
    "SELECT name, salary FROM employees WHERE department_id = 3 ORDER BY salary DESC LIMIT 5",
    "SELECT d.name, AVG(e.salary) FROM employees e JOIN departments d ON e.department_id = d.id "
    "GROUP BY d.name",
    "SELECT p.name, e.name FROM projects p JOIN employees e ON p.lead_id = e.id "
    "WHERE p.status = 'active'",
    "SELECT location, SUM(budget) FROM departments GROUP BY location",
    "WITH t AS (SELECT department_id, COUNT(*) AS n FROM employees GROUP BY department_id) "
    "SELECT d.name, t.n FROM t JOIN departments d ON d.id = t.department_id",
    "SELECT name FROM employees WHERE hire_date >= '2020-01-01' AND role LIKE '%Engineer%'",
]


def _corpus(seed: int = 0, n_docs: int = 3000) -> list[str]:
    """A deterministic corpus covering the chat format, tool calls, SQL, JSON and numbers."""

    rng = random.Random(seed)
    tools = ["list_tables", "describe_table", "run_query", "complete_task"]
    docs: list[str] = []
    for i in range(n_docs):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 30)))
        sql = rng.choice(_SQL)
        tool = rng.choice(tools)
        args = {"sql": sql} if tool == "run_query" else {"table_name": rng.choice(
            ["employees", "departments", "projects"])} if tool == "describe_table" else {}
        if tool == "complete_task":
            args = {"answer": f"{rng.randint(0, 999999)}.{rng.randint(0, 99):02d}"}
        row = {"id": i, "name": words.split()[0].title(), "salary": rng.randint(40_000, 250_000),
               "hire_date": f"{rng.randint(2005, 2025)}-{rng.randint(1, 12):02d}-"
                            f"{rng.randint(1, 28):02d}", "budget": rng.random() * 1e6}
        docs.append(
            f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            f"<|im_start|>user\n{words.capitalize()}?<|im_end|>\n"
            f"<|im_start|>assistant\n<tool_call>\n"
            f'{{"name": "{tool}", "arguments": {json.dumps(args)}}}\n</tool_call><|im_end|>\n'
            f"<|im_start|>user\n<tool_response>\n"
            f'{{"columns": ["id", "name"], "results": [{json.dumps(row)}], "row_count": 1, '
            f'"truncated": false}}\n</tool_response><|im_end|>\n'
        )
        docs.append(f"{sql};\n{words}. {rng.randint(0, 10**6)} {rng.random():.4f}\n")
    return docs


def build_tokenizer(out_dir: Path, seed: int = 0):
    """Train the byte-level BPE tokenizer and attach Qwen2.5's chat template."""

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(ADDED_TOKENS, special_tokens=False)
    fast.chat_template = get_model_format("hermes").chat_template()
    fast.save_pretrained(out_dir)
    return fast


def build_model(spec: TinySpec, out_dir: Path, seed: int = 0) -> int:
    """Random-initialised Qwen2ForCausalLM of ``spec``'s shape; returns its parameter count."""

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer(out_dir, seed)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=MODEL_MAX_LENGTH,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad, do_sample=True,
        temperature=1.0, top_p=1.0,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def _fingerprint(out_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(out_dir.glob("*")):
        if path.suffix in (".json", ".safetensors", ".jinja"):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def build(name: str, root: Path, seed: int = 0, force: bool = False) -> Path:
    """Build ``root/name`` unless it is already there (idempotent, cheap when up to date)."""

    out_dir = root / name
    marker = out_dir / "mcprl-tiny.json"
    if marker.exists() and not force:
        make_readable(out_dir)  # folders written before the mode fix
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    params = build_model(SPECS[name], out_dir, seed)
    make_readable(out_dir)  # safetensors writes 0600; containers read it as another uid
    marker.write_text(json.dumps({"name": name, "parameters": params, "seed": seed,
                                  "fingerprint": _fingerprint(out_dir)}, indent=2))
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--only", choices=sorted(SPECS), action="append")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    for name in args.only or sorted(SPECS):
        path = build(name, args.out, args.seed, args.force)
        info = json.loads((path / "mcprl-tiny.json").read_text())
        print(f"{name}: {info['parameters']:,} parameters at {path} ({info['fingerprint']})")


if __name__ == "__main__":
    main()
