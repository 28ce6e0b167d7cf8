"""Merged projections (``fuse=proj``): q/k/v and gate/up run as one GEMM each inside the
engine, the modules' parameters become views of the merged weight, and nothing a user sees
changes: the same tokens and log-probs as the unmerged model, the same model outside the
engine, and the member's own linear whenever the merged weight is not where it was put."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams, fusions

pytestmark = pytest.mark.timeout(180)
PROMPTS = [[101, 57, 230, 18, 999, 4, 312, 77, 45, 600], [5, 6, 7, 8, 9, 10, 11]]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))]


class CountLinears(TorchFunctionMode):
    """Counts ``F.linear`` calls (one GEMM each) and their output widths."""

    def __init__(self) -> None:
        super().__init__()
        self.widths: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.widths.append(args[1].shape[0])
        return func(*args, **(kwargs or {}))


def engine(model: Path, fuse: str, device: str = "cpu", **kw) -> LLMEngine:
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    cfg = EngineConfig(device=device, dtype="float32", max_batch_size=4, max_model_len=128,
                       fuse=fuse, **kw)
    return LLMEngine.from_pretrained(str(model), cfg).start()


def run(eng: LLMEngine) -> list:
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=7, ignore_eos=True)
    futures = [eng.add_request(p, params) for p in PROMPTS]
    return [f.result(120).outputs[0] for f in futures]


@pytest.mark.parametrize("model_fixture", ["tiny_test_model", "smollm2_model"])
@pytest.mark.parametrize("device", DEVICES)
def test_merged_engine_samples_what_the_unmerged_one_does(model_fixture: str, device: str,
                                                          request) -> None:
    """Qwen2 (q/k/v biases) and Llama (none); CUDA adds the captured graphs."""

    model: Path = request.getfixturevalue(model_fixture)
    plain = engine(model, "none", device)
    try:
        want = run(plain)
    finally:
        plain.shutdown()
    merged = engine(model, "proj", device)
    try:
        layers = merged.model.config.num_hidden_layers
        assert len(merged.runner.merged) == 2 * layers
        assert f"merged projections x{2 * layers}" in merged.runner.fusions
        got = run(merged)
        assert all(group.merged() for group in merged.runner.merged)
    finally:
        merged.shutdown()
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_one_gemm_per_group_in_the_engine_and_the_plain_model_outside(
        tiny_test_model: Path) -> None:
    eng = engine(tiny_test_model, "proj")
    try:
        runner, model = eng.runner, eng.model
        attn = model.model.layers[0].self_attn
        group = runner.merged[0]
        # the parameters are views of the merged weight: same names, no second copy
        assert attn.q_proj.weight.data_ptr() == group.weight.data_ptr()
        assert attn.v_proj.bias.data_ptr() == group.bias.data_ptr() + \
            (attn.q_proj.out_features + attn.k_proj.out_features) * 4
        assert "model.layers.0.self_attn.k_proj.weight" in model.state_dict()
        ids = torch.tensor([PROMPTS[0]])
        with torch.inference_mode():
            outside = CountLinears()
            with outside:
                plain = model(ids).logits
            inside = CountLinears()
            with inside, fusions.active(frozenset({fusions.PROJ})):
                fused = model(ids).logits
        held = [g for g in runner.merged if g._y is not None]  # no activation outlives it
    finally:
        eng.shutdown()
    assert held == []
    layers = model.config.num_hidden_layers
    assert len(outside.widths) == 7 * layers + 1  # 7 linears a layer, and the LM head
    assert len(inside.widths) == 4 * layers + 1  # q/k/v, o, gate/up, down
    cfg = model.config
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * attn.head_dim
    assert inside.widths[:2] == [qkv, cfg.hidden_size]
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)


def test_prefills_run_the_linears_unmerged_and_decode_steps_merged(tiny_test_model: Path
                                                                   ) -> None:
    """A prefill is bound by compute, a decode step by kernel count: only decode steps merge
    (a merged gate/up would leave SiLU and its product to strided column slices)."""

    eng = engine(tiny_test_model, "proj")
    try:
        runner, layers = eng.runner, eng.model.config.num_hidden_layers
        runner.ensure_capacity(2, 32)
        tokens, positions = torch.tensor([7, 8]), torch.tensor([5, 5])
        with torch.inference_mode():
            prefill, decode = CountLinears(), CountLinears()
            with prefill:
                runner.prefill([[1, 2, 3, 4, 5]] * 2, [0, 1])
            with decode:
                runner.decode(tokens, positions, 5, None)
    finally:
        eng.shutdown()
    assert len(prefill.widths) == 7 * layers + 1
    assert len(decode.widths) == 4 * layers + 1


def test_weights_moved_apart_run_unmerged_until_merged_again(tiny_test_model: Path) -> None:
    """What a device move does (sleep on a GPU): each parameter gets its own storage. The
    members then run their own linears, with the new weights, until ``merge`` lays them end
    to end again; another input than the one the group holds never reads a stale output."""

    eng = engine(tiny_test_model, "proj")
    try:
        model, groups = eng.model, eng.runner.merged
        ids = torch.tensor([PROMPTS[1]])
        with torch.inference_mode(), fusions.active(frozenset({fusions.PROJ})):
            before = model(ids).logits
            model._apply(lambda t: t.clone())  # every parameter in a storage of its own
            assert not any(g.merged() for g in groups)
            counter = CountLinears()
            with counter:
                apart = model(ids).logits
            assert len(counter.widths) == 7 * model.config.num_hidden_layers + 1
            for g in groups:
                g.merge()
            assert all(g.merged() for g in groups)
            again = model(ids).logits
            attn = model.model.layers[0].self_attn
            x = torch.randn(2, attn.q_proj.in_features)
            y = torch.randn(2, attn.q_proj.in_features)
            q = attn.q_proj(x)  # the group now holds x's output, waiting for k and v
            torch.testing.assert_close(attn.k_proj(y), F.linear(y, attn.k_proj.weight,
                                                                 attn.k_proj.bias))
            torch.testing.assert_close(q, F.linear(x, attn.q_proj.weight, attn.q_proj.bias))
        assert eng.runner.merged[0].weight is not None
        after = run(eng)
    finally:
        eng.shutdown()
    torch.testing.assert_close(apart, before)
    torch.testing.assert_close(again, before)
    assert all(len(o.token_ids) == 8 for o in after)


@pytest.mark.parametrize(("fuse", "device_type", "kinds"), [
    ("auto", "cuda", {"norm", "rotary", "proj", "mlp", "kv", "residual", "rope", "attn",
                      "sample"}),  # each measured faster
    ("auto", "cpu", set()),  # proj had no steady gain on a CPU
    ("none", "cuda", set()),
    ("proj + norm", "cpu", {"norm", "proj"}),
    ("norm+rotary+proj+mlp", "cuda", {"norm", "rotary", "proj", "mlp"}),
    ("mlp+residual+kv", "cuda", {"mlp", "residual", "kv"}),
    ("kv+rope", "cuda", {"kv", "rope"}),
    ("attn+rope+sample", "cuda", {"attn", "rope", "sample"}),
])
def test_fuse_settings_name_the_kinds_that_run(fuse: str, device_type: str,
                                               kinds: set[str]) -> None:
    assert fusions.parse(fuse, device_type) == kinds


@pytest.mark.parametrize("fuse", ["nrom", "norm+", "auto+proj"])
def test_unknown_fusions_are_refused_by_name(tiny_test_model: Path, fuse: str) -> None:
    with pytest.raises(ValueError, match="fuse must be auto, none or kinds of"):
        engine(tiny_test_model, fuse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sleep_and_wake_merge_again_on_cuda(tiny_test_model: Path) -> None:
    eng = engine(tiny_test_model, "norm+proj", "cuda")
    try:
        before = run(eng)
        eng.sleep().result(60)
        assert all(g.weight is None for g in eng.runner.merged)
        eng.wake_up().result(60)
        assert all(g.merged() for g in eng.runner.merged)
        after = run(eng)
    finally:
        eng.shutdown()
    for b, a in zip(before, after, strict=True):
        assert a.token_ids == b.token_ids


def test_a_copy_of_a_merged_model_serves_merged_on_its_own_weights(tiny_test_model: Path
                                                                   ) -> None:
    """The benchmark copies a served model for each engine it compares: the copy's groups
    are its own (its own weights), and an engine on it adopts them."""

    import copy

    eng = engine(tiny_test_model, "proj")
    try:
        want = run(eng)
        clone = copy.deepcopy(eng.model)
    finally:
        eng.shutdown()
    other = LLMEngine(clone, None, EngineConfig(device="cpu", dtype="float32", max_batch_size=4,
                                                max_model_len=128, fuse="proj")).start()
    try:
        groups = other.runner.merged
        assert len(groups) == 2 * clone.config.num_hidden_layers
        assert all(g.merged() and g.linears[0] is clone.get_submodule(g.names[0])
                   for g in groups)
        got = run(other)
    finally:
        other.shutdown()
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
