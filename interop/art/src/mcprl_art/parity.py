"""RULER parity: the same trajectory groups scored by ``art.rewards.ruler_score_group`` and
by our judge, with the same judge model served by our engine at temperature 0.

Each side reaches the engine through its own :class:`RequestTap` (a pass-through proxy on
loopback that keeps every request and answer), so what the two judges actually sent is
compared, not what they were meant to send. The report lists, per group, both outcomes and
scores, the request comparison (:func:`compare_requests`) and the rank agreement of the
scores (pairwise concordance and Kendall's tau-b), also against the order the groups were
built in (best trajectory first).

``python -m mcprl_art.parity --judge-model PATH`` starts the MCP server (the tutorial's
rows), the engine and our judge; ``run_parity`` takes running ones (the tests).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import art
import httpx
from art.rewards import ruler_score_group
from art.rewards.ruler import DEFAULT_RUBRIC as ART_RUBRIC
from fastapi import FastAPI, Request, Response

from mcprl_art.parity_groups import build_groups
from mcprl_art.shapes import score_group_request
from mcprl_common.process import UvicornThread, wait_healthy


# -- the tap ------------------------------------------------------------------------------------
class RequestTap:
    """A pass-through proxy in front of an OpenAI-compatible server that records each
    chat-completions request body and the answer's text."""

    def __init__(self, upstream: str, timeout_s: float = 600.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.calls: list[dict[str, Any]] = []
        self.timeout_s = timeout_s
        app = FastAPI()
        app.add_api_route("/{path:path}", self._forward, methods=["GET", "POST"])
        self._server = UvicornThread(app)

    @property
    def url(self) -> str:
        return self._server.url

    async def _forward(self, path: str, request: Request) -> Response:
        body = await request.body()
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            upstream = await client.request(request.method, f"{self.upstream}/{path}",
                                            content=body, headers={
                                                "content-type": "application/json"})
        if path.endswith("chat/completions") and body:
            answer: dict[str, Any] = {}
            with contextlib.suppress(ValueError):
                answer = upstream.json()
            choice = (answer.get("choices") or [{}])[0]
            self.calls.append({"request": json.loads(body), "status": upstream.status_code,
                               "text": (choice.get("message") or {}).get("content"),
                               "finish_reason": choice.get("finish_reason")})
        return Response(upstream.content, upstream.status_code,
                        media_type=upstream.headers.get("content-type"))

    def __enter__(self) -> RequestTap:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()


# -- comparing the two requests -----------------------------------------------------------------
_BLOCK = r"<{tag}>\n(.*?)\n</{tag}>"
_TRAJ = re.compile(r'<trajectory id="([^"]+)">\n(.*?)\n</trajectory>', re.DOTALL)


def _block(text: str, tag: str) -> Any:
    m = re.search(_BLOCK.format(tag=tag), text, re.DOTALL)
    return json.loads(m.group(1)) if m else None


def _clean(value: Any) -> Any:
    """Messages without empty fields (None, "", []), as meaning goes: both judges read the
    same conversation whether a tool-call message says ``content: ""`` or nothing."""

    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v not in (None, "", [])}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _tool_entries(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out = []
    for tool in tools or []:
        fn = tool.get("function", tool)
        out.append({k: fn[k] for k in ("name", "description", "parameters") if fn.get(k)})
    return out


def _user(request: dict[str, Any]) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


def _system(request: dict[str, Any]) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "system")


def _schema_shape(request: dict[str, Any]) -> str:
    fmt = request.get("response_format") or {}
    schema = (fmt.get("json_schema") or {}).get("schema") or {}
    scores = (schema.get("properties") or {}).get("scores") or {}
    if scores.get("type") == "array":
        return "scores: array of {trajectory_id, explanation, score}, any length, no bounds"
    if scores.get("type") == "object":
        ids = scores.get("required") or []
        return f"scores: object with required ids {ids}, each {{explanation, score}}"
    return "none" if not fmt else json.dumps(fmt)[:200]


@dataclass
class RequestComparison:
    rubric_in_both: bool
    context_equal: bool  # the shared prefix, after dropping empty fields
    trajectories_equal: bool  # each trajectory's own messages, after dropping empty fields
    tools_equal: bool  # name, description, parameters of each tool
    raw_trajectories_equal: bool  # byte for byte
    differences: list[str] = field(default_factory=list)


