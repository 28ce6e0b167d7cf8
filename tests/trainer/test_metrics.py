"""The trainer's labelled series are exported from the first scrape (a run that ends between
two Prometheus scrapes still leaves the series the dashboard's panels read)."""

from __future__ import annotations

from typing import get_args

from prometheus_client import generate_latest

from mcprl_common.wire import FinishReason
from mcprl_trainer.metrics import STEP_PHASES, TOOL_ERROR_KINDS, TrainerMetrics


def test_phase_gauges_exist_before_the_first_step_and_follow_it() -> None:
    metrics = TrainerMetrics()
    text = generate_latest(metrics.registry).decode()
    for phase in STEP_PHASES:
        assert f'mcprl_trainer_phase_seconds{{phase="{phase}"}} 0.0' in text
    for kind in TOOL_ERROR_KINDS:  # a run whose agent made no error still has the series
        assert f'mcprl_trainer_tool_errors_total{{kind="{kind}"}} 0.0' in text
    for reason in get_args(FinishReason):  # a run that ends between scrapes still has a rate
        assert f'mcprl_trainer_rollouts_total{{finish_reason="{reason}"}} 0.0' in text
    metrics.observe_step(1, {"rollout_seconds": 2.5, "train_seconds": 1.25})
    text = generate_latest(metrics.registry).decode()
    assert 'mcprl_trainer_phase_seconds{phase="rollout"} 2.5' in text
    assert 'mcprl_trainer_phase_seconds{phase="train"} 1.25' in text
    assert 'mcprl_trainer_phase_seconds{phase="judge"} 0.0' in text
