"""The split-K decode attention kernel (``engine.decode_attention``, Triton).

CI has no GPU: the kernel runs under Triton's interpreter there (``TRITON_INTERPRET=1``, set
before Triton compiles anything, so in a child process). The interpreter's ``tl.dot`` does not
take bfloat16: it checks float32 here; the bfloat16 path is checked on CUDA
(tests/inference/test_cuda_graphs.py and the CUDA test below).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from mcprl_inference.engine.decode_attention import MAX_SPLITS, num_splits, resolve

_REFERENCE = """
import torch

def reference(q, k, v, lengths):
    rows, kv_heads, groups, dim = q.shape
    out = []
    for b in range(rows):
        n = int(lengths[b])
        scores = q[b].float() @ k[b, :, :n].float().transpose(-1, -2) * dim**-0.5
        out.append((torch.softmax(scores, -1) @ v[b, :, :n].float())
                   .reshape(1, kv_heads * groups, dim))
    return torch.stack(out)
"""


def _interpreted(script: str, timeout: float = 240) -> dict:
    """Run ``script`` under Triton's interpreter; it prints one JSON object last."""

    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                          capture_output=True, text=True, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# On a GPU box the kernel runs natively (the CUDA test below and test_cuda_graphs.py); the
# interpreter there may be another Triton's (3.6's, on the lent H100s, raised a TypeError).
interpreted = pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="CPU only: on CUDA the kernel runs natively")


@interpreted
def test_each_row_attends_to_exactly_its_own_length() -> None:
    """Against plain softmax attention, for grouped (8 query heads a KV head, as Qwen2.5-3B),
    odd (3) and no grouping, one chunk or several; positions past a row's length hold NaN,
    so a kernel that read one would not come out finite."""

    result = _interpreted(_REFERENCE + """
import json
from mcprl_inference.engine.decode_attention import decode_attention

torch.manual_seed(0)
errors = {}
for rows, kv_heads, groups, dim, window in [(3, 2, 8, 16, 150), (2, 3, 3, 64, 70),
                                            (4, 1, 1, 8, 300)]:
    q = torch.randn(rows, kv_heads, groups, dim)
    k = torch.randn(rows, kv_heads, window, dim)
    v = torch.randn(rows, kv_heads, window, dim)
    lengths = torch.randint(1, window + 1, (rows,))
    lengths[0] = 1
    for b in range(rows):
        k[b, :, int(lengths[b]):] = float("nan")
        v[b, :, int(lengths[b]):] = float("nan")
    want = reference(q, k, v, lengths)
    for splits in (1, 3, None):
        got = decode_attention(q, k, v, lengths.to(torch.int32), dim**-0.5, splits=splits)
        assert got.shape == (rows, 1, kv_heads * groups, dim), got.shape
        errors[f"{rows}x{kv_heads}x{groups}x{dim}x{window}/{splits}"] = (
            (got - want).abs().max().item())
# a length past the window (the engine never passes one) reads the window, nothing beyond
q, k, v = torch.randn(2, 1, 2, 16), torch.randn(2, 1, 80, 16), torch.randn(2, 1, 80, 16)
got = decode_attention(q, k[:, :, :50], v[:, :, :50], torch.tensor([70, 50], dtype=torch.int32),
                       16**-0.5, splits=2)
errors["past the window"] = (got - reference(q, k, v, torch.tensor([50, 50]))).abs().max().item()
print(json.dumps(errors))
""")
    assert len(result) == 10
    for case, error in result.items():
        assert error < 1e-5, (case, error)  # NaN fails too


