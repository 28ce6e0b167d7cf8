#!/bin/sh
# Image build step: the third-party dependencies of the packages named (folders under
# /tmp/build/stub/, each holding only its pyproject.toml) into the venv /opt/venv, pinned by the
# lock, then the packages themselves removed again: their source comes in a later, thin layer,
# so a code change does not reinstall the dependencies. The stub folders are deleted: a build/
# left in them would be reused by setuptools with the stub's empty files.
#   sh /tmp/build/install-deps.sh common judge
# With TORCH_VARIANT=cpu it drops triton (GPU kernels only: xgrammar's, 1 GB; xgrammar runs
# without it on CPUs).
set -eu
cd /tmp/build
pip=/opt/venv/bin/pip
if [ ! -x $pip ]; then
    python -m venv /opt/venv
    cat constraints.txt constraints-image.txt > /opt/venv/mcprl-lock.txt
    # The venv's own setuptools is whatever the base's Python bundles: pin it like the rest.
    $pip install -c /opt/venv/mcprl-lock.txt setuptools
fi
stubs=""
names=""
for pkg in "$@"; do
    mkdir -p "stub/$pkg/src"
    stubs="$stubs stub/$pkg"
    names="$names $(sed -n 's/^name *= *"\(.*\)"/\1/p' "stub/$pkg/pyproject.toml" | head -n 1)"
done
# shellcheck disable=SC2086  # word lists built above
$pip install -c /opt/venv/mcprl-lock.txt $stubs
# shellcheck disable=SC2086
$pip uninstall -y $names
if [ "${TORCH_VARIANT:-}" = cpu ] && $pip show triton >/dev/null 2>&1; then
    $pip uninstall -y triton
fi
rm -rf /tmp/build