def compare_requests(art_req: dict[str, Any], our_req: dict[str, Any],
                     rubric: str) -> RequestComparison:
    """What the two judge requests have in common, and each difference in words."""

    a_user, o_user = _user(art_req), _user(our_req)
    a_traj, o_traj = dict(_TRAJ.findall(a_user)), dict(_TRAJ.findall(o_user))
    lines = [ln.strip() for ln in rubric.strip().splitlines() if ln.strip()]
    rubric_in_both = all(ln in _system(art_req) and ln in _system(our_req) for ln in lines)
    a_ctx, o_ctx = _block(a_user, "context"), _block(o_user, "context")
    trajectories_equal = a_traj.keys() == o_traj.keys() and all(
        _clean(json.loads(a_traj[k])) == _clean(json.loads(o_traj[k])) for k in a_traj)
    a_tools = _tool_entries(_block(a_user, "available_tools"))
    o_tools = _tool_entries(_block(o_user, "tools"))
    diffs: list[str] = []
    if a_traj.keys() != o_traj.keys():
        diffs.append(f"trajectory ids: ART {sorted(a_traj)} ours {sorted(o_traj)} (we send "
                     "identical trajectories once)")
    if "<task>" in o_user and "<task>" not in a_user:
        diffs.append("ours starts with <task>: the scenario's task, stated once")
    if a_traj.items() != o_traj.items() and trajectories_equal:
        a_len, o_len = sum(map(len, a_traj.values())), sum(map(len, o_traj.values()))
        diffs.append("trajectory JSON differs in form only: we drop empty fields (content "
                     f"\"\" on tool-call messages): {a_len} characters in ART's, {o_len} in ours")
    if "\\u" in a_user and "\\u" not in o_user:
        diffs.append("ART escapes non-ASCII text as \\uXXXX; we send it as is (fewer tokens)")
    if a_tools != o_tools:
        diffs.append("tools differ in content")
    elif "<available_tools>" in a_user:
        diffs.append("tools: ART sends <available_tools> with each tool's full OpenAI "
                     "object; ours <tools> with name, description, parameters")
    if _system(art_req) != _system(our_req):
        diffs.append("system prompt: same rubric, our wording adds the answer format with "
                     "an example (every mode, so text-only providers get it too)")
    a_fmt, o_fmt = _schema_shape(art_req), _schema_shape(our_req)
    if a_fmt != o_fmt:
        diffs.append(f"response_format: ART {a_fmt}; ours {o_fmt}, score in [0, 1], "
                     "explanation length bounded")
    for key in ("temperature", "max_tokens", "max_completion_tokens"):
        if art_req.get(key) != our_req.get(key):
            diffs.append(f"{key}: ART {art_req.get(key)!r}, ours {our_req.get(key)!r}")
    return RequestComparison(rubric_in_both, _clean(a_ctx) == _clean(o_ctx),
                             trajectories_equal, a_tools == o_tools, a_traj == o_traj, diffs)


# -- rank agreement -------------------------------------------------------------------------------
def pairwise(a: list[float], b: list[float]) -> tuple[int, int, int]:
    """(concordant, discordant, tied in either) pairs of two score lists."""

    con = dis = tie = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            s = (a[i] - a[j]) * (b[i] - b[j])
            if s > 0:
                con += 1
            elif s < 0:
                dis += 1
            else:
                tie += 1
    return con, dis, tie


def kendall_tau_b(a: list[float], b: list[float]) -> float | None:
    con, dis, _ = pairwise(a, b)
    n = len(a)
    pairs = n * (n - 1) / 2
    ties_a = sum(1 for i in range(n) for j in range(i + 1, n) if a[i] == a[j])
    ties_b = sum(1 for i in range(n) for j in range(i + 1, n) if b[i] == b[j])
    denom = ((pairs - ties_a) * (pairs - ties_b)) ** 0.5
    return (con - dis) / denom if denom else None


