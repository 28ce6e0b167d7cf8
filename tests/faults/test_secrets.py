"""API keys and the MCP bearer token never show up in what a run writes or serves: every log,
every file of the run and of the services' data, every /metrics and status page, and the
error bodies of requests that fail while carrying them. The fault stack runs with an MCP
token, a judge key and a generator key; the trainer gets the token and an engine key.

Cost: one 2-step run with an eval (~25 s).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(240)]
POLICY_KEY = "sk-policy-5b0e93c1d7a24f68"


def _texts(root: Path) -> dict[str, str]:
    """Every file under ``root`` as text (binary ones too: a key would be ASCII in them)."""

    out = {}
    for path in root.rglob("*"):
        if path.is_file():
            out[str(path)] = path.read_bytes().decode("latin-1")
    return out


def test_no_secret_in_anything_a_run_writes_or_serves(fault_stack, stack_secrets, trainer,
                                                      tmp_path) -> None:
    secrets = {**stack_secrets, "POLICY_API_KEY": POLICY_KEY}
    token = stack_secrets["MCP_AUTH_TOKEN"]
    urls = fault_stack.urls
    config = fault_stack.run_config(tmp_path, "secrets", steps=2,
                                    policy={"api_key": POLICY_KEY},
                                    eval={"every": 2, "max_scenarios": 2})
    run = trainer(config).start()
    served: dict[str, str] = {}
    run.wait_for(lambda s: (s.get("last_step") or {}).get("step", 0) >= 1, "step 1")
    served["trainer /metrics"] = run.metrics()
    served["trainer /v1/status"] = httpx.get(f"http://127.0.0.1:{run.port}/v1/status",
                                             timeout=5).text
    assert run.wait() == 0, run.tail()

    with httpx.Client(timeout=30) as client:
        for name, url in urls.items():
            served[f"{name} /metrics"] = client.get(f"{url}/metrics").text
            health = "/health" if name == "inference" else "/healthz"
            served[f"{name} {health}"] = client.get(url + health).text
        # Requests that fail while carrying a secret: the error must not echo it.
        served["scenario-gen, wrong MCP URL"] = client.post(
            f"{urls['scenario-gen']}/v1/scenario-sets",
            json={"mcp_url": f"{urls['judge']}/mcp", "auth_token": token, "n": 4}).text
        served["scenario-gen, bad request"] = client.post(
            f"{urls['scenario-gen']}/v1/scenario-sets",
            json={"mcp_url": fault_stack.mcp_url, "auth_token": token, "n": -1}).text
        served["mcp-server, wrong token"] = client.post(
            fault_stack.mcp_url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"authorization": f"Bearer {token}x",
                     "accept": "application/json, text/event-stream"}).text
        served["engine, bad request"] = client.post(
            f"{fault_stack.engine_url}/completions", json={"model": POLICY_KEY, "prompt": 5},
            headers={"authorization": f"Bearer {POLICY_KEY}"}).text
        sets = client.get(f"{urls['scenario-gen']}/v1/scenario-sets").text
        served["scenario-gen /v1/scenario-sets"] = sets

    written = {**_texts(fault_stack.runs_dir), **_texts(tmp_path)}  # logs, data, the run
    assert any(p.endswith("trainer.log") or p.endswith("secrets.log") for p in written)
    assert any("checkpoints" in p for p in written) and any(p.endswith(".log") for p in written)
    # The search sees secrets where they are: the run config this test wrote holds two.
    own = [t for p, t in written.items() if p.endswith("secrets.yaml")]
    assert own and token in own[0] and POLICY_KEY in own[0]
    for name, secret in secrets.items():
        leaks = [where for where, text in {**written, **served}.items()
                 if secret in text and not where.endswith("secrets.yaml")]
        assert not leaks, f"{name} found in {leaks}"
    # (secrets.yaml is the run config the test itself wrote, secrets in it by design; the
    # trainer's own copy in the run directory, config.yaml, is checked above.)
    assert (run.run_dir / "config.yaml").exists()