@interpreted
def test_engine_decodes_the_same_with_the_split_k_kernel(tiny_test_model: Path,
                                                         tmp_path: Path) -> None:
    """The whole engine on the tiny Qwen2 model, the split-K kernel with its one-kernel KV
    write (``fuse=kv``), with the rotary left to those two kernels (``kv+rope``), and with
    the write and the chunk merge inside the attention kernel and the fused sampler
    (``attn+rope+sample``): greedy
    tokens and their log-probs as with SDPA, index_put and HF's rotary, with more prompts
    than slots (rows compacted and slots reused mid-flight), every other one through a LoRA
    on q/k/v (the rotary taken over comes after the adapter's delta)."""

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_test_model), LoraConfig(
        r=8, lora_alpha=16, init_lora_weights=False,
        target_modules=["q_proj", "k_proj", "v_proj"]))
    peft.save_pretrained(tmp_path / "adapter")
    result = _interpreted(f"""
import json
from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams

def run(kernel, fuse):
    engine = LLMEngine.from_pretrained({str(tiny_test_model)!r}, EngineConfig(
        device="cpu", dtype="float32", max_batch_size=4, max_model_len=256,
        decode_attention=kernel, fuse=fuse)).start()
    assert ("kv write (triton)" in engine.runner.fusions) == ("kv" in fuse)
    assert ("rotary in the kv write + attention (triton)" in engine.runner.fusions) == (
        "rope" in fuse)
    assert ("kv write + chunk merge in the attention (triton)" in engine.runner.fusions) == (
        "attn" in fuse)
    assert ("sampler (triton)" in engine.runner.fusions) == ("sample" in fuse)
    try:
        engine.load_lora("policy", {str(tmp_path / "adapter")!r}).result(60)
        prompts = [[(11 * i + 5 * j) % 1000 + 10 for j in range(4 + 7 * i)] for i in range(6)]
        futures = [engine.add_request(p, SamplingParams(max_tokens=6 + 2 * i, temperature=0.0,
                                                        ignore_eos=True),
                                      adapter="policy" if i % 2 else None)
                   for i, p in enumerate(prompts)]
        return [f.result(200).outputs[0] for f in futures]
    finally:
        engine.shutdown()

sdpa = run("sdpa", "none")
out = {{}}
for fuse in ("kv", "kv+rope", "attn+rope+sample"):
    split_k = run("triton", fuse)
    out[fuse] = {{
        "tokens": [o.token_ids for o in split_k], "want": [o.token_ids for o in sdpa],
        "logprob_error": max(abs(a - b) for x, y in zip(split_k, sdpa)
                             for a, b in zip(x.logprobs, y.logprobs, strict=True))}}
print(json.dumps(out))
""")
    assert set(result) == {"kv", "kv+rope", "attn+rope+sample"}
    for fuse, got in result.items():
        assert [len(t) for t in got["tokens"]] == [6 + 2 * i for i in range(6)], fuse
        assert got["tokens"] == got["want"], fuse
        assert got["logprob_error"] < 1e-4, (fuse, got["logprob_error"])


_KV_WRITE = """
import torch
from mcprl_inference.engine.decode_attention import write_decode_kv

def kv_write_errors(device, dtype):
    \"\"\"The kernel against the two index_puts it replaces, on strided K/V (as the attention
    layer hands them: views of one projection's output) and a cache of more slots than rows.\"\"\"
    gen = torch.Generator().manual_seed(0)
    errors = {}
    for rows, kv_heads, dim in [(5, 2, 16), (3, 3, 24), (64, 2, 128)]:
        slots, window = rows + 2, 40
        cache = torch.randn(3, 2, slots, kv_heads, window, dim, generator=gen).to(device, dtype)
        fused, want = cache.clone(), cache.clone()
        qkv = torch.randn(rows, 1, 3 * kv_heads * dim, generator=gen).to(device, dtype)
        k, v = (qkv[..., i * kv_heads * dim:(i + 1) * kv_heads * dim]
                .view(rows, 1, kv_heads, dim).transpose(1, 2) for i in (1, 2))
        positions = torch.randint(0, window, (rows,), generator=gen).to(device)
        write_decode_kv(fused[1], positions, k, v)
        index = torch.arange(rows, device=device)
        want[1, 0][index, :, positions] = k[:, :, 0]
        want[1, 1][index, :, positions] = v[:, :, 0]
        errors[f"{rows}x{kv_heads}x{dim}"] = (fused.float() - want.float()).abs().max().item()
    return errors
"""


