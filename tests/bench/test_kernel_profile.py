"""bench/kernel_profile.py: the per-step kernel summary a GPU profile is reduced to, and
bench_trainer's ``--arm`` settings (both run without a GPU)."""

from __future__ import annotations

import argparse

import pytest


def test_summary_classes_busy_share_and_top(bench_module) -> None:
    kp = bench_module("kernel_profile")
    kernels = [  # two repetitions; the gemm overlaps the copy on another stream
        {"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 0.0, "dur": 60.0},
        {"name": "void at::native::vectorized_elementwise_kernel<4>", "ts": 60.0, "dur": 10.0},
        {"name": "fmha_cutlassF_bf16_aligned_64x128", "ts": 80.0, "dur": 20.0},
        {"name": "Memcpy DtoD (Device -> Device)", "ts": 50.0, "dur": 20.0},
        {"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "ts": 200.0, "dur": 60.0},
        {"name": "triton_red_fused_add_mean_mul_pow_rsqrt_0", "ts": 300.0, "dur": 30.0},
    ]
    out = kp.summarize(kernels, reps=2, wall_s=400e-6)
    assert out["kernels"] == 3.0 and out["device_ms"] == pytest.approx(0.1)
    # union of intervals: 0-70, 80-100, 200-260, 300-330 = 180 us of 400
    assert out["busy_share_of_wall"] == pytest.approx(0.45)
    classes = out["by_class"]
    assert next(iter(classes)) == "gemm" and classes["gemm"]["ms"] == pytest.approx(0.06)
    assert classes["gemm"]["share"] == pytest.approx(0.6)
    assert {"attention", "elementwise", "copy/index", "triton"} <= set(classes)
    assert out["top"][0]["name"].startswith("sm90_xmma_gemm") and out["top"][0]["count"] == 1.0
    assert kp.kernel_class("ampere_bf16_s16816gemm_relu") == "gemm"
    assert kp.kernel_class("cunn_SoftMaxForward") == "softmax/norm/reduce"
    assert kp.kernel_class("something_else") == "other"


def test_trainer_arms_parse_train_fields(bench_module) -> None:
    bt = bench_module("bench_trainer")
    name, overrides = bt.parse_arm("liger:liger_kernels=true,micro_batch_tokens=8192")
    assert name == "liger" and overrides == {"liger_kernels": True, "micro_batch_tokens": 8192}
    for bad in ("liger", "x:nope=1", "x:liger_kernels"):
        with pytest.raises(argparse.ArgumentTypeError):
            bt.parse_arm(bad)
