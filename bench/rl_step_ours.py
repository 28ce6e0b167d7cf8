"""Our side of bench_rl_step.py: the trainer's step, phase by phase, against our engine.

The engine runs as its own process (``python -m mcprl_inference`` on a free 127.0.0.1 port),
as in a deployment. Each step, in the trainer's order (mcprl_trainer.trainer):

1. ``rollout``: every rollout's turns go through the trainer's sampler
   (:class:`~mcprl_trainer.publish.AdapterPublisher`, one group per prompt, token ids in and
   out with the sampler's log-probs); each turn becomes a
   :class:`~mcprl_trainer.records.TurnRecord`, with the scripted tool result appended;
2. ``reward``: the bench's reward on each rollout's sampled ids, then the trainer's
   :func:`~mcprl_trainer.batch.build_step_batch` (group advantages, flattened token records);
3. ``update``: :meth:`~mcprl_trainer.update_group.UpdateGroup.step` (the GRPO loss, LoRA);
4. ``checkpoint``: :meth:`~mcprl_trainer.checkpoint_writer.CheckpointWriter.save`, as the
   trainer calls it: with ``background_checkpoints`` (the default) the phase is the adapter
   alone (and any wait for the previous write); the step's ``checkpoint_background_s`` is that
   step's optimizer/RNG/state write in the writer thread, off the step's wall time;
5. ``publish``: :meth:`AdapterPublisher.publish`: the engine loads the adapter and lists it;
   the next step's rollouts sample from it.

Around the rollout phase the bench scrapes the engine's /metrics: each step's ``engine`` dict
is where the rollout time went inside the engine (prefill, decode, the decode steps launched
ahead under async scheduling, with ``--engine-profile on`` on CUDA the decode forward vs
sampling device time) and ``rollout_other_s``, the rest (HTTP, scheduling, requests not there
yet). The profile syncs each decode step, which keeps async scheduling off: it finds where
time goes, and the step time to report is the one without it (the engine as served).
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rl_step_common import (
    GpuMonitor,
    Workload,
    reward,
    step_prompts,
    summarise,
    timed,
    tool_result,
    torch_peak_gib,
)

SERVED = "bench-base"
RUN = "rl-step"
# The engine's counters read around each rollout phase (/metrics sample -> JSON key).
ENGINE_COUNTERS = {
    "mcprl_inference_prefill_seconds_total": "prefill_s",
    "mcprl_inference_prefill_batches_total": "prefill_batches",
    "mcprl_inference_prefill_forwards_total": "prefill_forwards",
    "mcprl_inference_decode_seconds_total": "decode_s",
    "mcprl_inference_decode_steps_total": "decode_steps",
    "mcprl_inference_decode_tokens_total": "decode_tokens",
    "mcprl_inference_cuda_graph_captures_total": "graph_captures",
    "mcprl_inference_decode_forward_seconds_total": "decode_forward_s",
    "mcprl_inference_sample_seconds_total": "sample_s",
    "mcprl_inference_decode_ahead_steps_total": "ahead_steps",
}


def kv_cache_gib(work: Workload, cfg: Any, cuda: bool, max_len: int) -> float:
    """The engine's KV budget: every rollout at its full length, with room to spare (the
    default on CUDA would take 85% of the GPU, which the trainer shares)."""

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * (
        2 if cuda else 4)
    need = 1.5 * work.prompts * work.rollouts * max_len * per_token / 2**30
    return round(max(need, 8.0 if cuda else 0.25), 2)


def start_engine(work: Workload, model_dir: Path, device: str, log_path: Path,
                 profile: bool = False) -> tuple[Any, str]:
    """Our engine as a real process, healthy on a free loopback port; (process, URL).
    ``profile``: INFERENCE_PROFILE (decode forward vs sampling device time, a sync a step)."""

    from transformers import AutoConfig

    from mcprl_common.process import ServiceProcess, free_port

    cfg = AutoConfig.from_pretrained(model_dir)
    port = free_port()
    max_len = work.max_len + 16
    env = {
        "INFERENCE_PORT": str(port), "INFERENCE_HOST": "127.0.0.1",
        "INFERENCE_MODEL": str(model_dir), "INFERENCE_SERVED_MODEL_NAME": SERVED,
        "INFERENCE_DEVICE": device, "INFERENCE_MAX_MODEL_LEN": str(max_len),
        "INFERENCE_MAX_BATCH_SIZE": str(max(64, work.prompts * work.rollouts)),
        "INFERENCE_KV_CACHE_MEMORY_GB": str(kv_cache_gib(work, cfg, device.startswith("cuda"),
                                                         max_len)),
        "INFERENCE_LOG_LEVEL": "warning", "INFERENCE_SEED": str(work.seed),
        "INFERENCE_PROFILE": "true" if profile else "false",
        "PYTHONPATH": ":".join(sys.path),
    }
    proc = ServiceProcess("inference", [sys.executable, "-m", "mcprl_inference"], env=env,
                          health_url=f"http://127.0.0.1:{port}/healthz", log_path=log_path)
    return proc.start(timeout_s=600), f"http://127.0.0.1:{port}"


def run_config(work: Workload, model_dir: Path, engine_url: str, out: Path, device: str,
               micro_batch_tokens: int, background_checkpoints: bool = True,
               max_staleness: int = 0) -> Any:
    from mcprl_trainer.config import RunConfig

    return RunConfig.model_validate({
        "name": RUN, "seed": work.seed, "output_dir": str(out), "model": str(model_dir),
        "group_size": work.rollouts, "groups_per_step": work.prompts, "save_rollouts": False,
        "policy": {"base_url": f"{engine_url}/v1", "model": SERVED},
        "scenarios": {"dir": str(out), "set_id": "random-prompts"},
        "lora": {"r": work.lora_r, "alpha": work.lora_alpha, "target_modules": "all-linear"},
        "train": {"lr": work.lr, "device": device, "skip_zero_variance": False,
                  "micro_batch_tokens": micro_batch_tokens, "shared_prefix": work.shared_prefix,
                  "gradient_checkpointing": work.gradient_checkpointing,
                  "liger_kernels": work.liger_kernels, "max_staleness": max_staleness},
        "eval": {"every": 0}, "status": {"enabled": False},
        "background_checkpoints": background_checkpoints,
    })


async def engine_counters(http: Any, url: str) -> dict[str, float]:
    """The engine's own counters from its /metrics, keyed as in :data:`ENGINE_COUNTERS`."""

    from prometheus_client.parser import text_string_to_metric_families

    response = await http.get(f"{url}/metrics")
    response.raise_for_status()
    found = dict.fromkeys(ENGINE_COUNTERS.values(), 0.0)
    seen = set()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in ENGINE_COUNTERS:
                found[ENGINE_COUNTERS[sample.name]] += sample.value
                seen.add(sample.name)
    missing = sorted(set(ENGINE_COUNTERS) - seen)
    if missing:
        raise RuntimeError(f"engine /metrics lacks {missing}: an older engine?")
    return found


