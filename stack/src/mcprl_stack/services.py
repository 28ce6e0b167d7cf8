"""The services of the stack: how each one is started, checked and wired to the others.

The names are compose's service names; the environment each process gets uses the same
variable names as its container in ``compose.yaml``. Only the wiring differs: loopback
addresses and files under the stack's run directory instead of service names and volumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcprl_stack.config import StackSettings


@dataclass(frozen=True)
class ServiceSpec:
    """One service: its console script, env prefix, port and probes."""

    name: str
    script: str
    prefix: str
    default_port: int
    args: tuple[str, ...] = ()
    health_path: str = "/healthz"
    metrics_path: str = "/metrics"
    depends_on: tuple[str, ...] = ()
    job: bool = False  # runs to completion (the trainer), unlike the servers
    port_var: str = field(default="")

    @property
    def port_env(self) -> str:
        return self.port_var or f"{self.prefix}PORT"

    @property
    def host_env(self) -> str:
        return f"{self.prefix}HOST"


SERVICES: dict[str, ServiceSpec] = {
    spec.name: spec
    for spec in (
        ServiceSpec("mcp-server", "mcprl-mcp-server", "MCP_", 8903),
        ServiceSpec("inventory-mcp", "mcprl-example-inventory", "INVENTORY_", 8904),
        ServiceSpec("inference", "mcprl-inference", "INFERENCE_", 8000, health_path="/health"),
        ServiceSpec("scenario-gen", "mcprl-scenario-gen", "SCENARIO_GEN_", 8910,
                    args=("serve",), depends_on=("inference",)),
        ServiceSpec("judge", "mcprl-judge", "JUDGE_", 8920, depends_on=("inference",)),
        ServiceSpec("trainer", "mcprl-train", "TRAINER_", 8930, job=True,
                    depends_on=("mcp-server", "inventory-mcp", "inference", "scenario-gen",
                                "judge")),
    )
}
MCP_SERVERS = ("mcp-server", "inventory-mcp")
DEFAULT_SERVICES = ("mcp-server", "inference", "scenario-gen", "judge")


def start_order(names: list[str] | tuple[str, ...]) -> list[list[str]]:
    """Group the selected services into levels: each level only needs earlier levels.

    Dependencies on services that are not selected are ignored (the user points the
    service elsewhere, e.g. the judge at a hosted model).
    """

    unknown = [n for n in names if n not in SERVICES]
    if unknown:
        raise ValueError(f"unknown service(s) {unknown}; known: {', '.join(SERVICES)}")
    selected = list(dict.fromkeys(names))
    placed: set[str] = set()
    levels: list[list[str]] = []
    while len(placed) < len(selected):
        level = [n for n in selected if n not in placed
                 and all(d in placed or d not in selected for d in SERVICES[n].depends_on)]
        if not level:  # pragma: no cover - the table above has no cycle
            raise ValueError(f"dependency cycle among {set(selected) - placed}")
        levels.append(level)
        placed.update(level)
    return levels


def _upstream_env(prefix: str, inference: str | None,
                  served_model: str | None) -> dict[str, str]:
    """An OpenAI-compatible upstream (``<prefix>BASE_URL``/``MODEL``) pointed at the engine."""

    if not inference:
        return {}
    env = {f"{prefix}BASE_URL": f"{inference}/v1"}
    if served_model:
        env[f"{prefix}MODEL"] = served_model
    return env


def service_env(name: str, config: StackSettings, urls: dict[str, str], data_dir: Path,
                served_model: str | None) -> dict[str, str]:
    """The stack's defaults for one service (the user's environment may override them)."""

    env: dict[str, str] = {}
    inference = urls.get("inference")
    mcp_url = config.mcp_url or (f"{urls[config.mcp]}/mcp" if config.mcp in urls else None)
    if name == "mcp-server":
        env["MCP_DB_PATH"] = str(data_dir / "company.db")
    elif name == "inventory-mcp":
        env["INVENTORY_DB_PATH"] = str(data_dir / "inventory.db")
    elif name == "inference":
        env["INFERENCE_MODEL"] = config.model
    elif name == "scenario-gen":
        env["SCENARIO_GEN_DATA_DIR"] = str(data_dir / "scenarios")
        env.update(_upstream_env("GENERATOR_", inference, served_model))
    elif name == "judge":
        env["JUDGE_CACHE_PATH"] = str(data_dir / "judge-cache.sqlite3")
        env.update(_upstream_env("JUDGE_", inference, served_model))
    elif name == "trainer":
        env["TRAINER_OUTPUT_DIR"] = str(config.runs_dir.resolve() / "train")
        env["TRAINER_MODEL"] = config.model  # train the weights the engine serves
        if inference:
            env["POLICY_BASE_URL"] = f"{inference}/v1"
            if served_model:
                env["POLICY_MODEL"] = served_model
        if "judge" in urls:
            env["JUDGE_URL"] = urls["judge"]
        if "scenario-gen" in urls:
            env["SCENARIO_GEN_URL"] = urls["scenario-gen"]
    if mcp_url and name in ("scenario-gen", "trainer"):
        env["MCP_URL"] = mcp_url
    return env
