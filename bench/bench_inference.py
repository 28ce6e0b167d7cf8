"""Generated tokens/s: our engine vs plain ``model.generate``, side by side in one run (JSON).

CPU (default): the tiny models at batch 1/8/32. ``--engines ours,lora-merged,lora-unmerged``
adds our engine serving a LoRA adapter, merged into the weights and unmerged (the engine's
own LoRA branch, ``engine/lora_layers.py``). ``--fuse norm,norm+proj`` runs one engine per
fused-kernel setting, side by side, each on its own copy of the model, and
``--decode-attention sdpa,triton`` one per decode attention kernel (``engine/decode_attention.py``).
GPU (the H200 figures in bench/anchors.json)::

    python bench/bench_inference.py --device cuda --model-shape qwen2.5-3b

builds Qwen2.5-3B-Instruct's exact shape with random bf16 weights (no download), runs batch
1/16/64/256 with 512-token prompts and 256 sampled tokens each (eos ignored, as the anchors),
and prints next to each row the decode floor: one step must read the weights and the KV cache
once, at this device's copy bandwidth measured in the same run (bench/device_floor.py; the
anchors' H200 gave 4.24 TB/s, and each row also gives its share of that H200 floor). Each
engine gets one warm-up run of the same shape first (CUDA-graph capture, cuBLAS autotuning);
the timed run is the second. The engines take turns: the others sleep meanwhile (weights in
host memory, KV cache freed), so the GPU holds one engine's memory at a time.

Needs only torch + transformers (+ this repo's ``inference/src`` on the path, added here), so it
runs on a GPU box without the service's web stack.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "inference" / "src"))

import torch  # noqa: E402
from anchors import anchors  # noqa: E402  (bench/, the script's own folder)
from device_floor import copy_bandwidth, sync  # noqa: E402
from kernel_profile import kernel_profile  # noqa: E402
from model_shapes import QWEN25_3B  # noqa: E402

from mcprl_inference.engine import (  # noqa: E402
    EngineConfig,
    LLMEngine,
    SamplingParams,
    decode_attention,
    fusions,
)

# device-to-device copy, read + write bytes, measured on the anchors' H200 (the issue's floor)
H200_COPY_BYTES_PER_S = float(anchors()["device_copy_bytes_per_s"])
# --async-scheduling -> EngineConfig.async_scheduling (auto: on with CUDA)
ASYNC = {"auto": None, "on": True, "off": False}


def build_random_qwen(device: torch.device, dtype: torch.dtype, layers: int | None = None) -> Any:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**{**QWEN25_3B, **({"num_hidden_layers": layers} if layers else {})})
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval().requires_grad_(False)


def load_local(path: Path, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return model.eval().requires_grad_(False)


def prompts_for(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab - 10, (batch, length), generator=g).tolist()


def run_engine(engine: LLMEngine, prompts: list[list[int]], new_tokens: int,
               adapter: str | None = None) -> dict[str, Any]:
    st = engine.stats
    before = (st.decode_steps, st.decode_time_s, st.prefill_time_s, st.decode_forward_s,
              st.sample_s)
    sync(engine.device)
    t0 = time.perf_counter()
    futures = [engine.add_request(p, SamplingParams(max_tokens=new_tokens, temperature=1.0,
                                                    seed=i, ignore_eos=True), adapter)
               for i, p in enumerate(prompts)]
    outs = [f.result() for f in futures]
    sync(engine.device)
    wall = time.perf_counter() - t0
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = engine.stats.decode_steps - before[0]
    return {"tokens_per_s": round(generated / wall, 1), "wall_s": round(wall, 3),
            "generated_tokens": generated, "decode_steps": steps,
            "ms_per_decode_step": round(1000 * (engine.stats.decode_time_s - before[1])
                                        / max(steps, 1), 3),
            "prefill_s": round(engine.stats.prefill_time_s - before[2], 3),
            **({"ms_forward_per_step": round(1000 * (st.decode_forward_s - before[3])
                                             / max(steps, 1), 3),
                "ms_sample_per_step": round(1000 * (st.sample_s - before[4]) / max(steps, 1), 3)}
               if st.decode_forward_s else {})}


def run_generate(model: Any, prompts: list[list[int]], new_tokens: int,
                 device: torch.device) -> dict[str, Any]:
    ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(ids)
    model.set_attn_implementation("sdpa")
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0)
    sync(device)
    wall = time.perf_counter() - t0
    generated = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"tokens_per_s": round(generated / wall, 1), "wall_s": round(wall, 3),
            "generated_tokens": int(generated),
            "ms_per_decode_step": round(1000 * wall / new_tokens, 3)}


def decode_floor(model: Any, batch: int, context: int, kv_bytes_per_token: int,
                 bandwidth: float) -> dict[str, Any]:
    """One step reads the weights and the KV cache once: its time at ``bandwidth`` (this
    device's, measured in the run) and at the anchors' H200 rate (the issue's figure)."""

    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    kv = batch * context * kv_bytes_per_token
    step_s = (weights + kv) / bandwidth
    return {"ms_per_decode_step": round(1000 * step_s, 3),
            "tokens_per_s": round(batch / step_s, 1),
            "h200_ms_per_decode_step": round(1000 * (weights + kv) / H200_COPY_BYTES_PER_S, 3),
            "weights_gb": round(weights / 1e9, 2), "kv_gb": round(kv / 1e9, 2)}


def random_adapter(model: Any, rank: int, out: Path) -> Path:
    """A LoRA of ``rank`` on every linear layer with random (non-zero) A and B, as peft saves it."""

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    peft_model = get_peft_model(copy.deepcopy(model).float(), LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules="all-linear", init_lora_weights=False))
    peft_model.save_pretrained(out)
    return out


def lora_engines(model: Any, args: argparse.Namespace, make: Any, park: Any
                 ) -> dict[str, LLMEngine]:
    """One engine per requested LoRA mode and ``--fuse`` setting, each on its own copy of
    the model, serving a random adapter as ``policy`` (peft wraps the model it is given in
    place), parked once it holds it. Keys: the mode under the first setting,
    ``mode:fuse:setting`` under the others. Call it while ``model`` is on its device: an
    engine runs where its model's weights are."""

    modes = [e.removeprefix("lora-") for e in args.engines if e.startswith("lora-")]
    if not modes:
        return {}
    path = random_adapter(model, args.lora_rank, Path(tempfile.mkdtemp()) / "adapter")
    engines = {}
    for mode in modes:
        for i, setting in enumerate(args.fuse):
            key = mode if i == 0 else f"{mode}:fuse:{setting}"
            engines[key] = make(copy.deepcopy(model), lora_mode=mode, fuse=setting)
            engines[key].load_lora("policy", str(path)).result()
            park(engines[key])
    return engines


def bench_model(name: str, model: Any, device: torch.device, args: argparse.Namespace
                ) -> dict[str, Any]:
    vocab = model.get_output_embeddings().weight.shape[0]
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else 0.0
    # The engines take turns: one at a time holds its KV cache and graphs (on a GPU its
    # weights too), the others sleep. Five 3B engines awake at batch 256 did not fit in an
    # H100's 80 GB.
    def park(eng: LLMEngine) -> LLMEngine:
        eng.sleep().result()
        return eng

    @contextlib.contextmanager
    def awake(eng: LLMEngine) -> Iterator[None]:
        eng.wake_up().result()
        try:
            yield
        finally:
            park(eng)

    def make(m: Any, **extra: Any) -> LLMEngine:
        if next(m.parameters()).device.type != device.type:  # an engine runs where m is
            raise RuntimeError(f"an engine's model copy is not on {device}")
        extra.setdefault("fuse", args.fuse[0])
        extra.setdefault("decode_attention", args.decode_attention[0])
        extra["async_scheduling"] = ASYNC[extra.get("async_scheduling",
                                                    args.async_scheduling[0])]
        return LLMEngine(m, None, EngineConfig(
            max_batch_size=max(args.batches),
            max_model_len=args.prompt_len + args.new_tokens + 16,
            cuda_graphs=not args.no_graphs, max_prefill_tokens=args.max_prefill_tokens,
            profile=args.profile, **extra)).start()

    # Copies first: an engine patches its model's norm modules in place. Which fusions and
    # decode attention kernel run is decided per engine, so the settings can share the
    # process (and the GPU, in turn). Rows: fuse:<setting>, attn:<kernel>, async:<on|off>.
    arms = ([("fuse", f) for f in args.fuse[1:]]
            + [("decode_attention", a) for a in args.decode_attention[1:]]
            + [("async_scheduling", a) for a in args.async_scheduling[1:]])
    prefix = {"fuse": "fuse", "decode_attention": "attn", "async_scheduling": "async"}
    copies = {f"{prefix[kind]}:{value}": (kind, value, copy.deepcopy(model))
              for kind, value in arms}
    loras = lora_engines(model, args, make, park)  # copies of ``model`` while it is on the GPU
    engine = park(make(model))
    fused = {name: park(make(m, **{kind: value})) for name, (kind, value, m) in copies.items()}
    profile = args.kernel_profile and device.type == "cuda"
    rows = []
    try:
        for batch in args.batches:
            prompts = prompts_for(batch, args.prompt_len, vocab, seed=batch)
            row: dict[str, Any] = {"batch": batch}
            profiles: dict[str, Any] = {}

            turns = ([("ours", engine, None)] if "ours" in args.engines else [])
            turns += [(label, e, None) for label, e in fused.items()]
            turns += [(f"lora-{mode}", e, "policy") for mode, e in loras.items()]
            for label, eng, adapter in turns:
                if eng is engine:
                    model.set_attn_implementation("mcprl_slots")
                with awake(eng):
                    first = run_engine(eng, prompts, args.new_tokens, adapter)  # compiles
                    row[label] = run_engine(eng, prompts, args.new_tokens, adapter)
                    if profile:
                        profiles[label] = decode_profile(eng, batch, args.prompt_len
                                                         + args.new_tokens // 2)
                row[label]["first_run_tokens_per_s"] = first["tokens_per_s"]
                if label in fused:
                    row[label]["fusions"] = eng.runner.fusions
                    row[label]["decode_attention"] = eng.runner.decode_kernel
                    row[label]["async_scheduling"] = eng.async_scheduling
            if "generate" in args.engines:
                with awake(engine):  # the first engine's model, on the GPU with it
                    run_generate(model, [p[:16] for p in prompts], 4, device)  # warm-up
                    row["generate"] = run_generate(model, prompts, args.new_tokens, device)
                    model.set_attn_implementation("mcprl_slots")
            if "ours" in row and "generate" in row:
                row["speedup_vs_generate"] = round(
                    row["ours"]["tokens_per_s"] / row["generate"]["tokens_per_s"], 2)
            if device.type == "cuda":
                floor = decode_floor(model, batch, args.prompt_len + args.new_tokens,
                                     engine.runner.cache.bytes_per_token, bandwidth)
                row["decode_floor"] = floor
                for key in ("ours", *fused):
                    if key in row:
                        step = row[key]["ms_per_decode_step"]
                        row[key]["share_of_floor_step"] = round(
                            floor["ms_per_decode_step"] / step, 3)
                        row[key]["share_of_h200_floor_step"] = round(
                            floor["h200_ms_per_decode_step"] / step, 3)
                if "ours" in row:
                    row["ours_share_of_floor_step"] = row["ours"]["share_of_floor_step"]
            if profiles:
                row["kernel_profile"] = profiles
            rows.append(row)
            print(json.dumps({"model": name, **row}), file=sys.stderr, flush=True)
    finally:
        engine.shutdown()
        for other in (*fused.values(), *loras.values()):
            other.shutdown()
    return {"model": name, "parameters": sum(p.numel() for p in model.parameters()),
            "copy_bandwidth_gbps": round(bandwidth / 1e9, 1),
            "graph_captures": engine.runner.graph_captures, "fusions": engine.runner.fusions,
            "rows": rows}


@torch.inference_mode()  # the engine's own tensors are inference tensors
def decode_profile(engine: LLMEngine, batch: int, position: int) -> dict[str, Any]:
    """Kernels of one decode step at ``batch`` rows, ``position`` tokens in: as the engine
    replays it (CUDA graph) and eager, straight through the idle engine's model runner."""

    runner = engine.runner
    tokens = torch.zeros(batch, dtype=torch.long, device=engine.device)
    positions = torch.full((batch,), position, dtype=torch.long, device=engine.device)
    key = engine.lora.graph_key()

    def step() -> None:
        runner.decode(tokens, positions, position, key)

    graphs = runner.use_graphs
    out = {}
    for label in (["graph"] if graphs else []) + ["eager"]:
        runner.use_graphs = label == "graph"
        try:
            step()  # capture or warm up at this attention length
            out[label] = kernel_profile(step, reps=10)
        finally:
            runner.use_graphs = graphs
    return out


def _fuse_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("--fuse takes one setting or more, comma-separated")
    for item in items:
        try:
            fusions.parse(item, "cpu")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return items


def _attention_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in items if x not in ("auto", *decode_attention.KERNELS)]
    if not items or unknown:
        raise argparse.ArgumentTypeError(
            f"--decode-attention takes auto or {', '.join(decode_attention.KERNELS)}, "
            "comma-separated")
    return items


def _async_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items or any(x not in ASYNC for x in items):
        raise argparse.ArgumentTypeError("--async-scheduling takes auto, on or off, "
                                         "comma-separated")
    return items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--model-shape", choices=["tiny", "qwen2.5-3b"], default=None,
                    help="tiny: models/tiny-test and models/tiny-learn (CPU default); "
                         "qwen2.5-3b: random weights of that shape (GPU default)")
    ap.add_argument("--model", action="append", default=None,
                    help="local model folder(s) instead of --model-shape")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=None)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--engines", default="ours,generate",
                    help="comma-separated: ours, generate, lora-merged, lora-unmerged (our "
                         "engine serving a random --lora-rank adapter on every linear layer)")
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--no-graphs", action="store_true", help="disable CUDA graphs (ablation)")
    ap.add_argument("--decode-attention", default="auto", type=_attention_list,
                    help="decode attention kernel: auto, sdpa, matmul, triton (split-K, "
                         "CUDA); a comma-separated list runs one engine per kernel, rows "
                         "'attn:<kernel>' after the first, with the first --fuse setting")
    ap.add_argument("--async-scheduling", default="auto", type=_async_list,
                    help="launch each decode step before the host reads the one before: "
                         "auto (on with CUDA), on, off; a comma-separated list runs one "
                         "engine per value, rows 'async:<value>' after the first")
    ap.add_argument("--max-prefill-tokens", type=int, default=None)
    ap.add_argument("--fuse", default="auto", type=_fuse_list,
                    help="fused decode kernels (mcprl_inference.engine.fusions): auto, none, "
                         "or kinds joined by '+' (norm, rotary, proj: norm+proj); a "
                         "comma-separated list runs one engine per "
                         "setting side by side, each on its own copy of the model ('ours' is "
                         "the first, the others are rows 'fuse:<setting>')")
    ap.add_argument("--profile", action="store_true",
                    help="CUDA: split ms per decode step into forward and sampling")
    ap.add_argument("--kernel-profile", action="store_true",
                    help="CUDA: per engine and batch, the kernels of one decode step by class "
                         "(bench/kernel_profile.py), replayed from its graph and eager")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--layers", type=int, default=None,
                    help="override the layer count of --model-shape qwen2.5-3b (smoke tests)")
    args = ap.parse_args()
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    shape = args.model_shape or ("qwen2.5-3b" if gpu else "tiny")
    args.batches = args.batches or ([1, 16, 64, 256] if gpu else [1, 8, 32])
    args.prompt_len = args.prompt_len or (512 if shape == "qwen2.5-3b" else 64)
    args.new_tokens = args.new_tokens or (256 if shape == "qwen2.5-3b" else 64)
    args.engines = args.engines.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if gpu else torch.float32
    results = []
    if args.model:
        for path in args.model:
            results.append(bench_model(path, load_local(Path(path), device, dtype), device, args))
    elif shape == "qwen2.5-3b":
        model = build_random_qwen(device, dtype, args.layers)
        results.append(bench_model("qwen2.5-3b-shape-random", model, device, args))
    else:
        for name in ("tiny-test", "tiny-learn"):
            model = load_local(REPO / "models" / name, device, dtype)
            results.append(bench_model(name, model, device, args))
            del model
            gc.collect()
    import transformers

    report = {
        "bench": "inference_generation_throughput",
        "device": torch.cuda.get_device_name(device) if gpu else platform.processor() or "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "threads": torch.get_num_threads(), "dtype": str(dtype).replace("torch.", ""),
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "sampling": "T=1.0",
        "cuda_graphs": gpu and not args.no_graphs, "fuse": args.fuse,
        "decode_attention": args.decode_attention,
        "async_scheduling": args.async_scheduling, "results": results,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
