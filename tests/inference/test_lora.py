"""Runtime LoRA: load changes the output (and matches peft's own forward pass), replacing
under the same name takes the new weights, unloading restores the base model. Both ways of
running an adapter (merged into the weights, and the engine's unmerged LoRA branch) are held
to this."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

PROMPT = [101, 57, 230, 18, 999, 4, 312, 77, 45, 600]


def _make_adapter(base_path: Path, out: Path, seed: int, rank: int = 8, **config) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                     "up_proj", "down_proj"], **config)
    model = get_peft_model(base, cfg)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapters(tiny_test_model: Path, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {"a": _make_adapter(tiny_test_model, root / "a", 1),
            "b": _make_adapter(tiny_test_model, root / "b", 2),
            "big": _make_adapter(tiny_test_model, root / "big", 3, rank=128)}


@pytest.fixture(scope="module", params=["merged", "unmerged"])
def lora_server(tiny_test_model: Path, serve_factory, request):
    with serve_factory(tiny_test_model, max_lora_rank=64, lora_mode=request.param) as srv:
        assert srv.thread.server.config.app.state.serving.engine.lora.merge == (
            request.param == "merged")
        yield srv


def _greedy(srv, model: str) -> tuple[list[int], list[float]]:
    r = srv.client.completions.create(model=model, prompt=PROMPT, max_tokens=10,
                                      temperature=0.0, logprobs=0,
                                      extra_body={"return_token_ids": True, "ignore_eos": True})
    return r.choices[0].model_extra["token_ids"], r.choices[0].logprobs.token_logprobs


@pytest.mark.timeout(120)
def test_load_replace_unload(lora_server, adapters, tiny_test_model, ref_logprobs) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    srv = lora_server
    base_ids, _ = _greedy(srv, srv.model)
    r = srv.http.post("/v1/load_lora_adapter",
                      json={"lora_name": "policy", "lora_path": str(adapters["a"])})
    assert r.status_code == 200 and "added successfully" in r.text
    cards = {m.id: m for m in srv.client.models.list().data}
    assert cards["policy"].model_extra["parent"] == srv.model
    assert cards[srv.model].model_extra["max_model_len"] == 512

    ids_a, lps_a = _greedy(srv, "policy")
    assert ids_a != base_ids
    peft_a = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32),
        adapters["a"]).eval()
    assert lps_a == pytest.approx(ref_logprobs(PROMPT, ids_a, model=peft_a), abs=1e-4)
    assert _greedy(srv, srv.model)[0] == base_ids  # the base model is untouched

    r = srv.http.post("/v1/load_lora_adapter",
                      json={"lora_name": "policy", "lora_path": str(adapters["b"])})
    assert r.status_code == 200
    ids_b, _ = _greedy(srv, "policy")
    assert ids_b != ids_a

    r = srv.http.post("/v1/unload_lora_adapter", json={"lora_name": "policy"})
    assert r.status_code == 200 and "removed successfully" in r.text
    assert _greedy(srv, srv.model)[0] == base_ids
    gone = srv.http.post("/v1/completions", json={"model": "policy", "prompt": PROMPT})
    assert gone.status_code == 404 and "does not exist" in gone.json()["error"]["message"]


@pytest.mark.timeout(60)
def test_lora_errors(lora_server, adapters, tmp_path) -> None:
    srv = lora_server
    missing = srv.http.post("/v1/load_lora_adapter",
                            json={"lora_name": "x", "lora_path": str(tmp_path / "none")})
    assert missing.status_code == 404
    empty = srv.http.post("/v1/load_lora_adapter", json={"lora_name": "", "lora_path": ""})
    assert empty.status_code == 400
    big = srv.http.post("/v1/load_lora_adapter",
                        json={"lora_name": "big", "lora_path": str(adapters["big"])})
    assert big.status_code == 400 and "max_lora_rank" in big.json()["error"]["message"]
    unknown = srv.http.post("/v1/unload_lora_adapter", json={"lora_name": "never"})
    assert unknown.status_code == 404
    assert srv.http.get("/health").status_code == 200


@pytest.mark.timeout(60)
def test_strict_reload_needs_load_inplace_like_vllm(tiny_test_model, adapters, serve_factory
                                                    ) -> None:
    with serve_factory(tiny_test_model, strict_lora_reload=True) as srv:
        body = {"lora_name": "policy", "lora_path": str(adapters["a"])}
        assert srv.http.post("/v1/load_lora_adapter", json=body).status_code == 200
        again = srv.http.post("/v1/load_lora_adapter", json=body)
        assert again.status_code == 400 and "already been loaded" in again.text
        inplace = srv.http.post("/v1/load_lora_adapter", json={**body, "load_inplace": True})
        assert inplace.status_code == 200
        assert srv.metric("mcprl_inference_lora_loads_total") == 2


@pytest.mark.timeout(120)
def test_switching_adapters_never_drifts(lora_server, adapters, tiny_test_model,
                                         ref_logprobs) -> None:
    """Base, a, b, a, base, ...: each answer equals its own reference every time, so merging
    and restoring (or peft's branch) leaves no trace of the previous adapter."""

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    srv = lora_server
    for name in ("a", "b"):
        r = srv.http.post("/v1/load_lora_adapter",
                          json={"lora_name": f"sw-{name}", "lora_path": str(adapters[name])})
        assert r.status_code == 200, r.text
    first = {m: _greedy(srv, m) for m in (srv.model, "sw-a", "sw-b")}
    assert len({tuple(ids) for ids, _ in first.values()}) == 3
    for model in ("sw-b", srv.model, "sw-a", "sw-b", "sw-a", srv.model):
        ids, lps = _greedy(srv, model)
        assert ids == first[model][0]
        assert lps == pytest.approx(first[model][1], abs=1e-5)
    assert srv.http.post("/sleep", params={"level": 1}).status_code == 200
    assert srv.http.post("/wake_up").status_code == 200
    for model in ("sw-a", srv.model, "sw-b"):  # sleep and wake keep every adapter intact
        assert _greedy(srv, model)[0] == first[model][0]
    peft_b = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32),
        adapters["b"]).eval()
    ids_b, lps_b = first["sw-b"]
    assert lps_b == pytest.approx(ref_logprobs(PROMPT, ids_b, model=peft_b), abs=1e-4)
    for name in ("a", "b"):
        assert srv.http.post("/v1/unload_lora_adapter",
                             json={"lora_name": f"sw-{name}"}).status_code == 200
    assert _greedy(srv, srv.model)[0] == first[srv.model][0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["merged", "unmerged"])
