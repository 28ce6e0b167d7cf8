"""compose.yaml, compose.cpu.yaml, .env.example, Prometheus/Grafana provisioning and every
Dockerfile, checked without a Docker engine: the compose-spec schema (vendored by
check-jsonschema, no network) plus what a schema cannot see."""

from __future__ import annotations

import copy
import importlib.resources
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from mcprl_stack.envfile import COMPOSE_VARS, names_in
from mcprl_stack.envvars import PACKAGES, service_vars
from mcprl_stack.services import SERVICES

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]
OUR_SERVICES = ("mcp-server", "inventory-mcp", "inference", "scenario-gen", "judge", "trainer")
GPU_SERVICES = ("inference", "trainer")
SECRET_WORDS = {"KEY", "TOKEN", "SECRET", "PASSWORD", "APIKEY", "PASSWD"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])((?:[^{}]|\{[^{}]*\})*))?\}")


# -- loading compose files (with compose's !reset / !override tags) --------------------------

class Reset:
    """compose's ``!reset``: drop the key from the merged model."""


class Override:
    def __init__(self, value: Any) -> None:
        self.value = value


class ComposeLoader(yaml.SafeLoader):
    pass


ComposeLoader.add_constructor("!reset", lambda loader, node: Reset())
ComposeLoader.add_constructor(
    "!override", lambda loader, node: Override(
        loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
        else loader.construct_mapping(node, deep=True)))

_REPLACED = {"command", "entrypoint", "test"}  # sequences compose replaces instead of merging


def load(name: str) -> dict[str, Any]:
    return yaml.load((REPO / name).read_text(), Loader=ComposeLoader)


def merge(base: Any, over: Any, key: str = "") -> Any:
    """compose's merge rules, as far as our files use them."""

    if isinstance(over, Override):
        return over.value
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if isinstance(v, Reset):
                out.pop(k, None)
            elif k in out:
                out[k] = merge(out[k], v, k)
            else:
                out[k] = v.value if isinstance(v, Override) else v
        return out
    if isinstance(base, list) and isinstance(over, list) and key not in _REPLACED:
        return base + [v for v in over if v not in base]
    return over


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load("compose.yaml")


@pytest.fixture(scope="module")
def compose_cpu(compose: dict[str, Any]) -> dict[str, Any]:
    return merge(copy.deepcopy(compose), load("compose.cpu.yaml"))


def _schema() -> dict[str, Any]:
    ref = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / \
        "compose-spec.json"
    return json.loads(ref.read_text())


def _default(value: str) -> str:
    """``${VAR:-default}`` -> default (recursively), what compose uses with an empty .env."""

    for _ in range(5):
        new = _VAR.sub(lambda m: m.group(3) or "", value)
        if new == value:
            break
        value = new
    return value


def is_secret(name: str) -> bool:
    """JUDGE_API_KEY, MCP_AUTH_TOKEN, GF_SECURITY_ADMIN_PASSWORD (not TOKENIZERS_...)."""

    return bool(set(name.upper().split("_")) & SECRET_WORDS)


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def with_replicas(compose: dict[str, Any]) -> dict[str, Any]:
    """compose.yaml + compose.replicas.yaml, its ``extends`` resolved as compose does."""

    over = load("compose.replicas.yaml")
    for svc in over["services"].values():
        ext = svc.pop("extends", None)
        if ext is not None:
            base = load(ext["file"])["services"][ext["service"]]
            svc.update(merge(copy.deepcopy(base), dict(svc)))
    return merge(copy.deepcopy(compose), over)


# -- the schema ------------------------------------------------------------------------------

