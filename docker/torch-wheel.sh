#!/usr/bin/env bash
# Puts torch's CPU wheel into docker/wheels/, where the CPU images take it from first
# (docker/install-torch.sh), so that building them needs no wheel index of PyTorch's.
# Sources, first match wins: a wheel already there; TORCH_WHEEL_DIR (a folder of wheels, for
# offline hosts); the wheels pip finds without an index (its find-links, such as a site's wheel
# folder); TORCH_INDEX_URL. Without any of them it says so and leaves the folder as it is
# (the images then need TORCH_INDEX_URL). Only a CPU build (+cpu) is kept.
#   docker/torch-wheel.sh [torch==2.13.0]
set -euo pipefail
cd "$(dirname "$0")/.."
pin=${1:-${TORCH_PIN:-torch==2.13.0}}
version=${pin#torch==}
dest=docker/wheels
found() { ls "$dest"/torch-"$version"+cpu-cp311-*.whl 2>/dev/null | head -n 1; }

if [ -n "$(found)" ]; then
    echo "torch-wheel: $(found) is there"; exit 0
fi
pip_download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dest" "$@" \
        "torch==$version" 2>/dev/null || true
}
if [ -n "${TORCH_WHEEL_DIR:-}" ]; then pip_download --no-index --find-links "$TORCH_WHEEL_DIR"; fi
[ -n "$(found)" ] || pip_download --no-index
if [ -z "$(found)" ] && [ -n "${TORCH_INDEX_URL:-}" ]; then pip_download --index-url "$TORCH_INDEX_URL"; fi
# A build without +cpu is the CUDA one: not for the CPU images.
find "$dest" -name "torch-$version-*.whl" ! -name "*+cpu*" -delete
if [ -n "$(found)" ]; then
    echo "torch-wheel: $(found) ($(du -h "$(found)" | cut -f1))"
else
    echo "torch-wheel: no CPU wheel of torch $version found; set TORCH_WHEEL_DIR or" \
         "TORCH_INDEX_URL (PyTorch's CPU wheel index) for the CPU images" >&2
fi