@interpreted
def test_decode_kv_write_matches_index_put() -> None:
    """Only the planned positions change, bit for bit, other layers and slots untouched."""

    result = _interpreted(_KV_WRITE + """
import json
print(json.dumps({**{f"f32 {k}": e for k, e in kv_write_errors("cpu", torch.float32).items()},
                  **{f"f16 {k}": e for k, e in kv_write_errors("cpu", torch.float16).items()}}))
""")
    assert len(result) == 6
    assert all(error == 0.0 for error in result.values()), result


_ROPE = """
import torch
from mcprl_inference.engine.decode_attention import decode_attention, write_decode_kv

def rotate(x, cos, sin):  # HF's apply_rotary_pos_emb on one tensor, in float32
    half = x.shape[-1] // 2
    x, cos, sin = x.float(), cos.float(), sin.float()
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

def rope_errors(device, dtype):
    \"\"\"The rotary inside the KV write and the attention against HF's rotary before them,
    on strided q/k/v views of one projection's output and the model's tables of rows at
    different positions (``[B, 1, D]``, as ``apply_rotary_pos_emb`` gets them).\"\"\"
    gen = torch.Generator().manual_seed(0)
    errors = {}
    for rows, kv_heads, groups, dim in [(3, 2, 8, 16), (2, 3, 3, 64), (5, 2, 8, 128)]:
        window = 90
        positions = torch.randint(0, window, (rows,), generator=gen)
        inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), -1)[:, None, :]
        cos, sin = emb.cos().to(device, dtype), emb.sin().to(device, dtype)
        heads = kv_heads * groups
        qkv = torch.randn(rows, 1, (heads + 2 * kv_heads) * dim, generator=gen).to(device, dtype)
        q = qkv[..., :heads * dim].view(rows, 1, heads, dim).transpose(1, 2)
        k, v = (qkv[..., (heads + i * kv_heads) * dim:(heads + (i + 1) * kv_heads) * dim]
                .view(rows, 1, kv_heads, dim).transpose(1, 2) for i in (0, 1))
        cache = torch.randn(2, rows + 1, kv_heads, window, dim, generator=gen).to(device, dtype)
        fused, want = cache.clone(), cache.clone()
        positions = positions.to(device)
        write_decode_kv(fused, positions, k, v, rope=(cos, sin))
        write_decode_kv(want, positions, rotate(k, cos[:, None], sin[:, None]).to(dtype), v)
        lengths = (positions + 1).to(torch.int32)
        got = decode_attention(q.reshape(rows, kv_heads, groups, dim), fused[0, :rows],
                               fused[1, :rows], lengths, dim**-0.5, rope=(cos, sin))
        q_rot = rotate(q, cos[:, None], sin[:, None]).to(dtype)
        ref = decode_attention(q_rot.reshape(rows, kv_heads, groups, dim), want[0, :rows],
                               want[1, :rows], lengths, dim**-0.5)
        case = f"{rows}x{kv_heads}x{groups}x{dim}"
        errors[f"kv {case}"] = (fused.float() - want.float()).abs().max().item()
        errors[f"attention {case}"] = (got.float() - ref.float()).abs().max().item()
    return errors
"""


@interpreted
def test_the_rotary_inside_the_kv_write_and_attention_matches_hf() -> None:
    """``fuse`` kind ``rope``: the key rotated on its way into the cache and the query inside
    the attention give what HF's rotary before them gives (float32, the interpreter)."""

    result = _interpreted(_ROPE + """
import json
print(json.dumps(rope_errors("cpu", torch.float32)))
""")
    assert len(result) == 6
    assert all(error < 1e-5 for error in result.values()), result


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_rotary_inside_the_kernels_matches_hf() -> None:
    namespace: dict = {}
    exec(_ROPE, namespace)
    errors = namespace["rope_errors"]("cuda", torch.bfloat16)
    assert len(errors) == 6
    assert all(error < 3e-2 for error in errors.values()), errors  # bfloat16 roundings