def agreement(pairs: list[tuple[list[float], list[float]]]) -> dict[str, Any]:
    """Pooled over groups: concordant / discordant / tied pairs, and the mean tau-b."""

    con = dis = tie = 0
    taus = []
    for a, b in pairs:
        c, d, t = pairwise(a, b)
        con, dis, tie = con + c, dis + d, tie + t
        tau = kendall_tau_b(a, b)
        if tau is not None:
            taus.append(tau)
    return {"groups": len(pairs), "concordant": con, "discordant": dis, "tied": tie,
            "concordance": con / (con + dis) if con + dis else None,
            "mean_kendall_tau_b": sum(taus) / len(taus) if taus else None}


# -- the run --------------------------------------------------------------------------------------
@dataclass
class Side:
    ok: bool
    scores: list[float] | None = None
    error: str | None = None
    upstream_calls: int = 0
    seconds: float = 0.0


async def _art_side(group: art.TrajectoryGroup, model: str, base_url: str,
                    max_tokens: int, calls_before: int, tap: RequestTap) -> Side:
    t0 = time.perf_counter()
    try:
        scored = await ruler_score_group(group, judge_model=f"openai/{model}",
                                         extra_litellm_params={
                                             "api_base": base_url, "api_key": "EMPTY",
                                             "temperature": 0, "max_tokens": max_tokens,
                                             "timeout": 1200})
        side = Side(True, [t.reward for t in scored.trajectories])
    except Exception as exc:
        side = Side(False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    side.upstream_calls = len(tap.calls) - calls_before
    side.seconds = round(time.perf_counter() - t0, 2)
    return side


async def _our_side(group: art.TrajectoryGroup, judge_url: str, calls_before: int,
                    tap: RequestTap) -> Side:
    t0 = time.perf_counter()
    request = score_group_request(group, rubric=ART_RUBRIC, use_cache=False)
    try:
        async with httpx.AsyncClient(timeout=1800) as client:
            resp = await client.post(f"{judge_url}/v1/score-group",
                                     json=request.model_dump(mode="json"))
    except httpx.HTTPError as exc:
        side = Side(False, error=f"{type(exc).__name__} from our judge")
    else:
        side = _our_result(resp)
    side.upstream_calls = len(tap.calls) - calls_before
    side.seconds = round(time.perf_counter() - t0, 2)
    return side


def _our_result(resp: httpx.Response) -> Side:
    if resp.status_code == 200:
        return Side(True, [s["score"] for s in resp.json()["scores"]])
    return Side(False, error=f"HTTP {resp.status_code}: "
                f"{resp.json().get('error', {}).get('message', resp.text)[:200]}")


@contextlib.contextmanager
def _our_judge(base_url: str, model: str, max_tokens: int, workdir: Path) -> Iterator[str]:
    from mcprl_judge.loopback import serve_judge

    with serve_judge(base_url=base_url, model=model, temperature=0.0, cache_enabled=False,
                     max_output_tokens=max_tokens, explanation_max_chars=200,
                     timeout_s=1200, max_retries=0, log_json=False,
                     cache_path=workdir / "judge-cache.sqlite3") as url:
        yield url


async def run_parity(*, mcp_url: str, engine_url: str, model: str, workdir: Path,
                     max_tokens: int = 512, n_groups: int | None = None,
                     progress: Path | None = None) -> dict[str, Any]:
    """Score the parity groups both ways through taps in front of ``engine_url`` (``/v1``);
    each finished group is appended to ``progress`` (JSON lines) as it comes."""

    groups, intended = await build_groups(mcp_url)
    groups, intended = groups[:n_groups], intended[:n_groups]
    engine_root = engine_url.rstrip("/").removesuffix("/v1")
    rows: list[dict[str, Any]] = []
    with RequestTap(engine_root) as art_tap, RequestTap(engine_root) as our_tap, \
            _our_judge(f"{our_tap.url}/v1", model, max_tokens, workdir) as judge_url:
        for gi, group in enumerate(groups):
            a_before, o_before = len(art_tap.calls), len(our_tap.calls)
            art_side = await _art_side(group, model, f"{art_tap.url}/v1", max_tokens,
                                       a_before, art_tap)
            our_side = await _our_side(group, judge_url, o_before, our_tap)
            comparison = None
            if len(art_tap.calls) > a_before and len(our_tap.calls) > o_before:
                comparison = compare_requests(art_tap.calls[a_before]["request"],
                                              our_tap.calls[o_before]["request"], ART_RUBRIC)
            rows.append({"group": gi, "task": group.metadata.get("task"),
                         "intended_order": intended[gi], "art": asdict(art_side),
                         "ours": asdict(our_side),
                         "requests": asdict(comparison) if comparison else None,
                         "art_answer": art_tap.calls[-1]["text"] if art_tap.calls else None})
            if progress is not None:
                with progress.open("a") as fh:
                    fh.write(json.dumps(rows[-1]) + "\n")
        art_requests, our_requests = list(art_tap.calls), list(our_tap.calls)
    both = [(r["art"]["scores"], r["ours"]["scores"]) for r in rows
            if r["art"]["ok"] and r["ours"]["ok"]]
    return {
        "judge_model": model, "temperature": 0, "max_tokens": max_tokens,
        "groups": len(rows), "trajectories_per_group": [len(g.trajectories) for g in groups],
        "art_ok": sum(r["art"]["ok"] for r in rows),
        "ours_ok": sum(r["ours"]["ok"] for r in rows),
        "art_upstream_calls": len(art_requests), "our_upstream_calls": len(our_requests),
        "rank_agreement_art_vs_ours": agreement(both),
        "rank_agreement_with_intended": {
            "art": agreement([(r["art"]["scores"], r["intended_order"]) for r in rows
                              if r["art"]["ok"]]),
            "ours": agreement([(r["ours"]["scores"], r["intended_order"]) for r in rows
                               if r["ours"]["ok"]])},
        "rows": rows,
        "first_requests": {"art": art_requests[0]["request"] if art_requests else None,
                           "ours": our_requests[0]["request"] if our_requests else None},
    }


@contextlib.contextmanager
def _serve(model_path: Path, workdir: Path) -> Iterator[tuple[str, str]]:
    """The MCP server (tutorial rows) and the engine serving ``model_path`` as "judge"."""

    from mcprl_inference.app import create_app as engine_app
    from mcprl_inference.settings import InferenceSettings
    from mcprl_mcp_server.loopback import serve_mcp

    with serve_mcp(workdir / "mcp", preset="tutorial") as (mcp_url, _), UvicornThread(
            engine_app(InferenceSettings(model=str(model_path), served_model_name="judge",
                                         device="auto", port=0, max_batch_size=4, seed=0,
                                         log_json=False))) as engine:
        wait_healthy(f"{engine.url}/healthz", timeout_s=600)
        yield mcp_url, f"{engine.url}/v1"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcprl_art.parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge-model", type=Path, required=True,
                        help="local model folder the engine serves as the judge of both sides")
    parser.add_argument("--max-tokens", type=int, default=512,
                        help="max_tokens of every judge call, both sides (default 512)")
    parser.add_argument("--groups", type=int, default=None, help="use the first N groups")
    parser.add_argument("--out", type=Path, default=Path("runs/art-parity/report.json"))
    args = parser.parse_args(argv)
    if not (args.judge_model / "config.json").is_file():
        print(f"error: {args.judge_model} is not a model folder (no config.json)",
              file=sys.stderr)
        return 2
    workdir = args.out.parent
    workdir.mkdir(parents=True, exist_ok=True)
    with _serve(args.judge_model, workdir) as (mcp_url, engine_url):
        report = asyncio.run(run_parity(mcp_url=mcp_url, engine_url=engine_url, model="judge",
                                        workdir=workdir, max_tokens=args.max_tokens,
                                        n_groups=args.groups,
                                        progress=args.out.with_suffix(".rows.jsonl")))
    report["judge_model_path"] = str(args.judge_model)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    summary = {k: v for k, v in report.items() if k not in ("rows", "first_requests")}
    summary["per_group"] = [{"art": r["art"]["scores"] or r["art"]["error"],
                             "ours": r["ours"]["scores"] or r["ours"]["error"]}
                            for r in report["rows"]]
    print(json.dumps(summary, indent=2))
    print(f"full report: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