def test_compose_yaml_is_valid_compose_spec() -> None:
    cli = Path(sys.executable).parent / "check-jsonschema"
    res = subprocess.run([str(cli), "--builtin-schema", "vendor.compose-spec",
                          str(REPO / "compose.yaml")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_replicas_override_is_valid_and_spreads_rollouts(compose: dict[str, Any]) -> None:
    """The second engine: its own GPU and host port, the trainer's URLs name both."""

    merged = with_replicas(compose)
    schema = _schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert [e.message for e in validator.iter_errors(merged)] == []
    one, two = merged["services"]["inference"], merged["services"]["inference-2"]
    assert two["command"] == one["command"] and two["volumes"] == one["volumes"]
    assert [_default(p) for p in two["ports"]] == ["127.0.0.1:8001:8000"]
    gpu = two["deploy"]["resources"]["reservations"]["devices"]
    assert [_default(g) for d in gpu for g in d["device_ids"]] == ["1"]
    trainer = merged["services"]["trainer"]
    urls = _default(_env(trainer)["POLICY_BASE_URLS"]).split(",")
    assert urls == ["http://inference:8000/v1", "http://inference-2:8000/v1"]
    assert trainer["depends_on"]["inference-2"] == {"condition": "service_healthy"}
    assert "POLICY_BASE_URL" in _env(trainer)  # the single-engine name still works


def test_cpu_override_merged_is_valid_compose_spec(compose_cpu: dict[str, Any]) -> None:
    schema = _schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(compose_cpu)]
    assert errors == []
    broken = copy.deepcopy(compose_cpu)  # control: the validator does catch mistakes
    broken["services"]["judge"]["healthcheck"]["retry"] = 3  # misspelt key
    broken["services"]["judge"]["depends_on"]["inference"]["condition"] = "when_ready"
    assert len(list(validator.iter_errors(broken))) >= 2


# -- what the schema cannot see ---------------------------------------------------------------

@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_dependencies_exist_and_wait_on_real_healthchecks(
        variant: str, compose: dict[str, Any], compose_cpu: dict[str, Any]) -> None:
    doc = compose if variant == "gpu" else compose_cpu
    services = doc["services"]
    for name, svc in services.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            if spec["condition"] == "service_healthy":
                test = (services[dep].get("healthcheck") or {}).get("test")
                assert test and test != ["NONE"], f"{name} waits on {dep} without a healthcheck"
    for name in (*OUR_SERVICES, "prometheus", "grafana"):
        assert services[name].get("healthcheck", {}).get("test"), name


def test_gpu_reservations(compose: dict[str, Any], compose_cpu: dict[str, Any]) -> None:
    for name in GPU_SERVICES:
        devices = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", [])
                   for d in devices), name
        assert "deploy" not in compose_cpu["services"][name], f"CPU {name} still reserves a GPU"
    for name, svc in compose["services"].items():
        if name not in GPU_SERVICES:
            assert "deploy" not in svc, f"{name} should not reserve a GPU"


def test_vllm_service_as_the_project_needs_it(compose: dict[str, Any]) -> None:
    svc = compose["services"]["inference"]
    image = _default(svc["image"])
    assert image.startswith("vllm/vllm-openai:v"), image
    flags = " ".join(_default(c) for c in svc["command"])
    for flag in ("--enable-lora", "--max-lora-rank=16", "--enable-auto-tool-choice",
                 "--tool-call-parser=hermes", "--enable-sleep-mode", "--port=8000",
                 "--host=0.0.0.0"):
        assert flag in flags, flag
    assert "--model=Qwen/Qwen2.5-3B-Instruct" in flags  # from INFERENCE_MODEL by default
    env = _env(svc)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert svc.get("shm_size") or svc.get("ipc") == "host"


def _host_path(svc: dict[str, Any], path: str) -> Path | None:
    """The repository path a container path of ``svc`` is bind-mounted from, if any."""

    for vol in svc.get("volumes", []):
        source, target = vol.split(":")[:2]
        if source.startswith("./") and Path(path).is_relative_to(target):
            return REPO / source / Path(path).relative_to(target)
    return None


