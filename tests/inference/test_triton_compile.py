"""The engine's Triton kernels compile for the GPUs they run on, with no GPU here.

The CPU tests run the kernels' arithmetic under Triton's interpreter, which never lowers
them; a kernel can pass there and still fail on a GPU in Triton's compiler, in ``ptxas``, or
at load time. Here the engine's own launch code (``sample_rows``, ``write_decode_kv``,
``decode_attention``) runs on CPU tensors shaped as the engine's decode steps for
Qwen2.5-3B and SmolLM2-135M, while Triton's active driver is one that reports an H100/H200
(``sm_90``) or an A100 (``sm_80``) and launches nothing (:mod:`mcprl_testing.triton_target`):
every launch goes down to a cubin through Triton's real pipeline and ``ptxas``, and must
keep to its registers (no spills) and to the target's shared memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

_SCRIPT = """
import json, sys
import torch
from mcprl_testing.triton_target import compile_only
from mcprl_inference.engine.decode_attention import (
    DEFAULT_CONFIG, decode_attention, num_splits, write_decode_kv)
from mcprl_inference.engine.sampling_kernel import sample_rows

arch = int(sys.argv[1])
ROWS, WINDOW, SMS = 64, 1024, 132  # a decode step of batch 64 on an H100's 132 SMs
SHAPES = {"qwen2.5-3b": (2, 8, 128, 151936), "smollm2-135m": (3, 3, 64, 49152)}
report = {"arch": arch, "launches": [], "splits": {}}
with compile_only(arch) as gpu:
    for name, (kv_heads, groups, dim, vocab) in SHAPES.items():
        logits = torch.randn(ROWS, vocab)
        for unit in (True, False):
            for top1 in (True, False):
                sample_rows(logits, torch.ones(ROWS), torch.zeros(ROWS, dtype=torch.bool),
                            torch.rand(ROWS, dtype=torch.float64), unit_temperature=unit,
                            top1=top1)
        dtype = torch.bfloat16
        kv = torch.zeros(2, ROWS, kv_heads, WINDOW, dim, dtype=dtype)
        query = torch.randn(ROWS, kv_heads, groups, dim, dtype=dtype)
        new = tuple(torch.randn(ROWS, kv_heads, 1, dim, dtype=dtype) for _ in range(2))
        rope = tuple(torch.randn(ROWS, 1, dim, dtype=dtype) for _ in range(2))
        lengths = torch.full((ROWS,), 700, dtype=torch.int32)
        splits = num_splits(ROWS, kv_heads, WINDOW, DEFAULT_CONFIG.programs_per_sm * SMS)
        report["splits"][name] = splits
        for rotary in (None, rope):  # fuse kinds kv (+ rope), then attn (+ rope)
            write_decode_kv(kv[0], lengths.long(), *new, rope=rotary)
            for attn in (False, True):
                decode_attention(query, kv[0, :, :, :, :], kv[1], lengths, dim**-0.5,
                                 splits=splits, rope=rotary, new_kv=new if attn else None,
                                 one_kernel=attn)
        # a float32 model: the IEEE path of the attention's dots
        decode_attention(query.float(), kv[0].float(), kv[1].float(), lengths, dim**-0.5,
                         splits=splits)
report["launches"] = [dict(launch.as_dict(), problems=launch.problems(arch))
                      for launch in gpu.launches]
print(json.dumps(report))
"""


def _compile_for(arch: int) -> dict:
    """The script above in a process of its own (Triton's active driver is global)."""

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_SCRIPT), str(arch)],
                          env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", [90, 80])
def test_every_engine_kernel_compiles_for_the_gpu_without_spills(arch: int) -> None:
    report = _compile_for(arch)
    launches = report["launches"]
    by_kernel: dict[str, list[dict]] = {}
    for launch in launches:
        by_kernel.setdefault(launch["kernel"], []).append(launch)
    assert set(by_kernel) == {"_chunk_kernel", "_draw_kernel", "_kv_write_kernel",
                              "_attention_chunk_kernel", "_attention_merge_kernel"}
    # 2 shapes x (4 sampler variants of 2 kernels, 2 KV writes, 4 + 1 attentions, 3 merges)
    assert len(launches) == 2 * (8 + 2 + 5 + 3)
    bad = [(launch["kernel"], launch["constexprs"], launch["problems"])
           for launch in launches if launch["problems"]]
    assert not bad, bad
    for launch in launches:
        assert 0 < launch["registers"] <= 255 and launch["num_warps"] >= 1
    # the attention's grid is the engine's: a program per (row, KV head, chunk), several
    # chunks a row at batch 64 on 132 SMs, so every SM has work
    assert report["splits"] == {"qwen2.5-3b": 5, "smollm2-135m": 3}
    chunks = {(launch["grid"][1], launch["grid"][2])
              for launch in by_kernel["_attention_chunk_kernel"]}
    assert chunks == {(2, 5), (3, 3)}
    sampler = {(launch["constexprs"]["UNIT_T"], launch["constexprs"]["TOP1"])
               for launch in by_kernel["_draw_kernel"]}
    assert len(sampler) == 4
    # the sampler's first pass: a program per (row, chunk of whole blocks of the vocabulary)
    chunked = {tuple(launch["grid"][:2]) for launch in by_kernel["_chunk_kernel"]}
    assert chunked == {(64, 30), (64, 24)}