def engine_breakdown(before: dict[str, float], after: dict[str, float],
                     rollout_s: float) -> dict[str, float | int]:
    """Counter deltas over one rollout phase, plus the phase's time outside prefill and decode."""

    out: dict[str, float | int] = {}
    for key in ENGINE_COUNTERS.values():
        delta = after[key] - before[key]
        out[key] = round(delta, 3) if key.endswith("_s") else round(delta)
    out["rollout_other_s"] = round(rollout_s - (after["prefill_s"] - before["prefill_s"])
                                   - (after["decode_s"] - before["decode_s"]), 3)
    return out


def engine_median(rows: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Median of each ``engine`` key over the timed steps (as ``phases_median``)."""

    timed_rows = [r["engine"] for r in (rows[warmup:] or rows)]
    if not timed_rows:
        return {}
    return {k: round(statistics.median(r[k] for r in timed_rows), 3) for k in timed_rows[0]}


def _engine_line(e: dict[str, float | int]) -> str:
    return (f"engine: prefill {e['prefill_s']:.2f}s/{e['prefill_batches']} batches/"
            f"{e['prefill_forwards']} forwards, "
            f"decode {e['decode_s']:.2f}s/{e['decode_steps']} steps/{e['decode_tokens']} tok "
            f"(forward {e['decode_forward_s']:.2f}s, sample {e['sample_s']:.2f}s, "
            f"{e['ahead_steps']} launched ahead), "
            f"other {e['rollout_other_s']:.2f}s, graph captures {e['graph_captures']}")


async def _rollout(sampler: Any, model: str, prompt: list[int], work: Workload, vocab: int,
                   seed_parts: tuple[Any, ...], scenario: Any) -> Any:
    """One rollout: ``turns`` sampled turns, a tool result after each but the last."""

    from mcprl_common.wire import Trajectory
    from mcprl_trainer.records import RolloutResult, TokenRecord, TurnRecord, derive_seed

    started = time.perf_counter()
    record = TokenRecord(prompt_ids=list(prompt))
    context = list(prompt)
    for turn in range(work.turns):
        out = await sampler.complete(model, context, max_tokens=work.turn_tokens,
                                     temperature=1.0, seed=derive_seed(*seed_parts, turn),
                                     ignore_eos=True)
        appended = tool_result(work, prompt, turn, vocab) if turn < work.turns - 1 else []
        record.turns.append(TurnRecord(
            prompt_len=len(context), sampled_ids=out.token_ids,
            sampled_logprobs=out.logprobs, finish_reason=out.finish_reason, model=out.model,
            appended_ids=appended, seconds=out.seconds, policy_version=out.policy_version))
        context += out.token_ids + appended
    trajectory = Trajectory(messages=[{"role": "user", "content": "random prompt ids"}],
                            finish_reason="max_turns", num_turns=work.turns)
    return RolloutResult(scenario, trajectory, record, time.perf_counter() - started)


async def _group(publisher: Any, model: str, prompt: list[int], work: Workload, vocab: int,
                 step: int, index: int) -> Any:
    from mcprl_common.wire import Scenario
    from mcprl_trainer.groups import ScoredGroup

    scenario = Scenario(id=f"prompt-{step}-{index}", task=f"random prompt {step}/{index}")
    sampler = publisher.for_group()  # the group's rollouts on one replica (shared prefix)
    try:
        results = await asyncio.gather(*(
            _rollout(sampler, model, prompt, work, vocab, (work.seed, step, index, member),
                     scenario) for member in range(work.rollouts)))
    finally:
        sampler.release()
    return ScoredGroup(scenario, list(results))


async def _collect(publisher: Any, model: str, work: Workload, vocab: int, step: int,
                   http: Any, engine_url: str,
                   counters: dict[str, float] | None = None) -> dict[str, Any]:
    """One step's rollouts (every group at once) with the engine's counters around them
    (``counters``: read before, while the engine was idle)."""

    prompts = step_prompts(work, step, vocab)
    if counters is None:
        counters = await engine_counters(http, engine_url)
    # No device sync here (``timed`` has one): this process runs nothing on the GPU for
    # the rollouts, and overlapped, a sync would wait for the update running beside them.
    t0 = time.perf_counter()
    groups = await asyncio.gather(*(
        _group(publisher, model, p, work, vocab, step, i) for i, p in enumerate(prompts)))
    rollout_s = time.perf_counter() - t0
    # in the step's wall time (a few ms), in no phase
    engine = engine_breakdown(counters, await engine_counters(http, engine_url), rollout_s)
    return {"groups": groups, "rollout_s": rollout_s, "engine": engine}


async def _steps(work: Workload, config: Any, device: str, total: int, warmup: int,
                 monitor: GpuMonitor, engine_url: str) -> list[dict[str, Any]]:
    import httpx
    import torch

    from mcprl_trainer.batch import build_step_batch
    from mcprl_trainer.checkpoint_writer import CheckpointWriter
    from mcprl_trainer.engines import EnginePool
    from mcprl_trainer.groups import GroupBatch
    from mcprl_trainer.modeling import load_tokenizer
    from mcprl_trainer.overlap import Prefetch
    from mcprl_trainer.publish import AdapterPublisher
    from mcprl_trainer.recovery import RetryWindow
    from mcprl_trainer.update_group import UpdateGroup

    torch.manual_seed(work.seed)
    overlap = config.train.max_staleness > 0
    group = UpdateGroup(config)
    group.load(load_tokenizer(config.model).pad_token_id)
    vocab = group.model.get_input_embeddings().weight.shape[0]
    pool = EnginePool.from_urls(config.policy.engine_urls, timeout_s=config.policy.timeout_s)
    publisher = AdapterPublisher(pool, config, RetryWindow(window_s=30.0))
    model = config.served_base
    writer = CheckpointWriter(config.run_dir, background=config.background_checkpoints)
    http = httpx.AsyncClient(timeout=30.0)
    prefetch = Prefetch()  # the trainer's: one collection in flight, for a known step

    async def publish_then_collect(step: int, adapter: tuple[Path, int] | None
                                   ) -> dict[str, Any]:
        """The overlapped schedule's collection: publish the adapter it samples from
        (nothing else samples now), then collect, all off the update's critical path."""

        t0 = time.perf_counter()
        served = await publisher.publish(adapter[0], version=adapter[1]) if adapter else model
        published_s = time.perf_counter() - t0
        out = await _collect(publisher, served, work, vocab, step, http, engine_url)
        out["publish_s"] = round(published_s, 3)
        return out

    steps: list[dict[str, Any]] = []
    pending: tuple[Path, int] | None = None  # overlapped: the adapter the next collection serves
    try:
        for step in range(1, total + 1):
            phases: dict[str, float] = {}
            if device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            if prefetch.holds(step):  # sampled during the last update: wait for what is left
                t0 = time.perf_counter()
                with timed(phases, "rollout_wait", device):
                    collected = await prefetch.take()
            else:
                counters = await engine_counters(http, engine_url)  # the engine is idle here
                t0 = time.perf_counter()
                collected = await _collect(publisher, model, work, vocab, step, http,
                                           engine_url, counters)
                phases["rollout"] = collected["rollout_s"]
            groups = collected["groups"]
            if overlap:  # as the trainer: step k+1 samples version k-1. After the last
                # step too (never trained on), so that every timed step runs beside rollouts
                prefetch.start(step + 1, publish_then_collect(step + 1, pending))
            with timed(phases, "reward", device):
                for g in groups:
                    for r in g.results:
                        r.reward = reward([t for turn in r.tokens.turns
                                           for t in turn.sampled_ids])
                batch = GroupBatch(list(groups), rollout_seconds=collected["rollout_s"])
                step_batch = build_step_batch(batch, config.train, seed=work.seed, step=step,
                                              success_threshold=1.0)
            with timed(phases, "update", device):
                if overlap:  # off the event loop: the next step's rollouts go on meanwhile
                    metrics = await asyncio.to_thread(group.step, step_batch.samples)
                else:
                    metrics = group.step(step_batch.samples)
            with timed(phases, "checkpoint", device):
                ckpt = writer.save(step, group, group.trainer_state(), {"history": []})
            if overlap:
                pending = (ckpt.path, step)
            else:
                with timed(phases, "publish", device):
                    model = await publisher.publish(ckpt.path, version=step)
            t1 = time.perf_counter()
            sampled = sum(len(t.sampled_ids) for g in groups for r in g.results
                          for t in r.tokens.turns)
            first = groups[0].results[0].tokens.turns[0]
            row = {"step": step, "warmup": step <= warmup, "seconds": round(t1 - t0, 3),
                   "phases": {k: round(v, 3) for k, v in phases.items()},
                   "rollout_seconds": round(collected["rollout_s"], 3),
                   "sampled_tokens": sampled, "trained_tokens": int(metrics["train_tokens"]),
                   "sampled_with": first.model, "sampled_version": first.policy_version,
                   "loss": round(float(metrics.get("loss", 0.0)), 5),
                   "reward_mean": round(step_batch.metrics["reward_mean"], 4),
                   "trainer_peak_gib": torch_peak_gib(device), **monitor.window(t0, t1),
                   "engine": collected["engine"]}
            if "publish_s" in collected:  # overlapped: published before that collection
                row["publish_overlapped_s"] = collected["publish_s"]
            steps.append(row)
            print(f"ours step {step}/{total}: {row['seconds']:.2f}s {row['phases']} "
                  f"rollout {row['rollout_seconds']:.2f}s from version "
                  f"{row['sampled_version']} {_engine_line(collected['engine'])}",
                  file=sys.stderr, flush=True)
        writer.close()  # the last write's time is known once it is done
        for row in steps:
            row["checkpoint_background_s"] = round(
                writer.write_seconds.get(row["step"], 0.0), 3)
    finally:
        await prefetch.cancel()
        writer.close(raise_error=False)
        await http.aclose()
        await pool.aclose()
        group.close()
        del group
        gc.collect()
    return steps


def run_ours(work: Workload, model_dir: Path, device: str, steps: int, warmup: int,
             micro_batch_tokens: int, workdir: Path | None = None,
             background_checkpoints: bool = True, max_staleness: int = 0,
             engine_profile: bool = False) -> dict[str, Any]:
    """Start the engine, run ``warmup + steps`` steps, stop the engine; the side's JSON."""

    import torch

    tmp = tempfile.TemporaryDirectory(prefix="rl-step-ours-") if workdir is None else None
    out = Path(tmp.name) if tmp is not None else Path(workdir)  # type: ignore[arg-type]
    out.mkdir(parents=True, exist_ok=True)
    monitor = GpuMonitor(device).start()
    started = time.perf_counter()
    engine, url = start_engine(work, model_dir, device, out / "engine.log",
                               profile=engine_profile)
    engine_start_s = time.perf_counter() - started
    try:
        config = run_config(work, model_dir, url, out, device, micro_batch_tokens,
                            background_checkpoints, max_staleness)
        rows = asyncio.run(_steps(work, config, device, warmup + steps, warmup, monitor,
                                  url))
    except BaseException:
        tail = (out / "engine.log").read_text(errors="replace")[-3000:]
        print(f"engine log tail:\n{tail}", file=sys.stderr)
        raise
    finally:
        engine.stop()
        monitor.stop()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        if tmp is not None:
            tmp.cleanup()
    result = summarise(rows, warmup, work.prompts * work.rollouts * work.sampled_tokens)
    result.update({
        "what": "our engine (own process, HTTP) + the trainer's GRPO update, checkpoint and "
                "adapter publish, phase by phase",
        "engine_start_seconds": round(engine_start_s, 1),
        "micro_batch_tokens": micro_batch_tokens,
        "background_checkpoints": background_checkpoints,
        "max_staleness": max_staleness,
        "checkpoint_background_median_s": statistics.median(
            [r.get("checkpoint_background_s", 0.0) for r in rows[warmup:]] or [0.0]),
        "gpu_busy_source": monitor.source,
        "engine_median": engine_median(rows, warmup),
        "engine_profile": "INFERENCE_PROFILE on: each decode step syncs to time forward vs "
                          "sampling (CUDA only) and async scheduling is off: slower than "
                          "serving" if engine_profile else
                          "INFERENCE_PROFILE off: the engine as served (forward and sample "
                          "device times are 0)",
        "wall_seconds": round(time.perf_counter() - started, 1),
    })
    return result