_ONE_KERNEL = _ROPE + """
SHAPES = [(3, 2, 8, 16, 150), (2, 3, 3, 64, 70), (6, 2, 8, 128, 200)]

def one_kernel_errors(device, dtype, shapes=SHAPES, repeats=1):
    \"\"\"``fuse`` kind ``attn``: the attention writing the step's K/V itself and merging its
    own chunks against the KV-write kernel and the merge kernel (rotary on and off; one chunk,
    three, the default), bit for bit; the semaphores left zero. ``repeats`` runs the same
    step again on fresh copies (races between the programs of a GPU).\"\"\"
    gen = torch.Generator().manual_seed(1)
    errors = {}
    for rows, kv_heads, groups, dim, window in shapes:
        positions = torch.randint(0, window, (rows,), generator=gen)
        positions[0] = 0
        inv_freq = 1.0 / 10000 ** (torch.arange(0, dim, 2).float() / dim)
        emb = torch.cat([positions[:, None].float() * inv_freq] * 2, -1)[:, None, :]
        tables = (emb.cos().to(device, dtype), emb.sin().to(device, dtype))
        heads = kv_heads * groups
        qkv = torch.randn(rows, 1, (heads + 2 * kv_heads) * dim, generator=gen).to(device, dtype)
        q = qkv[..., :heads * dim].view(rows, 1, heads, dim).transpose(1, 2).reshape(
            rows, kv_heads, groups, dim)
        k, v = (qkv[..., (heads + i * kv_heads) * dim:(heads + (i + 1) * kv_heads) * dim]
                .view(rows, 1, kv_heads, dim).transpose(1, 2) for i in (0, 1))
        cache = torch.randn(2, rows + 1, kv_heads, window, dim, generator=gen).to(device, dtype)
        positions = positions.to(device)
        lengths = (positions + 1).to(torch.int32)
        semaphores = torch.zeros(rows * kv_heads, dtype=torch.int32, device=device)
        for rope in (None, tables):
            for splits in (1, 3, None):
                want = cache.clone()
                write_decode_kv(want, positions, k, v, rope=rope)
                ref = decode_attention(q, want[0, :rows], want[1, :rows], lengths, dim**-0.5,
                                       rope=rope, splits=splits)
                case = f"{rows}x{kv_heads}x{groups}x{dim}/{rope is not None}/{splits}"
                errors[f"written {case}"] = (want != cache).any().item()
                for _ in range(repeats):
                    got_kv = cache.clone()
                    got = decode_attention(q, got_kv[0, :rows], got_kv[1, :rows], lengths,
                                           dim**-0.5, rope=rope, splits=splits, new_kv=(k, v),
                                           one_kernel=True, semaphores=semaphores)
                    errors[f"kv {case}"] = max(errors.get(f"kv {case}", 0.0), (
                        got_kv.float() - want.float()).abs().max().item())
                    errors[f"out {case}"] = max(errors.get(f"out {case}", 0.0), (
                        got.float() - ref.float()).abs().max().item())
                errors[f"semaphores {case}"] = int(semaphores.abs().sum())
    return errors
"""


def _check_one_kernel(errors: dict, shapes: int = 3) -> None:
    assert len(errors) == shapes * 2 * 3 * 4, len(errors)
    for case, error in errors.items():
        if case.startswith("written"):
            assert error is True, case  # the reference did write: the comparison can fail
        else:
            assert error == 0, (case, error)