def test_cpu_override_serves_our_engine_with_a_model_that_learns(
        compose_cpu: dict[str, Any]) -> None:
    """The CPU stack's default policy is the demo's warm start, which solves some scenarios
    (reward variance in its groups), not a random tiny model on which nothing trains."""

    svc = compose_cpu["services"]["inference"]
    assert _default(svc["image"]).startswith("localhost/mcprl/inference:")
    assert svc["pull_policy"] == "build"
    assert svc["build"]["dockerfile"] == "inference/Dockerfile"
    assert svc["command"] == ["mcprl-inference"]
    model = _default(_env(svc)["INFERENCE_MODEL"])
    for name in ("inference", "trainer"):
        host = _host_path(compose_cpu["services"][name], model)
        assert host is not None and (host / "model.safetensors").is_file(), (name, model)
        assert (host / "warmstart.json").is_file(), f"{model} is not a warm-started agent"
        assert not (host / "mcprl-tiny.json").exists(), f"{model} is a random tiny model"
    for name, var in (("judge", "JUDGE_MODEL"), ("scenario-gen", "GENERATOR_MODEL"),
                      ("trainer", "POLICY_MODEL"), ("trainer", "TRAINER_MODEL")):
        assert _default(_env(compose_cpu["services"][name])[var]) == model, (name, var)


def test_adapters_shared_at_the_same_path(compose: dict[str, Any]) -> None:
    def mounts(name: str) -> dict[str, str]:
        out = {}
        for vol in compose["services"][name].get("volumes", []):
            source, target = vol.split(":")[:2]
            out[source] = target
        return out

    inference, trainer = mounts("inference"), mounts("trainer")
    assert "adapters" in compose["volumes"]
    assert inference["adapters"] == trainer["adapters"]
    output_dir = _env(compose["services"]["trainer"])["TRAINER_OUTPUT_DIR"]
    assert Path(output_dir).is_relative_to(trainer["adapters"])  # what it saves, vLLM can read


def test_named_volumes_for_state(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} mounts undeclared volume {source}"
    expected = {"mcp-server": "MCP_DB_PATH", "judge": "JUDGE_CACHE_PATH",
                "scenario-gen": "SCENARIO_GEN_DATA_DIR", "inventory-mcp": "INVENTORY_DB_PATH"}
    for name, var in expected.items():
        path = _env(compose["services"][name])[var]
        targets = [v.split(":")[1] for v in compose["services"][name]["volumes"]
                   if v.split(":")[0] in declared]
        assert any(Path(path).is_relative_to(t) for t in targets), (name, path, targets)


def test_images_pinned_and_no_required_secrets(compose: dict[str, Any]) -> None:
    for path in ("compose.yaml", "compose.cpu.yaml", "compose.replicas.yaml"):
        assert ":?" not in (REPO / path).read_text(), f"{path}: a variable is made required"
    for name, svc in compose["services"].items():
        image = _default(svc["image"])
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{name}: {image}"
        for key, value in _env(svc).items():
            if is_secret(key):
                assert value.startswith("${"), f"{name}: {key} has a literal value"


def test_our_images_are_built_never_pulled(compose: dict[str, Any]) -> None:
    """A registry must never stand in for an image of this repository (name squatting)."""

    for name, svc in compose["services"].items():
        if "build" not in svc:
            continue
        image = _default(svc["image"])
        assert image.startswith("localhost/mcprl/"), (name, image)
        if name != "mcp-server":  # swappable: MCP_SERVER_IMAGE may name a registry image
            assert svc.get("pull_policy") == "build", name


def test_ports_match_the_services_and_the_stack(compose: dict[str, Any]) -> None:
    for name in OUR_SERVICES:
        spec = SERVICES[name]
        svc = compose["services"][name]
        container_ports = {_default(p).rsplit(":", 1)[1] for p in svc["ports"]}
        assert container_ports == {str(spec.default_port)}, (name, svc["ports"])
        assert all(_default(p).startswith("127.0.0.1:") for p in svc["ports"]), name
        if name != "inference":  # vLLM takes --port
            env = _env(svc)
            assert env[spec.port_env] == str(spec.default_port)
            assert env[spec.host_env] == "0.0.0.0"


