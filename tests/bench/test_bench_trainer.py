"""bench_trainer's rows: a start all rows share, and GRPO groups whose rows share their whole
prompt (no GPU needed)."""

from __future__ import annotations


def test_a_groups_rows_share_their_prompt_and_all_rows_the_common_start(bench_module) -> None:
    bt = bench_module("bench_trainer")
    rows = bt.make_samples(16, 200, 1000, 1, 0.3, shared=20, group_size=8)
    keys = [r.prompt_key for r in rows]
    assert len(set(keys[:8])) == 1 and len(set(keys[8:])) == 1 and keys[0] != keys[8]
    assert len({tuple(r.input_ids[:20]) for r in rows}) == 1
    assert len({tuple(r.input_ids) for r in rows}) == 16  # each its own continuation
    assert len({len(r.input_ids) for r in rows}) > 1
    for r in rows:
        prompt = r.mask.index(1)
        assert sum(r.mask) > 0 and all(r.mask[prompt:])
    plain = bt.make_samples(16, 200, 1000, 1, 0.3, shared=20)
    assert len({r.prompt_key for r in plain}) == 16
    assert plain[0].input_ids == rows[0].input_ids  # the same draws up to the first member