def test_more_adapters_than_max_loras_evict_and_reload(tiny_test_model, adapters, serve_factory,
                                                       tmp_path, mode) -> None:
    """As in vLLM, loading beyond ``max_loras`` never fails: the least recently used adapter
    leaves memory, stays listed, and a request for it loads it again with the same weights.
    One whose folder is gone by then gets a 404 naming it and is no longer listed."""

    import shutil

    gone = shutil.copytree(adapters["b"], tmp_path / "soon-gone")
    with serve_factory(tiny_test_model, max_loras=2, lora_mode=mode) as srv:
        def load(name: str, path: Path) -> None:
            r = srv.http.post("/v1/load_lora_adapter",
                              json={"lora_name": name, "lora_path": str(path)})
            assert r.status_code == 200, r.text

        load("alpha", adapters["a"])
        first_a = _greedy(srv, "alpha")
        load("beta", adapters["b"])
        first_b = _greedy(srv, "beta")
        load("gone", gone)  # evicts alpha (least recently used)
        assert srv.metric("mcprl_inference_lora_evictions_total") == 1
        assert srv.metric("mcprl_inference_lora_resident") == 2
        assert {m.id for m in srv.client.models.list().data} >= {"alpha", "beta", "gone"}

        assert _greedy(srv, "alpha") == first_a  # reloaded from its folder; evicts beta
        assert _greedy(srv, "beta") == first_b  # and beta again, evicting gone
        assert srv.metric("mcprl_inference_lora_reloads_total") == 2
        assert srv.metric("mcprl_inference_lora_registered") == 3

        shutil.rmtree(gone)
        r = srv.http.post("/v1/completions", json={"model": "gone", "prompt": PROMPT,
                                                   "max_tokens": 2})
        assert r.status_code == 404, r.text
        assert "gone" in r.json()["error"]["message"]
        assert "gone" not in {m.id for m in srv.client.models.list().data}
        assert _greedy(srv, "alpha") == first_a


def _hand_edited(src: Path, out: Path, **config) -> Path:
    """``src`` with its config changed and, for an unknown target, weights for that module."""

    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    cfg = json.loads((out / "adapter_config.json").read_text())
    targets = config.pop("extra_target", None)
    if targets:
        cfg["target_modules"] = [*cfg["target_modules"], targets]
        tensors = load_file(out / "adapter_model.safetensors")
        prefix = f"base_model.model.model.layers.0.self_attn.{targets}"
        tensors[f"{prefix}.lora_A.weight"] = torch.ones(8, 128)
        tensors[f"{prefix}.lora_B.weight"] = torch.ones(128, 8)
        save_file(tensors, out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text(json.dumps({**cfg, **config}))
    return out


@pytest.mark.timeout(120)
def test_unsupported_adapters_are_refused(lora_server, adapters, tiny_test_model,
                                          tmp_path) -> None:
    """What the engine would run differently from peft is a 400 naming it, and a failed
    republish leaves the adapter of that name serving its old weights."""

    srv = lora_server
    load = {"lora_name": "keep", "lora_path": str(adapters["a"])}
    assert srv.http.post("/v1/load_lora_adapter", json=load).status_code == 200
    kept = _greedy(srv, "keep")
    refused = {
        "DoRA": _make_adapter(tiny_test_model, tmp_path / "dora", 4, use_dora=True),
        "bias 'all'": _make_adapter(tiny_test_model, tmp_path / "bias", 4, bias="all"),
        "modules_to_save": _make_adapter(tiny_test_model, tmp_path / "mts", 4,
                                         modules_to_save=["lm_head"]),
        "max_lora_rank": adapters["big"],
        "'foo_proj' is not a linear layer": _hand_edited(adapters["a"], tmp_path / "foo",
                                                         extra_target="foo_proj"),
        "do not match r=4": _hand_edited(adapters["a"], tmp_path / "shape", r=4),
    }
    for words, path in refused.items():
        r = srv.http.post("/v1/load_lora_adapter",
                          json={"lora_name": "keep", "lora_path": str(path)})
        assert r.status_code == 400, (words, r.text)
        assert words in r.json()["error"]["message"], r.text
    assert _greedy(srv, "keep") == kept
    assert srv.http.post("/v1/unload_lora_adapter", json={"lora_name": "keep"}).status_code == 200
