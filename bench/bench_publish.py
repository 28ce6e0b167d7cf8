"""Publishing one step's adapter to the engine: through the run's checkpoint folder (the path
before ``publish_dir``) vs the tmpfs publish folder, and the bytes-in-the-request alternative,
side by side in one run (JSON, seconds, medians over ``--repeats`` interleaved rounds).

Trainer side (the step's critical path): ``gather`` (peft's LoRA state dict, to host
memory), ``serialise`` (safetensors, in memory), ``write`` (those bytes into the folder), and
the project's own calls: ``save_adapter`` (peft ``save_pretrained``, what
``UpdateGroup.save_adapter`` runs) into a fresh folder on the run volume, and
``PublishDir.stage`` (the same into the tmpfs folder, renamed into place, older versions
pruned). Engine side: ``read`` (safetensors from the folder), ``convert`` (the rest of
``read_adapter``: config checks, shapes, B scaled and transposed, the engine's dtype),
``copy_into_buffers`` (``LoraManager.activate``: the preallocated LoRA buffers), and
``load_and_activate`` (``LoraManager.load`` + ``activate``, what a ``/v1/load_lora_adapter``
runs). The ``bytes`` arm serialises to a bytes object (a request body) and parses it again;
the HTTP transfer of those bytes is not counted, so its figure is a lower bound.

Shape: Qwen2.5-3B (bench/model_shapes.py), LoRA r=8, alpha 16 on every linear layer, fp32 as
peft keeps it over a bf16 base (60 MB); the engine side in bf16, unmerged (its GPU mode). The
base weights are allocated and never written or read, by either side, so a CPU run needs
neither their time nor their memory. ``--e2e`` adds the whole publish over HTTP with the
tiny-test model (``make tiny-model``): our engine on loopback, ``AdapterPublisher.publish``
of each step's adapter from either folder, the ``/v1/models`` check included.

    .venv/bin/python bench/bench_publish.py                    # CPU, ~1 min
    python bench/bench_publish.py --device cuda --repeats 9    # a GPU: D2H and H2D counted
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _src in ("common", "inference", "trainer"):
    if str(ROOT / _src / "src") not in sys.path:
        sys.path.insert(1, str(ROOT / _src / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from model_shapes import QWEN25_3B  # noqa: E402

ADAPTER_FILE = "adapter_model.safetensors"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=7, help="rounds; medians are reported")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--layers", type=int, default=QWEN25_3B["num_hidden_layers"],
                   help="fewer than 36 for a quick check")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="the checkpoint folder's volume (default: a temporary folder in runs/)")
    p.add_argument("--publish-root", type=Path, default=Path("/dev/shm"))
    p.add_argument("--e2e", action=argparse.BooleanOptionalAction, default=True,
                   help="also the publish over HTTP with the tiny-test model")
    p.add_argument("--tiny-model", type=Path, default=ROOT / "models" / "tiny-test")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    return p.parse_args(argv)


def fs_type(path: Path) -> str:
    """The file system ``path`` is on (/proc/mounts' longest matching mount point)."""

    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    resolved = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) > 2 and (resolved == parts[1] or resolved.startswith(
                parts[1].rstrip("/") + "/")) and len(parts[1]) >= len(best):
            best, kind = parts[1], parts[2]
    return kind


def empty_model(device: str, layers: int, dtype: torch.dtype) -> torch.nn.Module:
    """Qwen2.5-3B's modules with uninitialised weights (allocated, never touched)."""

    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**{**QWEN25_3B, "num_hidden_layers": layers}))
    return model.to(dtype).to_empty(device=device).eval()


