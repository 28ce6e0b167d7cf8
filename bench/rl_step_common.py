"""What both sides of bench_rl_step.py share: the workload, the model folder, the prompts,
the reward, the tool results, the GPU monitor and the per-step summary.

Both sides read the same model folder (config, weights, tokenizer) and the same prompts, so
they differ only in how a step is run. The tokenizer is a word-level one written here
(``t<id>`` per id): random prompt ids survive text -> ids exactly, which TRL needs (it takes
prompts as text), and no tokenizer has to be downloaded for the 3B shape. (Our engine and
trainer load it with AutoTokenizer, which makes a Qwen2Tokenizer of it: they send and read
token ids only, and use its pad and eos ids, which stay right.)
"""

from __future__ import annotations

import contextlib
import random
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = REPO / "models" / "tiny-test"
PAD_ID, EOS_ID = 0, 1  # the bench tokenizer's specials (both shapes)
FIRST_PROMPT_ID = 8  # prompt, tool and reward ids stay clear of the specials


@dataclass(frozen=True)
class Workload:
    """One RL step's work, the same for both sides."""

    shape: str  # "3b" | "tiny"
    variant: str  # "single" | "multiturn"
    prompts: int = 8
    rollouts: int = 8  # per prompt (GRPO's group size)
    prompt_tokens: int = 512
    new_tokens: int = 256  # sampled per rollout, over all its turns
    turns: int = 1
    tool_tokens: int = 100  # tool result appended after each turn but the last
    lora_r: int = 8
    lora_alpha: int = 16
    lr: float = 1e-5
    gradient_checkpointing: bool = True
    shared_prefix: bool = False  # ours: a micro-batch's common prompt runs once (exact grads)
    liger_kernels: bool = False  # ours: Liger's RMSNorm and SwiGLU kernels in the update
    seed: int = 0

    @property
    def turn_tokens(self) -> int:
        """Sampled tokens per turn: the rollout's ``new_tokens`` split over its turns."""

        return self.new_tokens // self.turns

    @property
    def sampled_tokens(self) -> int:
        return self.turn_tokens * self.turns

    @property
    def max_len(self) -> int:
        """Tokens of the longest sequence (prompt, turns, tool results in between)."""

        return self.prompt_tokens + self.sampled_tokens + self.tool_tokens * (self.turns - 1)

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "turn_tokens": self.turn_tokens,
                "sampled_tokens_per_rollout": self.sampled_tokens, "max_len": self.max_len,
                "rollouts_per_step": self.prompts * self.rollouts,
                "lora_target_modules": "all-linear", "eos": "ignored (every turn is full length)"}


def workload_for(shape: str, variant: str, **overrides: Any) -> Workload:
    """Defaults: the TRL anchor's workload (3b); a small one on the tiny model (CPU tests)."""

    base: dict[str, Any] = {"shape": shape, "variant": variant}
    if shape == "tiny":
        base.update(prompts=2, rollouts=4, prompt_tokens=32, new_tokens=16, tool_tokens=8,
                    lr=1e-3, gradient_checkpointing=False)
    if variant == "multiturn":
        base["turns"] = 4
    base.update({k: v for k, v in overrides.items() if v is not None})
    return Workload(**base)


# -- the model folder --------------------------------------------------------------------
def qwen_config(shape: str) -> Any:
    """The model's config: Qwen2.5-3B's shape, or the tiny test model's own config."""

    from transformers import AutoConfig, Qwen2Config

    if shape == "3b":
        from model_shapes import QWEN25_3B  # bench/, the script's own folder

        cfg = Qwen2Config(**QWEN25_3B)
    elif shape == "tiny":
        cfg = AutoConfig.from_pretrained(TINY_MODEL)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = PAD_ID, EOS_ID, None
    return cfg


def word_tokenizer(vocab_size: int) -> Any:
    """A tokenizer with one word per id (``t<id>``, plus ``<pad>`` and ``<eos>``)."""

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    del vocab[f"t{PAD_ID}"], vocab[f"t{EOS_ID}"]
    vocab.update({"<pad>": PAD_ID, "<eos>": EOS_ID})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                  unk_token="<pad>", padding_side="left")
    return tok


def build_model_dir(shape: str, out: Path, device: str) -> Path:
    """Write the model both sides load: random weights for 3b (bf16), the tiny test model's
    weights for tiny, and the word tokenizer. Kept when it is already there."""

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    cfg = qwen_config(shape)
    torch.manual_seed(0)
    if shape == "3b":
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_pretrained(TINY_MODEL, config=cfg)
    model.generation_config = GenerationConfig(eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(out)
    word_tokenizer(cfg.vocab_size).save_pretrained(out)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the engine, in its own process, needs the memory
    return out


# -- prompts, tool results, reward ---------------------------------------------------------
def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_PROMPT_ID, vocab) for _ in range(n)]


