"""/v1/completions through the openai SDK: token in, token out, and log-probs that a plain
forward pass of the model reproduces (what the trainer's importance ratios rely on)."""

from __future__ import annotations

import pytest

PROMPT = [101, 57, 230, 18, 999, 4, 312, 77]


def _extra(**kw):
    return {"return_token_ids": True, **kw}


@pytest.mark.timeout(60)
def test_token_in_token_out_logprobs_match_forward(server, ref_logprobs) -> None:
    for temperature in (1.0, 0.7):
        resp = server.client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=12, temperature=temperature, seed=11,
            logprobs=3, extra_body=_extra(ignore_eos=True))
        choice = resp.choices[0]
        extra = choice.model_extra
        assert extra["prompt_token_ids"] == PROMPT
        ids = extra["token_ids"]
        assert len(ids) == 12 and resp.usage.completion_tokens == 12
        assert resp.usage.prompt_tokens == len(PROMPT)
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 12
        # raw log-probs (vLLM's default): the model's own distribution, not the tempered one
        assert lp.token_logprobs == pytest.approx(ref_logprobs(PROMPT, ids), abs=1e-4)
        for sampled, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
            assert 3 <= len(top) <= 4 and max(top.values()) >= sampled - 1e-6
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


@pytest.mark.timeout(60)
def test_several_prompts_and_n(server, tiny_tokenizer) -> None:
    resp = server.client.completions.create(
        model=server.model, prompt=[PROMPT, PROMPT[:3]], n=2, max_tokens=4, seed=1,
        extra_body=_extra(ignore_eos=True))
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert [c.model_extra["prompt_token_ids"] for c in resp.choices] == [PROMPT] * 2 + [
        PROMPT[:3]] * 2
    assert resp.usage.prompt_tokens == len(PROMPT) + 3
    text = server.client.completions.create(model=server.model, prompt="How many employees",
                                            max_tokens=3, extra_body=_extra())
    assert text.choices[0].model_extra["prompt_token_ids"] == tiny_tokenizer.encode(
        "How many employees")


@pytest.mark.timeout(60)
def test_seed_reproduces_and_greedy_is_deterministic(server) -> None:
    def run(**kw):
        r = server.client.completions.create(model=server.model, prompt=PROMPT, max_tokens=10,
                                             extra_body=_extra(ignore_eos=True), **kw)
        return r.choices[0].model_extra["token_ids"]

    assert run(seed=5) == run(seed=5)
    assert run(seed=5) != run(seed=6)
    assert run(temperature=0.0) == run(temperature=0.0)


@pytest.mark.timeout(60)
def test_stop_token_ids_stop_strings_and_eos(server, tiny_tokenizer) -> None:
    greedy = server.client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=8, temperature=0.0,
        extra_body=_extra(ignore_eos=True)).choices[0]
    ids = greedy.model_extra["token_ids"]
    stop_id = ids[3]
    cut = ids.index(stop_id)
    stopped = server.client.completions.create(
        model=server.model, prompt=PROMPT, max_tokens=8, temperature=0.0,
        extra_body=_extra(ignore_eos=True, stop_token_ids=[stop_id])).choices[0]
    assert stopped.model_extra["token_ids"] == ids[: cut + 1]  # the stop token is in token_ids
    assert stopped.finish_reason == "stop" and stopped.model_extra["stop_reason"] == stop_id
    assert stopped.text == tiny_tokenizer.decode(ids[:cut], skip_special_tokens=True)

    full_text = greedy.text
    needle = full_text[len(full_text) // 2:][:3]
    if needle.strip():
        by_text = server.client.completions.create(
            model=server.model, prompt=PROMPT, max_tokens=8, temperature=0.0, stop=[needle],
            extra_body=_extra(ignore_eos=True)).choices[0]
        assert by_text.finish_reason == "stop" and by_text.model_extra["stop_reason"] == needle
        assert needle not in by_text.text and full_text.startswith(by_text.text)

    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    # logit bias is not offered; force an eos by making it the only stop candidate: the model
    # samples freely until it emits eos or hits max_tokens, both must be reported right
    r = server.client.completions.create(model=server.model, prompt=PROMPT, max_tokens=40,
                                         seed=3, extra_body=_extra()).choices[0]
    toks = r.model_extra["token_ids"]
    if r.finish_reason == "stop":
        assert toks[-1] in (eos, tiny_tokenizer.pad_token_id)
    else:
        assert r.finish_reason == "length" and len(toks) == 40
