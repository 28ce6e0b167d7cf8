"""The training run, in named stages per step: rollout (+ judge, overlapped) -> advantages ->
train -> checkpoint -> publish -> (eval). Resumable from the latest checkpoint; with
``background_checkpoints`` only the adapter is written before publishing, the rest of the
checkpoint while the next step runs (:mod:`mcprl_trainer.checkpoint_writer`).

Step numbers are 1-based; ``checkpoints/step-N`` is the state *after* step N. The scenarios
and sampling seeds of step N depend only on ``(seed, N)``, so a resumed run continues exactly
where the crashed one stopped.

With ``train.max_staleness = 1`` the next step's rollouts are collected while this step's
update runs (in a worker thread, so the event loop keeps sampling), and a new adapter is
published only between two collections (:mod:`mcprl_trainer.overlap`): step N trains on
rollouts from ``checkpoints/step-(N-2)``'s adapter (the base or warm start for N <= 2), a
schedule a resumed run follows too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from mcprl_trainer.batch import build_step_batch
from mcprl_trainer.checkpoint import (
    Checkpoint,
    checkpoints_dir,
    clean_temporaries,
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    prune_checkpoints,
    restore_rng,
)
from mcprl_trainer.checkpoint_writer import CheckpointWriter
from mcprl_trainer.config import RunConfig, save_config
from mcprl_trainer.distributed import DistContext
from mcprl_trainer.engines import EnginePool
from mcprl_trainer.evaluate import evaluate
from mcprl_trainer.groups import GroupRunner, McpTarget, ScoredGroup
from mcprl_trainer.html_report import update_report_safely
from mcprl_trainer.judge_client import JudgeClient
from mcprl_trainer.metrics import TrainerMetrics
from mcprl_trainer.modeling import load_tokenizer
from mcprl_trainer.overlap import CollectedBatch, Prefetch, sample_version, staleness
from mcprl_trainer.publish import AdapterPublisher, engine_asleep
from mcprl_trainer.publish_dir import PublishDir, open_publish_dir
from mcprl_trainer.records import RolloutResult
from mcprl_trainer.recovery import RetryWindow
from mcprl_trainer.rendering import ChatRenderer
from mcprl_trainer.report import write_report
from mcprl_trainer.rollout import RolloutSettings
from mcprl_trainer.run_files import (
    eval_rollouts_path,
    rollout_rows,
    train_rollouts_path,
    write_jsonl,
)
from mcprl_trainer.scenarios import ScenarioSplits, load_scenarios, step_scenarios
from mcprl_trainer.status import RunStatus, start_status_server
from mcprl_trainer.update_group import UpdateGroup

log = logging.getLogger(__name__)


class RunExistsError(RuntimeError):
    """The run directory already has checkpoints and --resume was not given."""


class Progress(Protocol):
    """How the run shows progress (rich bars in the CLI, nothing in tests)."""

    def phase(self, name: str, total: int | None = None) -> None: ...
    def advance(self) -> None: ...
    def step_done(self, line: str) -> None: ...


class NoProgress:
    def phase(self, name: str, total: int | None = None) -> None:
        pass

    def advance(self) -> None:
        pass

    def step_done(self, line: str) -> None:
        log.info(line)


@dataclass
class RunOutcome:
    steps_done: int
    stopped_early: bool
    report: dict[str, Path]


def step_line(step: int, total: int, m: dict[str, float]) -> str:
    """One compact log line per step."""

    return (f"step {step}/{total} | reward {m.get('reward_mean', 0):.3f}±"
            f"{m.get('reward_std', 0):.3f} | succ {m.get('success_rate', 0):.2f} | groups "
            f"{int(m.get('groups_trained', 0))}/{int(m.get('groups_total', 0))} "
            f"(zero-var {int(m.get('groups_zero_variance', 0))}, failed "
            f"{int(m.get('groups_failed', 0))}) | loss {m.get('loss', 0):+.4f} kl "
            f"{m.get('kl', 0):.4f} clip {m.get('clip_fraction', 0):.3f} | tok/s roll "
            f"{m.get('rollout_tokens_per_s', 0):.0f} train {m.get('train_tokens_per_s', 0):.0f} | "
            f"{m.get('step_seconds', 0):.1f}s (roll {m.get('rollout_seconds', 0):.1f} judge "
            f"{m.get('judge_seconds', 0):.1f} train {m.get('train_seconds', 0):.1f})")


class Trainer:
    def __init__(self, config: RunConfig, *, resume: bool = False,
                 stop: threading.Event | None = None, progress: Progress | None = None,
                 metrics: TrainerMetrics | None = None,
                 dist: DistContext | None = None) -> None:
        self.config = config
        self.group = UpdateGroup(config, dist)  # the policy, on every rank of the trainer group
        self.resume = resume
        self.stop = stop or threading.Event()
        self.progress = progress or NoProgress()
        self.metrics = metrics or TrainerMetrics()
        self.run_dir = config.run_dir
        self.status = RunStatus(config.name, config.steps)
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.current_model = config.served_base
        self.version = 0  # the policy version of the trainer's weights (mcprl_trainer.overlap)
        self.served_version = 0  # the one rollouts sample from now
        self.checkpoints = CheckpointWriter(self.run_dir, background=config.background_checkpoints,
                                            on_written=self.metrics.observe_checkpoint_write)
        self.publish_dir: PublishDir | None = None  # set by run() (mcprl_trainer.publish_dir)

    # -- setup ---------------------------------------------------------------------------------
    def _prepare_dir(self) -> Checkpoint | None:
        clean_temporaries(self.run_dir)
        latest = latest_checkpoint(self.run_dir)
        if latest is not None and not self.resume:
            raise RunExistsError(f"{self.run_dir} has checkpoints (latest step {latest.step}); "
                                 "pass --resume to continue it or choose another run name")
        save_config(self.config, self.run_dir)
        return latest if self.resume else None

    def _rollout_settings(self, eval_mode: bool = False) -> RolloutSettings:
        temperature = self.config.eval.temperature if eval_mode else None
        return RolloutSettings.from_config(self.config.rollout, temperature=temperature)

    def _write_jsonl(self, name: str, rows: list[dict[str, Any]]) -> None:
        write_jsonl(self.run_dir / name, rows)

    def _save_rollouts(self, path: Path, step: int, groups: list[ScoredGroup]) -> None:
        if self.config.save_rollouts:
            write_jsonl(path, rollout_rows(step, groups))

    def _on_rollout(self, result: RolloutResult) -> None:
        self.metrics.observe_rollout(result.seconds, result.trajectory.finish_reason,
                                     result.tool_errors, [t.seconds for t in result.tokens.turns])
        self.progress.advance()

    # -- stages ----------------------------------------------------------------------------------
    async def _eval(self, runner: GroupRunner, splits: ScenarioSplits, step: int) -> None:
        val = splits.val[: self.config.eval.max_scenarios] if self.config.eval.max_scenarios \
            else splits.val
        if not val:
            log.warning("no val scenarios: eval skipped")
            return
        self.status.update(phase="eval")
        self.progress.phase(f"eval @ step {step}", len(val))
        result = await evaluate(runner, val, step=step, model=self.current_model,
                                settings=self._rollout_settings(eval_mode=True),
                                seed=self.config.seed, threshold=self.config.eval.success_threshold,
                                samples=self.config.eval.samples)
        row = result.as_dict()
        self.evals = [e for e in self.evals if e["step"] != step] + [row]
        self._write_jsonl("evals.jsonl", self.evals)
        self._save_rollouts(eval_rollouts_path(self.run_dir, step), step, result.groups)
        update_report_safely(self.run_dir, evals=[step])
        self.metrics.observe_eval(result.stats.success_rate, result.stats.mean_reward)
        self.status.update(last_eval=row)
        self.progress.step_done(
            f"eval @ step {step}: success {row['success_rate']:.3f} reward "
            f"{row['mean_reward']:.3f} turns {row['mean_turns']:.2f} tool errors "
            f"{row['tool_error_rate']:.3f} (n={row['n']})")

    def _eval_due(self, step: int, last: bool = False) -> bool:
        every = self.config.eval.every
        return every > 0 and (step == 0 or step % every == 0 or step == self.config.steps
                              or last)

    def _state(self) -> dict[str, Any]:
        return {"history": self.history, "evals": self.evals,
                "served_model": self.current_model}

    # -- policy versions (see mcprl_trainer.overlap) ----------------------------------------
    def _version_path(self, version: int) -> Path | None:
        """The adapter of a policy version: a checkpoint's, the warm start, None = the base."""

        if version == 0:
            return self.config.lora.init_adapter
        return checkpoints_dir(self.run_dir) / f"step-{version}"

    def _available_versions(self) -> set[int]:
        steps = {c.step for c in list_checkpoints(self.run_dir)}
        return {0} | steps

    async def _serve(self, version: int, publisher: AdapterPublisher) -> None:
        """Make ``version`` the policy rollouts sample from (publishing its adapter)."""

        if version == self.served_version:
            return
        path = self._version_path(version)
        if path is None:
            self.current_model = self.config.served_base
        else:
            self.current_model = await publisher.publish(path, version=version)
        self.served_version = version

    async def _collect(self, step: int, version: int, runner: GroupRunner, splits: ScenarioSplits,
                       publisher: AdapterPublisher, *, show: bool = True) -> CollectedBatch:
        """Step ``step``'s scored groups, sampled from policy ``version``."""

        cfg = self.config
        await self._serve(version, publisher)
        scenarios = step_scenarios(splits.train, step, cfg.groups_per_step, cfg.seed)
        if show:
            self.progress.phase(f"step {step}/{cfg.steps} rollouts",
                                cfg.groups_per_step * cfg.group_size)
        model = self.current_model
        batch = await runner.run(scenarios, group_size=cfg.group_size, model=model,
                                 settings=self._rollout_settings(), seed_parts=(cfg.seed, step),
                                 on_rollout=self._on_rollout)
        return CollectedBatch(step, version, model, batch)

    # -- stages ----------------------------------------------------------------------------------
    async def _train_step(self, step: int, collected: CollectedBatch, t_step: float,
                          extra: dict[str, float], group: UpdateGroup,
                          publisher: AdapterPublisher) -> None:
        cfg = self.config
        overlap = cfg.train.max_staleness > 0
        batch = collected.batch
        if not batch.ok:
            raise RuntimeError(f"step {step}: every group failed ({batch.failed[0].error})")
        step_batch = build_step_batch(batch, cfg.train, seed=cfg.seed, step=step,
                                      success_threshold=cfg.eval.success_threshold)
        self._save_rollouts(train_rollouts_path(self.run_dir, step), step, batch.groups)
        m = dict(step_batch.metrics)
        m.update(extra)
        self.status.update(phase="train")
        self.progress.phase(f"step {step}/{cfg.steps} update", None)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t_train = time.perf_counter()
        async with engine_asleep(publisher.pool, cfg.sleep_engine_during_train):
            if overlap:  # off the event loop: the next step's rollouts go on meanwhile
                m.update(await asyncio.to_thread(group.step, step_batch.samples))
            else:
                m.update(group.step(step_batch.samples))
        m["train_seconds"] = time.perf_counter() - t_train
        if torch.cuda.is_available():
            m["gpu_memory_bytes"] = float(torch.cuda.max_memory_allocated())
        m["step"] = step
        m["sampled_with"] = collected.model  # type: ignore[assignment]
        m["policy_version"] = collected.version
        m["finish_reasons"] = step_batch.finish_reasons  # type: ignore[assignment]
        m["tool_errors"] = step_batch.tool_errors  # type: ignore[assignment]
        m["rollouts_retried"] = batch.rollouts_retried
        m["rollouts_dropped"] = batch.rollouts_dropped
        m["judge_retried"] = batch.judge_retried
        self.status.update(phase="publish")
        t_ckpt = time.perf_counter()
        self.history.append(m)
        staged = None
        if self.publish_dir is not None:  # the adapter to tmpfs; step-N gets it in background
            staged = self.publish_dir.stage(step, group,
                                            checkpoints_dir(self.run_dir) / f"step-{step}")
        ckpt = self.checkpoints.save(step, group, group.trainer_state(), self._state(),
                                     staged=staged)
        self.version = step
        t_pub = time.perf_counter()
        m["checkpoint_seconds"] = t_pub - t_ckpt  # the critical path (the adapter alone)
        m["checkpoint_wait_seconds"] = self.checkpoints.wait_seconds
        if not overlap:  # overlapped: published when no collection is in flight
            self.current_model = await publisher.publish(ckpt.path, version=step)
            self.served_version = step
        m["publish_seconds"] = time.perf_counter() - t_pub
        m["step_seconds"] = time.perf_counter() - t_step
        m["update_idle_share"] = max(0.0, 1.0 - m["train_seconds"] / m["step_seconds"])
        self._write_jsonl("metrics.jsonl", self.history)
        update_report_safely(self.run_dir, steps=[step])
        keep = cfg.keep_checkpoints
        if overlap and keep:  # the adapter still sampled from stays on disk
            keep = max(keep, 2)
        prune_checkpoints(self.run_dir, keep, cfg.keep_checkpoints_every)
        self.metrics.observe_step(step, m)
        self.status.update(last_step={k: v for k, v in m.items() if not isinstance(v, dict)})
        self.progress.step_done(step_line(step, cfg.steps, m))

    async def _run_steps(self, start: int, runner: GroupRunner, splits: ScenarioSplits,
                         group: UpdateGroup, publisher: AdapterPublisher) -> bool:
        """Steps ``start+1 .. steps``; True when a stop request ended them early. With
        overlap, the next step's rollouts run during this step's update (``prefetch``)."""

        cfg = self.config
        max_stale = cfg.train.max_staleness
        prefetch = Prefetch()
        deadline = (time.monotonic() + cfg.max_train_seconds
                    if cfg.max_train_seconds is not None else None)

        def out_of_time() -> bool:  # max_train_seconds spent: this step is the last
            return deadline is not None and time.monotonic() >= deadline

        try:
            for step in range(start + 1, cfg.steps + 1):
                if self.stop.is_set():
                    return True  # the prefetched batch is cancelled below, never trained on
                t_step = time.perf_counter()
                self.status.update(phase="rollout", step=step)
                if prefetch.holds(step):
                    collected = await prefetch.take()
                else:
                    version = sample_version(self.version, max_stale,
                                             self._available_versions())
                    collected = await self._collect(step, version, runner, splits, publisher)
                dropped = 0
                if staleness(self.version, collected) > max_stale:
                    dropped = 1
                    log.warning("stale rollout batch dropped", extra={
                        "step": step, "sampled_version": collected.version,
                        "trainer_version": self.version, "max_staleness": max_stale})
                    collected = await self._collect(step, self.version, runner, splits,
                                                    publisher)
                    if staleness(self.version, collected) > max_stale:
                        raise RuntimeError(f"step {step}: rollouts collected again from "
                                           f"version {self.version} report version "
                                           f"{collected.version}")
                extra = {"rollout_wait_seconds": time.perf_counter() - t_step,
                         "staleness": float(staleness(self.version, collected)),
                         "stale_batches_dropped": float(dropped)}
                if max_stale > 0 and step < cfg.steps and not out_of_time():
                    # Nothing samples now: publishing the trainer's version is safe.
                    prefetch.start(step + 1, self._collect(step + 1, self.version, runner,
                                                           splits, publisher, show=False))
                await self._train_step(step, collected, t_step, extra, group, publisher)
                last = out_of_time()
                if self._eval_due(step, last=last):
                    await prefetch.settle()  # the eval samples the new adapter alone
                    await self._serve(self.version, publisher)
                    await self._eval(runner, splits, step)
                    # Record the eval in the checkpoint, so a crash before it is redone on resume.
                    self.checkpoints.save(step, group, group.trainer_state(), self._state())
                if last and step < cfg.steps:
                    log.info("max_train_seconds spent: step %d is the last", step,
                             extra={"max_train_seconds": cfg.max_train_seconds})
                    return False
            return False
        finally:
            await prefetch.cancel()

    # -- the run -----------------------------------------------------------------------------
    async def run(self) -> RunOutcome:
        cfg = self.config
        latest = self._prepare_dir()
        server = None
        if cfg.status.enabled:
            server = start_status_server(self.status, self.metrics, cfg.status.host,
                                         cfg.status.port)
            self.status.update(status_url=server.url)
        self.metrics.total_steps.set(cfg.steps)
        pool = EnginePool.from_urls(
            cfg.policy.engine_urls, api_key=cfg.policy.api_key.get_secret_value(),
            timeout_s=cfg.policy.timeout_s, max_retries=cfg.policy.max_retries,
            backoff_s=cfg.policy.replica_backoff_s,
            backoff_max_s=cfg.policy.replica_backoff_max_s)
        self.metrics.watch_engines(pool)
        judge = JudgeClient(cfg.judge.url, timeout_s=cfg.judge.timeout_s, rubric=cfg.judge.rubric,
                            judge_model=cfg.judge.judge_model)
        retry = RetryWindow(window_s=cfg.retry.window_s, backoff_max_s=cfg.retry.backoff_max_s)
        self.publish_dir = open_publish_dir(cfg, distributed=self.group.dist.enabled)
        publisher = AdapterPublisher(
            pool, cfg, retry,
            on_retry=lambda _: self.metrics.service_retries.labels("engine").inc(),
            on_republish=self.metrics.adapter_republished.inc, publish_dir=self.publish_dir,
            on_loaded=lambda source: self.metrics.adapter_loads.labels(source).inc(),
            on_fallback=self.metrics.adapter_load_fallbacks.inc)
        stopped = False
        try:
            self.status.update(phase="loading")
            torch.manual_seed(cfg.seed)
            tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
            group = self.group
            group.load(tokenizer.pad_token_id, latest.path if latest else None,
                       latest.path if latest else None)
            start = 0
            if latest is not None:
                restore_rng(load_trainer_state(latest)["rng"])
                state = latest.state()
                self.history = [h for h in state.get("history", []) if h["step"] <= latest.step]
                self.evals = [e for e in state.get("evals", []) if e["step"] <= latest.step]
                start = self.version = latest.step
                self.current_model = await publisher.publish(latest.path, version=start)
                self.served_version = start
                log.info("resumed from %s (step %d done)", latest.path, start)
            elif cfg.lora.init_adapter is not None:  # step 0 samples the warm start
                self.current_model = await publisher.publish(cfg.lora.init_adapter, version=0)
                log.info("starting from adapter %s", cfg.lora.init_adapter)
            self._write_jsonl("metrics.jsonl", self.history)
            self._write_jsonl("evals.jsonl", self.evals)
            splits = await retry.call(
                lambda: load_scenarios(cfg.scenarios), what="loading the scenarios",
                on_retry=lambda _: self.metrics.service_retries.labels("scenario-gen").inc())
            runner = GroupRunner(
                sampler=publisher, renderer=ChatRenderer(tokenizer, cfg.model_format),
                mcp=McpTarget(cfg.mcp.url, cfg.mcp.auth_token.get_secret_value()
                              if cfg.mcp.auth_token else None, cfg.mcp.timeout_s),
                judge=judge, reward=cfg.reward, concurrency=cfg.rollout.concurrency,
                retry=retry, on_recovery=self.metrics.observe_recovery,
            )
            if self._eval_due(start) and not any(e["step"] == start for e in self.evals):
                await self._eval(runner, splits, start)
                if latest is not None:
                    self.checkpoints.save(start, group, group.trainer_state(), self._state())
            stopped = await self._run_steps(start, runner, splits, group, publisher)
            await asyncio.to_thread(self.checkpoints.close)  # the last checkpoint is complete
            await publisher.detach_publish_dir()  # engines list the checkpoint's copy
            self.status.update(phase="stopped" if stopped else "done")
            group.close()  # the followers return (after a failure torchrun stops them)
        except BaseException as exc:
            self.status.update(phase="failed", error=f"{type(exc).__name__}: {exc}")
            self.checkpoints.close(raise_error=False)  # a pending write still completes
            raise
        finally:
            if self.publish_dir is not None:
                self.publish_dir.close()
            await pool.aclose()
            await judge.aclose()
            if server is not None:
                server.stop()
        report = write_report(self.run_dir, config=cfg.model_dump(mode="json"),
                              history=self.history, evals=self.evals, stopped_early=stopped)
        steps_done = self.history[-1]["step"] if self.history else 0
        return RunOutcome(steps_done, stopped, report)
