"""Render ``.env.example``: every variable compose and the services read, with its default
and description, grouped by service. ``mcprl-stack env-example > .env.example``."""

from __future__ import annotations

import textwrap

from mcprl_stack.envvars import EnvVar, all_vars

# Variables compose.yaml itself interpolates (images, GPU knobs, published ports ...).
COMPOSE_VARS: list[tuple[str, str, str]] = [
    ("INFERENCE_MODEL", "Qwen/Qwen2.5-3B-Instruct",
     "Model served by vLLM (HF id or a path inside the container) and trained by the trainer. "
     "Judge, generator and policy default to it. (Also our engine's setting, see below.)"),
    ("VLLM_IMAGE", "vllm/vllm-openai:v0.17.1", "vLLM OpenAI server image (pinned tag)."),
    ("VLLM_GPU_ID", "0", "GPU (index or UUID) reserved for vLLM."),
    ("TRAIN_GPU_ID", "0", "GPU reserved for the trainer; the same as vLLM's on a one-GPU host."),
    ("VLLM_GPU_ID_2", "1", "compose.replicas.yaml only: GPU of the second vLLM replica."),
    ("INFERENCE_PORT_2", "8001", "compose.replicas.yaml only: host port of the second vLLM "
     "replica."),
    ("VLLM_GPU_MEMORY_UTILIZATION", "0.45",
     "Share of GPU memory vLLM takes; the rest is the trainer's when both share one GPU."),
    ("VLLM_MAX_MODEL_LEN", "16384", "Context length vLLM serves."),
    ("VLLM_MAX_LORAS", "4", "LoRA adapters vLLM keeps loaded at once."),
    ("HF_TOKEN", "", "Hugging Face token for gated models (optional; never baked into images)."),
    ("MCP_SERVER_IMAGE", "localhost/mcprl/mcp-server:local",
     "Image of the mcp-server service. Swap in your own server's image (serving Streamable HTTP) "
     "and set MCP_SERVER_PORT, MCP_URL and, if it has no python, MCP_SERVER_HEALTHCHECK."),
    ("MCP_SERVER_PORT", "8903", "Port the MCP server container listens on."),
    ("MCP_SERVER_HEALTHCHECK", "",
     "Shell command that succeeds when the MCP server container is up "
     "(default: python fetching http://127.0.0.1:8903/healthz)."),
    ("MCPRL_IMAGE_TAG", "local", "Tag of the images compose builds from this repository."),
    ("TRAIN_CONFIG", "/configs/qwen2.5-3b.yaml",
     "Trainer run config inside the container (./configs is mounted at /configs); "
     "compose.cpu.yaml defaults to /configs/compose-cpu.yaml."),
    ("PUBLISH_HOST", "127.0.0.1", "Host interface the published ports bind (0.0.0.0: all)."),
    ("PROMETHEUS_PORT", "9090", "Published Prometheus port."),
    ("PROMETHEUS_RETENTION", "15d", "How long Prometheus keeps samples."),
    ("GRAFANA_PORT", "3000", "Published Grafana port."),
    ("GRAFANA_ADMIN_USER", "admin", "Grafana admin user."),
    ("GRAFANA_ADMIN_PASSWORD", "admin",
     "Grafana admin password (change it; anonymous users get read-only dashboards)."),
    ("CPU_MODEL", "/checkpoints/warm-start",
     "compose.cpu.yaml only: model our engine serves and the trainer trains "
     "(./demo/checkpoints is mounted at /checkpoints, ./models at /models)."),
    ("PYTHON_IMAGE", "python:3.11.11-slim-bookworm",
     "Base of every image built from this repository (docker/bases.sh builds a stand-in from "
     "Debian packages for hosts that cannot reach Docker Hub)."),
    ("BUSYBOX_IMAGE", "busybox:1.37.0", "Image of the init-volumes step."),
    ("PROMETHEUS_IMAGE", "prom/prometheus:v3.5.0", "Prometheus image."),
    ("GRAFANA_IMAGE", "grafana/grafana:12.1.1", "Grafana image."),
    ("TORCH_INDEX_URL", "",
     "Wheel index for torch alone when building the trainer and inference images (such as "
     "PyTorch's CPU wheel index); a wheel in docker/wheels/ is taken first."),
]
# Defaults that differ in compose from the code's (service names instead of loopback).
COMPOSE_DEFAULTS: dict[str, str] = {
    "MCP_URL": "http://mcp-server:8903/mcp",
    "JUDGE_URL": "http://judge:8920",
    "SCENARIO_GEN_URL": "http://scenario-gen:8910",
    "POLICY_BASE_URL": "http://inference:8000/v1",
    "JUDGE_BASE_URL": "http://inference:8000/v1",
    "GENERATOR_BASE_URL": "http://inference:8000/v1",
    "JUDGE_MODEL": "${INFERENCE_MODEL}",
    "GENERATOR_MODEL": "${INFERENCE_MODEL}",
    "POLICY_MODEL": "${INFERENCE_MODEL}",
    "MCP_ALLOWED_HOSTS": "mcp-server",
    "INVENTORY_ALLOWED_HOSTS": "inventory-mcp",
}
WIRING = ("MCP_URL", "MCP_AUTH_TOKEN", "JUDGE_URL", "SCENARIO_GEN_URL", "POLICY_BASE_URL",
          "POLICY_MODEL", "POLICY_API_KEY")
