"""RULER parity on loopback: ART's ruler_score_group and our judge, the same tiny judge
model on our engine at temperature 0, each behind a recording tap. A random tiny model
cannot judge, so what is checked is what reaches the engine (same rubric, same trajectory
rendering up to the listed differences) and how each side handles an unusable answer; the
rank agreement with a real judge model comes from `make art-parity` (docs/art.md)."""

from __future__ import annotations

import pytest

pytest.importorskip("mcprl_art", reason="the ART extra is not installed (make setup-art)")


from mcprl_art.parity import agreement, kendall_tau_b, pairwise, run_parity

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_rank_agreement_counts_pairs() -> None:
    assert pairwise([3, 2, 1], [0.9, 0.5, 0.1]) == (3, 0, 0)
    assert pairwise([3, 2, 1], [0.1, 0.5, 0.9]) == (0, 3, 0)
    assert pairwise([3, 2, 1], [0.5, 0.5, 0.1]) == (2, 0, 1)
    assert kendall_tau_b([3, 2, 1], [0.9, 0.5, 0.1]) == 1.0
    assert kendall_tau_b([1, 1, 1], [0.9, 0.5, 0.1]) is None
    pooled = agreement([([3, 2, 1], [0.9, 0.5, 0.1]), ([3, 2, 1], [0.1, 0.5, 0.9])])
    assert pooled["concordance"] == 0.5 and pooled["mean_kendall_tau_b"] == 0.0


async def test_both_judges_send_the_same_groups_to_the_engine(art_stack, tmp_path) -> None:
    report = await run_parity(mcp_url=art_stack.mcp_url, engine_url=art_stack.engine_url,
                              model=art_stack.model, workdir=tmp_path, max_tokens=48,
                              n_groups=1)
    assert report["groups"] == 1 and report["trajectories_per_group"] == [4]
    for row in report["rows"]:
        cmp = row["requests"]
        assert cmp is not None, row
        assert cmp["rubric_in_both"] and cmp["context_equal"]
        assert cmp["trajectories_equal"] and cmp["tools_equal"]
        assert not cmp["raw_trajectories_equal"]  # form differs (empty fields), not content
        assert any("<task>" in d for d in cmp["differences"])
        assert any(d.startswith("response_format: ART scores: array")
                   for d in cmp["differences"])
        # ART makes one call and gives up on an unusable answer; ours asks again, bounded
        assert row["art"]["upstream_calls"] == 1
        if not row["ours"]["ok"]:
            assert row["ours"]["upstream_calls"] == 3 and "HTTP 502" in row["ours"]["error"]
        if not row["art"]["ok"]:
            assert row["art"]["error"]
    art_req, our_req = report["first_requests"]["art"], report["first_requests"]["ours"]
    assert art_req["temperature"] == our_req["temperature"] == 0
    assert art_req["model"] == our_req["model"] == art_stack.model
    assert art_req["max_tokens"] == our_req["max_tokens"] == 48
    assert report["our_upstream_calls"] >= report["art_upstream_calls"] == 1