def step_prompts(work: Workload, step: int, vocab: int) -> list[list[int]]:
    """Step ``step``'s prompts (random ids; each side samples ``rollouts`` per prompt)."""

    rng = random.Random(f"{work.seed}/prompts/{step}")
    return [_ids(rng, work.prompt_tokens, vocab) for _ in range(work.prompts)]


def tool_result(work: Workload, prompt_ids: list[int], turn: int, vocab: int) -> list[int]:
    """The scripted tool result after ``turn``: ``tool_tokens`` ids fixed by the prompt and
    the turn, so both sides append the same ids."""

    rng = random.Random(f"{work.seed}/tool/{prompt_ids[:16]}/{turn}")
    return _ids(rng, work.tool_tokens, vocab)


def reward(completion_ids: list[int]) -> float:
    """Cheap and deterministic: the share of even ids among the completion's."""

    return sum(1 for t in completion_ids if t % 2 == 0) / max(len(completion_ids), 1)


def to_text(ids: list[int]) -> str:
    """Ids as the word tokenizer's text (its encoding gives the same ids back)."""

    return " ".join("<pad>" if i == PAD_ID else "<eos>" if i == EOS_ID else f"t{i}"
                    for i in ids)


# -- GPU figures ---------------------------------------------------------------------------
class GpuMonitor:
    """Device-wide GPU figures over time windows, for every process on the GPU (our engine
    runs in its own): used memory (``cudaMemGetInfo``) and busy time, from NVML's
    utilisation (the share of time a kernel ran), sampled every ``period_s``. No nvidia-smi
    needed; on a CPU, or without NVML, the figures are None."""

    def __init__(self, device: str, period_s: float = 0.05) -> None:
        import torch

        self.period_s = period_s
        self.cuda = device.startswith("cuda") and torch.cuda.is_available()
        self.samples: list[tuple[float, float, int]] = []  # (time, util share, used bytes)
        self.nvml: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.cuda:
            return
        self.index = torch.device(device).index or 0
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            pynvml.nvmlDeviceGetUtilizationRates(self.handle)
            self.nvml = pynvml

    def _poll(self) -> None:
        import torch

        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info(self.index)
            util = float("nan")
            if self.nvml is not None:
                with contextlib.suppress(Exception):
                    util = self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu / 100.0
            self.samples.append((time.perf_counter(), util, total - free))
            self._stop.wait(self.period_s)

    def start(self) -> GpuMonitor:
        if self.cuda:
            self._thread = threading.Thread(target=self._poll, name="gpu-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def window(self, t0: float, t1: float) -> dict[str, float | None]:
        """Busy seconds and peak used GiB between two ``time.perf_counter()`` readings."""

        rows = [s for s in self.samples if t0 <= s[0] <= t1]
        if not rows:
            return {"gpu_busy_seconds": None, "device_peak_gib": None}
        utils = [u for _, u, _ in rows if u == u]  # not NaN
        busy = statistics.mean(utils) * (t1 - t0) if utils else None
        return {"gpu_busy_seconds": None if busy is None else round(busy, 3),
                "device_peak_gib": round(max(m for *_, m in rows) / 2**30, 2)}

    @property
    def source(self) -> str | None:
        if not self.cuda:
            return None
        return "nvml utilisation x wall time" if self.nvml is not None else None


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


@contextlib.contextmanager
def timed(phases: dict[str, float], name: str, device: str) -> Iterator[None]:
    """Add the wall seconds of the block (GPU work finished) to ``phases[name]``."""

    t0 = time.perf_counter()
    try:
        yield
    finally:
        sync(device)
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0


def torch_peak_gib(device: str) -> float | None:
    import torch

    if not (device.startswith("cuda") and torch.cuda.is_available()):
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def summarise(steps: list[dict[str, Any]], warmup: int, tokens_per_step: int) -> dict[str, Any]:
    """The median over the steps after warm-up (and each step as measured)."""

    timed_steps = steps[warmup:] or steps
    seconds = [s["seconds"] for s in timed_steps]
    median = statistics.median(seconds) if seconds else None
    phases = sorted({k for s in timed_steps for k in s.get("phases", {})})
    busy = [s["gpu_busy_seconds"] for s in timed_steps if s.get("gpu_busy_seconds") is not None]
    peaks = [s["device_peak_gib"] for s in timed_steps if s.get("device_peak_gib") is not None]
    return {
        "seconds_per_step": None if median is None else round(median, 3),
        "seconds_best": None if not seconds else round(min(seconds), 3),
        "timed_steps": len(timed_steps),
        "phases_median": {p: round(statistics.median(s["phases"].get(p, 0.0)
                                                     for s in timed_steps), 3) for p in phases},
        "gpu_busy_seconds_median": round(statistics.median(busy), 3) if busy else None,
        "device_peak_gib": max(peaks) if peaks else None,
        "sampled_tokens_per_s": None if not median else round(tokens_per_step / median, 1),
        "steps": steps,
    }
