#!/usr/bin/env bash
# `make compose-test`: the CPU stack built and run for real on a Docker engine, end to end.
# Builds every image, `docker compose -f compose.yaml -f compose.cpu.yaml up` until healthy, a
# scenario set through scenario-gen's API, the `train` profile for 2 steps, the adapter served
# by name, the stack's Prometheus (every target up, every dashboard query a series), the same
# training against the inventory example as MCP_SERVER_IMAGE, `make down`; then it prints the
# time of each phase and the image sizes (also in runs/compose-test/summary.json).
# The checks are the pytest tests marked `docker` in tests/integration/test_compose_docker.py.
#
# Bases (MCPRL_BASES): `official` (Docker Hub's images), `stand-in` (docker/bases.sh builds them
# from Debian packages), `auto` (default: official where the engine has or can pull them);
# PYTHON_IMAGE (and BUSYBOX_IMAGE, PROMETHEUS_IMAGE) set by the caller win over all three.
# Without a reachable engine it says so and exits 0 (nothing to test here).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
say() { printf '[compose-test %5ss] %s\n' "$((SECONDS - start))" "$*"; }

if ! timeout 20 docker info >/dev/null 2>&1; then
    say "SKIPPED: no Docker engine reachable (docker info failed); nothing was built"
    exit 0
fi
if ! docker compose version >/dev/null 2>&1; then
    say "SKIPPED: the Docker Compose v2 plugin is missing (docker compose version failed)"
    exit 0
fi
say "engine $(docker version -f '{{.Server.Version}}'), $(docker compose version)"

mode=${MCPRL_BASES:-auto}
official=python:3.11.11-slim-bookworm
[ -n "${PYTHON_IMAGE:-}" ] && mode=given  # the caller picked the bases
if [ "$mode" = auto ]; then
    if docker image inspect "$official" >/dev/null 2>&1 \
            || timeout 120 docker pull -q "$official" >/dev/null 2>&1; then
        mode=official
    else
        mode=stand-in
        say "Docker Hub unreachable: stand-in bases from Debian packages"
    fi
fi
bases_start=$SECONDS
if [ "$mode" = stand-in ]; then
    eval "$(docker/bases.sh)"
fi
export MCPRL_COMPOSE_BASES=$mode MCPRL_COMPOSE_BASES_S=$((SECONDS - bases_start))
docker/torch-wheel.sh
say "bases: $mode (${MCPRL_COMPOSE_BASES_S}s); running the docker tests"

rc=0
summary=runs/compose-test/summary.json
rm -f "$summary"
.venv/bin/pytest -m docker tests/integration/test_compose_docker.py -p no:randomly \
    ${PYTEST_ARGS:-} || rc=$?
if [ -f "$summary" ]; then
    .venv/bin/python - "$summary" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("compose-test phases (s):  " + "  ".join(f"{k} {v:.0f}" for k, v in s["phases_s"].items()))
print("images (MB):  " + "  ".join(f"{k} {v:.0f}" for k, v in s["images_mb"].items()))
PY
fi
say "done (exit $rc)"
exit "$rc"