TITLES = {
    "mcp-server": "mcp-server: the company-db MCP server (MCP_*)",
    "inference": "inference: our OpenAI-compatible engine (INFERENCE_*; vLLM in GPU compose)",
    "scenario-gen": "scenario-gen (SCENARIO_GEN_*) and its generator LLM (GENERATOR_*)",
    "judge": "judge (JUDGE_*): the service and its judge LLM",
    "trainer": "trainer: any run-config field as TRAINER_<FIELD> or TRAINER_<SECTION>__<FIELD>",
    "inventory-mcp": "inventory-mcp: the example MCP server (INVENTORY_*)",
    "stack": "make stack / mcprl-stack (STACK_*): the services as local processes",
}
HEADER = """\
# mcp-rl settings. Copy to .env and uncomment what you change:
#   cp .env.example .env
# docker compose reads .env for the variables compose.yaml uses and passes the file to our
# services' containers; `make stack` reads the same names from your shell environment.
# Every variable the services read is listed (generated from their settings classes by
# `mcprl-stack env-example`; tests check the list is complete). Nothing here is required:
# by default the judge and the scenario generator use the local engine, so no API key is
# needed. To use a hosted model instead (OpenRouter, OpenAI, another vLLM):
#   JUDGE_BASE_URL=https://<provider>/api/v1  JUDGE_MODEL=<model>  JUDGE_API_KEY=<key>
# <NAME>_PORT is where you reach a service on this host: the port it listens on under
# `make stack`, the published port under compose (containers keep their usual ports).
"""


def _entry(name: str, default: str, description: str, secret: bool = False) -> str:
    lines = textwrap.wrap(description, 96, initial_indent="# ", subsequent_indent="# ") \
        if description else []
    value = "" if secret else default
    lines.append(f"# {name}={value}")
    return "\n".join(lines)


def render() -> str:
    """The whole ``.env.example`` text."""

    per_service = all_vars()
    seen: set[str] = set()
    blocks = [HEADER]

    def section(title: str, entries: list[str]) -> None:
        if entries:
            bar = "#" * 100
            blocks.append(f"{bar}\n# {title}\n{bar}\n" + "\n".join(entries) + "\n")

    section("compose: images, GPUs, published ports",
            [_entry(n, d, desc) for n, d, desc in COMPOSE_VARS])
    seen.update(n for n, _, _ in COMPOSE_VARS)

    by_name: dict[str, EnvVar] = {}
    for items in per_service.values():
        for var in items:
            if var.name not in by_name or not by_name[var.name].description:
                by_name[var.name] = var
    wiring = []
    for name in WIRING:
        var = by_name.get(name)
        if var is not None:
            wiring.append(_entry(name, COMPOSE_DEFAULTS.get(name, var.default),
                                 var.description, var.secret))
            seen.add(name)
    section("pipeline wiring: where each client finds the others (compose values shown)", wiring)

    for service, items in per_service.items():
        entries = []
        for var in items:
            if var.name in seen:
                continue
            seen.add(var.name)
            var = by_name.get(var.name, var)
            entries.append(_entry(var.name, COMPOSE_DEFAULTS.get(var.name, var.default),
                                  var.description, var.secret))
        section(TITLES.get(service, service), entries)
    return "\n".join(blocks)


def names_in(text: str) -> set[str]:
    """Variable names an env file mentions, set (``NAME=``) or commented (``# NAME=``)."""

    out: set[str] = set()
    for line in text.splitlines():
        body = line.lstrip("#").strip()
        name, sep, _ = body.partition("=")
        if sep and name.replace("_", "").isalnum() and name.isupper() and " " not in name:
            out.add(name)
    return out