class PeftAdapter:
    """What ``PublishDir.stage`` saves through (``UpdateGroup.save_adapter``'s call)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def save_adapter(self, path: str) -> None:
        self.model.save_pretrained(str(path), selected_adapters=["default"])


def trainer_model(device: str, layers: int, rank: int) -> Any:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(empty_model(device, layers, torch.bfloat16), LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # a trained adapter (peft starts B at zero)
                param.normal_(std=0.01)
    return model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def median(samples: list[float]) -> float:
    return round(statistics.median(samples), 4)


def bench_3b(args: argparse.Namespace, run_dir: Path, publish_root: Path) -> dict[str, Any]:
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import load, load_file, save

    from mcprl_inference.engine.lora import LoraManager
    from mcprl_inference.engine.lora_files import read_adapter
    from mcprl_trainer.publish_dir import PublishDir

    dev = args.device
    model = trainer_model(dev, args.layers, args.rank)
    saver = PeftAdapter(model)
    engine_model = empty_model(dev, args.layers, torch.bfloat16)
    manager = LoraManager(engine_model, max_loras=4, max_rank=args.rank, mode="unmerged")
    publish_dir = PublishDir(publish_root, "bench-publish")
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    param = next(engine_model.parameters())
    s: dict[str, list[float]] = {}

    def add(key: str, seconds: float) -> None:
        s.setdefault(key, []).append(seconds)

    lora_bytes = 0
    try:
        for i in range(args.repeats):
            t, sd = timed(lambda: {k: v.detach().to("cpu").contiguous() for k, v in
                                   get_peft_model_state_dict(model, adapter_name="default")
                                   .items()}, dev)
            add("gather", t)
            t, blob = timed(lambda sd=sd: save(sd), dev)
            add("serialise", t)
            lora_bytes = len(blob)
            for arm, folder in (("checkpoint", checkpoints), ("publish_dir", publish_dir.folder)):
                target = folder / f"raw-{i}.safetensors"
                t, _ = timed(lambda target=target, blob=blob: target.write_bytes(blob), dev)
                add(f"{arm}.write", t)
                target.unlink()
            # The project's calls, each into a fresh folder as a step's save is.
            step = checkpoints / f".tmp-step-{i}"
            t, _ = timed(lambda step=step: saver.save_adapter(str(step)), dev)
            add("checkpoint.save_adapter", t)
            t, staged = timed(lambda i=i: publish_dir.stage(i, saver, checkpoints / f"s{i}"), dev)
            add("publish_dir.stage", t)
            for arm, folder in (("checkpoint", step), ("publish_dir", staged.path)):
                t, _ = timed(lambda folder=folder: load_file(folder / ADAPTER_FILE), dev)
                add(f"{arm}.read", t)
                t, _ = timed(lambda folder=folder: read_adapter(
                    str(folder), engine_model, max_rank=args.rank, dtype=param.dtype,
                    device=param.device), dev)
                add(f"{arm}.read_adapter", t)
                name = f"{arm}-{i}"
                t, _ = timed(lambda name=name, folder=folder: (
                    manager.load(name, str(folder)), manager.activate(name)), dev)
                add(f"{arm}.load_and_activate", t)
            manager.activate(f"checkpoint-{i}")  # a different adapter: the next is a copy
            t, _ = timed(lambda i=i: manager.activate(f"publish_dir-{i}"), dev)
            add("copy_into_buffers", t)
            for name in (f"checkpoint-{i}", f"publish_dir-{i}"):
                manager.unload(name)
            t, _ = timed(lambda blob=blob: load(blob), dev)
            add("bytes.parse", t)
            shutil.rmtree(step)
    finally:
        publish_dir.close()

    m = {k: median(v) for k, v in s.items()}
    out: dict[str, Any] = {"lora_bytes": lora_bytes, "samples": {k: [round(x, 4) for x in v]
                                                                  for k, v in s.items()}}
    for arm in ("checkpoint", "publish_dir"):
        convert = max(0.0, m[f"{arm}.read_adapter"] - m[f"{arm}.read"])
        save_call = m["checkpoint.save_adapter" if arm == "checkpoint" else "publish_dir.stage"]
        out[arm] = {
            "trainer": {"gather": m["gather"], "serialise": m["serialise"],
                        "write": m[f"{arm}.write"],
                        ("save_adapter" if arm == "checkpoint" else "stage"): save_call},
            "engine": {"read": m[f"{arm}.read"], "convert": round(convert, 4),
                       "copy_into_buffers": m["copy_into_buffers"],
                       "load_and_activate": m[f"{arm}.load_and_activate"]},
            "total": round(save_call + m[f"{arm}.load_and_activate"], 4),
        }
    convert = max(0.0, m["publish_dir.read_adapter"] - m["publish_dir.read"])
    out["bytes"] = {
        "trainer": {"gather": m["gather"], "serialise": m["serialise"]},
        "engine": {"parse": m["bytes.parse"], "convert": round(convert, 4),
                   "copy_into_buffers": m["copy_into_buffers"]},
        "total_without_transfer": round(m["gather"] + m["serialise"] + m["bytes.parse"]
                                        + convert + m["copy_into_buffers"], 4),
    }
    return out


def bench_e2e(args: argparse.Namespace, run_dir: Path, publish_root: Path) -> dict[str, Any]:
    """Save + publish over HTTP with the tiny-test model, through either folder."""

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mcprl_common.process import UvicornThread
    from mcprl_inference.app import create_app
    from mcprl_inference.settings import InferenceSettings
    from mcprl_trainer.config import RunConfig
    from mcprl_trainer.policy import PolicyClient
    from mcprl_trainer.publish import AdapterPublisher
    from mcprl_trainer.publish_dir import PublishDir
    from mcprl_trainer.recovery import RetryWindow

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(args.tiny_model, dtype=torch.float32)
    saver = PeftAdapter(get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                        target_modules="all-linear")))
    settings = InferenceSettings(model=str(args.tiny_model), device="cpu", max_model_len=256,
                                 kv_cache_memory_gb=0.1, log_json=False)
    s: dict[str, list[float]] = {}

    async def run(url: str) -> None:
        config = RunConfig.model_validate({
            "model": str(args.tiny_model), "output_dir": str(run_dir), "name": "e2e",
            "scenarios": {"dir": ".", "set_id": "none"}, "policy": {"base_url": url}})
        client = PolicyClient(url, max_retries=0)
        publish_dir = PublishDir(publish_root, "bench-publish-e2e")
        retry = RetryWindow(window_s=5.0)
        old = AdapterPublisher(client, config, retry)
        new = AdapterPublisher(client, config, retry, publish_dir=publish_dir)
        checkpoints = run_dir / "e2e" / "checkpoints"
        try:
            for i in range(args.repeats):
                ckpt = checkpoints / f"step-{i}"
                t0 = time.perf_counter()
                saver.save_adapter(str(ckpt))
                t1 = time.perf_counter()
                await old.publish(ckpt, version=i)
                t2 = time.perf_counter()
                publish_dir.stage(i, saver, checkpoints / f"staged-{i}")
                t3 = time.perf_counter()
                await new.publish(checkpoints / f"staged-{i}", version=i)
                t4 = time.perf_counter()
                for key, seconds in (("checkpoint.save", t1 - t0), ("checkpoint.publish", t2 - t1),
                                     ("publish_dir.save", t3 - t2),
                                     ("publish_dir.publish", t4 - t3)):
                    s.setdefault(key, []).append(seconds)
        finally:
            publish_dir.close()
            await client.aclose()

    with UvicornThread(create_app(settings)) as server:
        asyncio.run(run(f"{server.url}/v1"))
    m = {k: median(v) for k, v in s.items()}
    return {arm: {"save": m[f"{arm}.save"], "publish": m[f"{arm}.publish"],
                  "total": round(m[f"{arm}.save"] + m[f"{arm}.publish"], 4)}
            for arm in ("checkpoint", "publish_dir")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    owned = args.run_dir is None
    if owned:  # where runs live: the checkpoint folder's volume
        (ROOT / "runs").mkdir(exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix="bench-publish-", dir=ROOT / "runs"))
    else:
        run_dir = args.run_dir
    publish_root = args.publish_root
    t0 = time.perf_counter()
    try:
        result: dict[str, Any] = {
            "bench": "publish", "device": args.device,
            "shape": f"qwen2.5-3b, {args.layers} layers, LoRA r={args.rank} on all linears",
            "repeats": args.repeats,
            "folders": {"checkpoint": [str(run_dir), fs_type(run_dir)],
                        "publish_dir": [str(publish_root), fs_type(publish_root)]},
            "seconds": bench_3b(args, run_dir, publish_root),
        }
        if args.e2e:
            result["e2e_tiny_test_seconds"] = bench_e2e(args, run_dir, publish_root)
    finally:
        if owned:
            shutil.rmtree(run_dir, ignore_errors=True)
    result["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                         "torch": torch.__version__, "threads": args.threads,
                         "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda")
                         else None}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