@interpreted
def test_the_attention_writes_the_new_kv_and_merges_its_chunks_itself() -> None:
    result = _interpreted(_ONE_KERNEL + """
import json
print(json.dumps(one_kernel_errors("cpu", torch.float32)))
""")
    _check_one_kernel(result)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_attention_writes_the_new_kv_and_merges_its_chunks_itself() -> None:
    namespace: dict = {}
    exec(_ONE_KERNEL, namespace)
    # and Qwen2.5-3B's heads at batch 64 over 1024 positions: many programs a row and head
    shapes = [*namespace["SHAPES"], (64, 2, 8, 128, 1024)]
    _check_one_kernel(namespace["one_kernel_errors"]("cuda", torch.bfloat16, shapes, 20),
                      len(shapes))


def test_rope_and_attn_are_left_off_without_the_kernels_that_take_them_over(
        tiny_test_model: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``rope`` and ``attn`` without the split-K attention would leave the rotary and the KV
    write undone, ``sample`` without Triton on the device could not run: the runner turns
    them off, says so, and the model decodes with HF's rotary, the index_put write and the
    torch sampler."""

    from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine.from_pretrained(str(tiny_test_model), EngineConfig(
        device="cpu", dtype="float32", max_batch_size=2, max_model_len=64,
        fuse="norm+rope+attn+sample")).start()
    try:
        assert not any("rotary" in f or "kv write" in f for f in engine.runner.fusions), (
            engine.runner.fusions)
        assert engine.runner.cache.decode_write == "index_put"
        assert "fuse kind 'rope' left off" in caplog.text
        assert "fuse kind 'attn' left off" in caplog.text
        assert "fuse kind 'sample' left off" in caplog.text and not engine.runner.fused_sampling
        out = engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0,
                                                           ignore_eos=True)).result(60)
        assert len(out.outputs[0].token_ids) == 4
    finally:
        engine.shutdown()


def test_splits_fill_the_gpu_within_whole_blocks() -> None:
    assert num_splits(rows=64, kv_heads=2, window=768, programs=528) == 5
    assert num_splits(rows=1, kv_heads=2, window=768, programs=528) == 12  # 12 blocks of 64
    assert num_splits(rows=256, kv_heads=2, window=768, programs=528) == 2
    assert num_splits(rows=1, kv_heads=1, window=1 << 20, programs=528) == MAX_SPLITS
    assert num_splits(rows=4096, kv_heads=8, window=10, programs=528) == 1


def test_the_setting_names_a_kernel_that_can_run() -> None:
    assert resolve("auto", torch.device("cpu")) == "sdpa"
    assert resolve("auto", torch.device("cuda")) == "triton"  # measured faster on an H100
    assert resolve("matmul", torch.device("cpu")) == "matmul"
    with pytest.raises(ValueError, match="one of sdpa, matmul, triton"):
        resolve("flash", torch.device("cpu"))
    if os.environ.get("TRITON_INTERPRET") != "1":
        with pytest.raises(ValueError, match="needs a CUDA device"):
            resolve("triton", torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_bfloat16_matches_attention() -> None:
    from mcprl_inference.engine.decode_attention import decode_attention

    namespace: dict = {}
    exec(_REFERENCE, namespace)
    gen = torch.Generator().manual_seed(0)
    rows, kv_heads, groups, dim, window = 64, 2, 8, 128, 1024
    q, k, v = (torch.randn(shape, generator=gen).to("cuda", torch.bfloat16) for shape in (
        (rows, kv_heads, groups, dim), (rows, kv_heads, window, dim),
        (rows, kv_heads, window, dim)))
    lengths = torch.randint(1, window + 1, (rows,), generator=gen)
    got = decode_attention(q, k, v, lengths.to("cuda", torch.int32), dim**-0.5)
    want = namespace["reference"](q, k, v, lengths)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_kv_write_matches_index_put() -> None:
    namespace: dict = {}
    exec(_KV_WRITE, namespace)
    errors = namespace["kv_write_errors"]("cuda", torch.bfloat16)
    assert all(error == 0.0 for error in errors.values()), errors