def test_pipeline_wiring_points_at_compose_services(compose: dict[str, Any]) -> None:
    env = {name: {k: _default(v) for k, v in _env(svc).items()}
           for name, svc in compose["services"].items()}
    assert env["trainer"]["MCP_URL"] == "http://mcp-server:8903/mcp"
    assert env["scenario-gen"]["MCP_URL"] == "http://mcp-server:8903/mcp"
    assert env["trainer"]["JUDGE_URL"] == "http://judge:8920"
    assert env["trainer"]["SCENARIO_GEN_URL"] == "http://scenario-gen:8910"
    for svc, var in (("trainer", "POLICY_BASE_URL"), ("judge", "JUDGE_BASE_URL"),
                     ("scenario-gen", "GENERATOR_BASE_URL")):
        assert env[svc][var] == "http://inference:8000/v1"
    model = "Qwen/Qwen2.5-3B-Instruct"
    for svc, var in (("trainer", "POLICY_MODEL"), ("trainer", "TRAINER_MODEL"),
                     ("judge", "JUDGE_MODEL"), ("scenario-gen", "GENERATOR_MODEL")):
        assert env[svc][var] == model, (svc, var)
    image = compose["services"]["mcp-server"]["image"]
    assert image.startswith("${MCP_SERVER_IMAGE:-"), "the MCP server image must be swappable"


# -- Prometheus and Grafana -------------------------------------------------------------------

