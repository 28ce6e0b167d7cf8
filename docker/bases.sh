#!/usr/bin/env bash
# Stand-in base images built from Debian packages, for hosts that cannot reach Docker Hub
# (air-gapped sites usually have a Debian mirror). They get tags of their own under
# $MCPRL_BASE_PREFIX and never overwrite an official image's tag; compose and the Dockerfiles
# take them through PYTHON_IMAGE, BUSYBOX_IMAGE and PROMETHEUS_IMAGE (see `--print-env`).
#
#   docker/bases.sh               build what is missing (needs root, debootstrap, docker)
#   docker/bases.sh --force       rebuild all three
#   docker/bases.sh --print-env   print the variables that select them, for `eval`
#
# python:     debootstrap --variant=minbase bookworm + python3 (3.11) + pip, the host's CA bundle
# busybox:    Debian's busybox-static
# prometheus: Debian's prometheus package (2.42) on the busybox stand-in, plus the libc it needs
# Grafana has no Debian package: no stand-in; compose keeps the official image.
# Settings: DEBIAN_MIRROR (debootstrap's mirror; default: debootstrap's own), DEBIAN_SUITE
# (bookworm), MCPRL_BASE_PREFIX (localhost/mcprl-base).
set -euo pipefail

PREFIX=${MCPRL_BASE_PREFIX:-localhost/mcprl-base}
SUITE=${DEBIAN_SUITE:-bookworm}
PYTHON_TAG="$PREFIX/python:3.11-$SUITE"
BUSYBOX_TAG="$PREFIX/busybox:1.35-$SUITE"
PROMETHEUS_TAG="$PREFIX/prometheus:2.42-$SUITE"

print_env() {
    echo "export PYTHON_IMAGE=$PYTHON_TAG BUSYBOX_IMAGE=$BUSYBOX_TAG PROMETHEUS_IMAGE=$PROMETHEUS_TAG"
}

force=0
case "${1:-}" in
    --print-env) print_env; exit 0 ;;
    --force) force=1 ;;
    "") ;;
    *) echo "usage: $0 [--force|--print-env]" >&2; exit 2 ;;
esac

have() { [ "$force" = 0 ] && docker image inspect "$1" >/dev/null 2>&1; }
log() { printf '[bases %5ss] %s\n' "$SECONDS" "$*" >&2; }  # stdout: the variables only

static_busybox() {  # ldd exits 1 on a static binary, hence the || true
    command -v busybox >/dev/null \
        && { ldd "$(command -v busybox)" 2>&1 || true; } | grep -q "not a dynamic executable"
}
need_pkgs=()
command -v debootstrap >/dev/null || need_pkgs+=(debootstrap)
static_busybox || need_pkgs+=(busybox-static)
command -v prometheus >/dev/null || need_pkgs+=(prometheus)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
    log "installing ${need_pkgs[*]} (apt-get)"
    apt-get update -qq >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${need_pkgs[@]}" >/dev/null
fi
static_busybox || { echo "no static busybox: install busybox-static" >&2; exit 1; }
BUSYBOX=$(command -v busybox)

work=$(mktemp -d /var/tmp/mcprl-bases.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A tree with a static busybox as /bin/sh and its applets (wget for healthchecks).
busybox_tree() {
    local root=$1
    mkdir -p "$root"/{bin,etc,tmp,root} && chmod 1777 "$root/tmp"
    cp "$BUSYBOX" "$root/bin/busybox"
    for applet in $("$BUSYBOX" --list); do
        [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
        > "$root/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\n' > "$root/etc/group"
    printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
}

if have "$PYTHON_TAG"; then
    log "$PYTHON_TAG is there"
else
    log "debootstrap $SUITE (minbase + python3) for $PYTHON_TAG"
    root="$work/python"
    # shellcheck disable=SC2086  # DEBIAN_MIRROR is empty (debootstrap's default) or one URL
    debootstrap --variant=minbase \
        --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,passwd \
        "$SUITE" "$root" ${DEBIAN_MIRROR:-} >"$work/debootstrap.log" 2>&1 \
        || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
    # Sites that inspect TLS add their CA to the host's bundle; the image needs it too.
    cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*.log
    tar -C "$root" -c . | docker import \
        --change 'ENV LANG=C.UTF-8 PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' - "$PYTHON_TAG" >/dev/null
    log "built $PYTHON_TAG ($(docker run --rm "$PYTHON_TAG" python --version))"
fi

if have "$BUSYBOX_TAG"; then
    log "$BUSYBOX_TAG is there"
else
    root="$work/busybox"
    busybox_tree "$root"
    tar -C "$root" -c . | docker import --change 'CMD ["sh"]' - "$BUSYBOX_TAG" >/dev/null
    log "built $BUSYBOX_TAG"
fi

if have "$PROMETHEUS_TAG"; then
    log "$PROMETHEUS_TAG is there"
else
    root="$work/prometheus"
    busybox_tree "$root"
    cp /usr/bin/prometheus /usr/bin/promtool "$root/bin/"
    # Debian links prometheus against glibc: carry the loader and the libraries it names.
    for lib in $(ldd /usr/bin/prometheus | grep -oE '/[^ ]+\.so[^ ]*'); do
        mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"
    done
    mkdir -p "$root/etc/prometheus" "$root/prometheus"
    cp /etc/prometheus/prometheus.yml "$root/etc/prometheus/prometheus.yml"
    chown 65534:65534 "$root/prometheus"
    tar -C "$root" -c . | docker import \
        --change 'USER nobody' --change 'WORKDIR /prometheus' --change 'EXPOSE 9090' \
        --change 'ENTRYPOINT ["/bin/prometheus"]' \
        --change 'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]' \
        - "$PROMETHEUS_TAG" >/dev/null
    log "built $PROMETHEUS_TAG ($(docker run --rm "$PROMETHEUS_TAG" --version 2>&1 | head -1))"
fi
print_env