def test_prometheus_scrapes_every_service(compose: dict[str, Any]) -> None:
    prom = yaml.safe_load((REPO / "monitoring/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    for name in OUR_SERVICES:
        spec = SERVICES[name]
        job = jobs.get(name)
        assert job is not None, f"no scrape job for {name}"
        targets = [t for sc in job["static_configs"] for t in sc["targets"]]
        assert targets == [f"{name}:{spec.default_port}"]
        assert job.get("metrics_path", "/metrics") == spec.metrics_path
        assert name in compose["services"]
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./monitoring/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_grafana_provisioning_is_consistent(compose: dict[str, Any]) -> None:
    base = REPO / "monitoring/grafana"
    ds = yaml.safe_load((base / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    providers = yaml.safe_load((base / "provisioning/dashboards/mcp-rl.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    mounts = dict(v.split(":")[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./monitoring/grafana/dashboards"] == path
    assert mounts["./monitoring/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboard = json.loads((base / "dashboards/mcp-rl.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    assert uids == {source["uid"]}
    home = _env(compose["services"]["grafana"])["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/mcp-rl.json"


def test_dashboard_json_is_generated_from_its_table() -> None:
    spec = importlib.util.spec_from_file_location(
        "build_dashboard", REPO / "monitoring/grafana/build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = json.loads((REPO / "monitoring/grafana/dashboards/mcp-rl.json").read_text())
    assert committed == module.build(), "run monitoring/grafana/build_dashboard.py"
    titles = [p["title"] for p in committed["panels"] if p["type"] == "row"]
    assert titles[:5] == ["Training", "Rollouts", "MCP server", "Judge",
                          "Inference (vLLM metric names)"]


# -- .env.example -----------------------------------------------------------------------------

SERVICE_DIRS = {"mcp-server": "mcp-server", "inference": "inference",
                "scenario-gen": "scenario-gen", "judge": "judge", "trainer": "trainer",
                "inventory-mcp": "examples/inventory-mcp", "stack": "stack"}


@pytest.mark.parametrize("service", list(PACKAGES))
def test_env_example_lists_every_variable_the_service_reads(service: str) -> None:
    if not (REPO / SERVICE_DIRS[service] / "pyproject.toml").exists():
        pytest.skip(f"{service} is not in this checkout")
    found = service_vars(service)
    assert found, f"no settings found for {service}: is its package installed?"
    listed = names_in((REPO / ".env.example").read_text())
    missing = sorted(v.name for v in found if v.name not in listed)
    assert not missing, (f"{service} reads {missing} but .env.example does not list them: "
                         "run `.venv/bin/mcprl-stack env-example > .env.example`")


def test_env_example_lists_every_compose_variable() -> None:
    listed = names_in((REPO / ".env.example").read_text())
    used = set()
    for path in ("compose.yaml", "compose.cpu.yaml", "compose.replicas.yaml"):
        used |= {m.group(1) for m in _VAR.finditer((REPO / path).read_text())}
    assert used - listed == set()
    assert {n for n, _, _ in COMPOSE_VARS} - used == set(), "COMPOSE_VARS lists unused names"


def test_env_example_sets_no_secret() -> None:
    for line in (REPO / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            assert not (is_secret(name) and value.strip()), line


# -- Dockerfiles ------------------------------------------------------------------------------

def lint_dockerfile(text: str) -> list[str]:
    """The basics: pinned base, non-root user, a HEALTHCHECK, pinned deps, no baked secrets."""

    problems: list[str] = []
    lines = re.sub(r"\\\n", " ", text).splitlines()
    instructions = [[*ln.split(None, 1), ""][:2] for ln in lines
                    if ln.strip() and not ln.lstrip().startswith("#")]
    instructions = [(op.upper(), arg.strip()) for op, arg in instructions]
    froms = [i for i, (op, _) in enumerate(instructions) if op == "FROM"]
    if not froms:
        return ["no FROM"]
    # ARGs before the first FROM may name the base: their defaults must be pinned.
    base_args = dict(arg.partition("=")[::2] for op, arg in instructions[:froms[0]]
                     if op == "ARG")
    stages = set()
    for i in froms:
        words = [w for w in instructions[i][1].split() if not w.startswith("--")]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: base_args.get(m.group(1), ""), words[0])
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2])
        if image in stages or image == "scratch":
            continue
        name = image.split("@")[0]
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
        if "@sha256:" not in image and (not tag or tag == "latest"):
            problems.append(f"base image not pinned: {image}")
    final = instructions[froms[-1]:]
    users = [arg for op, arg in final if op == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append("final stage runs as root (no USER)")
    health = [arg for op, arg in final if op == "HEALTHCHECK"]
    if not health or health[-1].upper().startswith("NONE"):
        problems.append("no HEALTHCHECK")
    args: dict[str, str] = {}
    for op, arg in instructions:
        if op == "ARG":
            key, _, value = arg.partition("=")
            args[key.strip()] = value.strip().strip('"')
        if op in ("ENV", "ARG"):
            for part in shlex.split(arg):
                key, sep, value = part.partition("=")
                if is_secret(key) and sep and value:
                    problems.append(f"{op} {key} bakes a secret default")
        if op == "RUN":
            arg = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), arg)
            for cmd in re.split(r"&&|;|\|\|", arg):
                words = shlex.split(cmd.replace("\\", " "))
                if "install" not in words:
                    continue
                head = words[:words.index("install")]
                if head[-1:] in (["pip"], ["pip3"]) or head[-2:] == ["-m", "pip"]:
                    rest = words[len(head) + 1:]
                    if "-c" in rest or "--constraint" in rest or "-r" in rest:
                        continue
                    pkgs = [w for w in rest if not w.startswith(("-", ".", "/"))]
                    loose = [p for p in pkgs if "==" not in p and "@" not in p]
                    if loose and "--no-deps" not in rest:
                        problems.append(f"unpinned pip install: {' '.join(loose)}")
    return problems


def _dockerfiles() -> list[Path]:
    found = sorted({*REPO.glob("*/Dockerfile"), *REPO.glob("examples/*/Dockerfile")})
    return [p for p in found if ".venv" not in p.parts]


def test_dockerfile_linter_catches_the_basics() -> None:
    bad = ("FROM python:latest\nENV OPENAI_API_KEY=sk-123 TOKENIZERS_PARALLELISM=false\n"
           "RUN pip install requests\n"
           "CMD [\"x\"]\n")
    problems = " | ".join(lint_dockerfile(bad))
    for expected in ("not pinned", "root", "HEALTHCHECK", "secret", "unpinned pip"):
        assert expected in problems, problems
    assert "not pinned" in " ".join(lint_dockerfile("ARG BASE=python\nFROM ${BASE}\n"))
    good = ("ARG BASE=python:3.11.11-slim-bookworm\nFROM ${BASE} AS base\n"
            "ARG HF_TOKEN\nARG PIN=torch==2.13.0\n"
            "RUN pip install -c constraints.txt ./x && pip install --no-deps ./y\n"
            "RUN pip install \"${PIN}\"\nUSER app\n"
            "HEALTHCHECK CMD python -c 'print(1)'\n")
    assert lint_dockerfile(good) == []


def test_every_service_has_a_dockerfile() -> None:
    names = {p.parent.relative_to(REPO).as_posix() for p in _dockerfiles()}
    assert "examples/inventory-mcp" in names
    for service in ("mcp-server", "inference", "scenario-gen", "judge", "trainer"):
        if (REPO / service / "pyproject.toml").exists():
            assert service in names, f"{service}/Dockerfile is missing"


@pytest.mark.parametrize("path", _dockerfiles(), ids=lambda p: p.parent.name)
def test_dockerfile_basics(path: Path) -> None:
    assert lint_dockerfile(path.read_text()) == []


def test_dockerfiles_build_from_the_repository_root(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        build = svc.get("build")
        if build:
            assert build["context"] == "."
            dockerfile = REPO / build["dockerfile"]
            if dockerfile.parent.joinpath("pyproject.toml").exists():
                assert dockerfile.exists(), f"{name}: {build['dockerfile']} is missing"
    ignore = (REPO / ".dockerignore").read_text().split()
    for heavy in (".venv", "models", ".git", ".env"):
        assert heavy in ignore


# -- image build arguments ----------------------------------------------------------------------

def test_bases_and_torch_are_build_arguments(compose: dict[str, Any],
                                             compose_cpu: dict[str, Any]) -> None:
    """Every image we build takes its base from PYTHON_IMAGE (official by default); the torch
    images pin torch as the Makefile does, and compose.cpu.yaml asks for its CPU build."""

    makefile_pin = re.search(r"^TORCH_PIN \?= (\S+)", (REPO / "Makefile").read_text(), re.M)
    assert makefile_pin
    for doc in (compose, compose_cpu):
        for name, svc in doc["services"].items():
            if "build" not in svc:
                continue
            args = svc["build"]["args"]
            assert _default(args["PYTHON_IMAGE"]) == "python:3.11.11-slim-bookworm", name
            text = (REPO / svc["build"]["dockerfile"]).read_text()
            assert "ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm" in text, name
            if "TORCH_PIN" in text:
                assert f"ARG TORCH_PIN={makefile_pin.group(1)}" in text, name
    assert compose["services"]["trainer"]["build"]["args"]["TORCH_VARIANT"] == "cuda"
    for name in ("inference", "trainer"):
        assert compose_cpu["services"][name]["build"]["args"]["TORCH_VARIANT"] == "cpu", name
    for name, var, default in (("init-volumes", "BUSYBOX_IMAGE", "busybox:1.37.0"),
                               ("prometheus", "PROMETHEUS_IMAGE", "prom/prometheus:v3.5.0"),
                               ("grafana", "GRAFANA_IMAGE", "grafana/grafana:12.1.1")):
        assert compose["services"][name]["image"] == f"${{{var}:-{default}}}", name


def test_cpu_training_config_loads_with_the_compose_environment(
        compose_cpu: dict[str, Any]) -> None:
    from mcprl_trainer.config import load_config

    svc = compose_cpu["services"]["trainer"]
    config_path = _default(svc["command"][svc["command"].index("--config") + 1])
    host = _host_path(svc, config_path)
    assert host is not None and host.is_file(), config_path
    env = {k: _default(v) for k, v in _env(svc).items()}
    cfg = load_config(host, env={**env, "TRAINER_SCENARIOS__SET_ID": "ss-1"})
    assert cfg.model == _default(_env(compose_cpu["services"]["inference"])["INFERENCE_MODEL"])
    assert str(cfg.output_dir) == "/adapters" and cfg.train.device == "cpu"
    assert cfg.reward.mode == "verifiable" and cfg.group_size >= 2
