#!/bin/sh
# Image build step: a venv at /opt/venv with torch ($TORCH_PIN) and its dependencies, every one
# pinned by the lock (constraints.txt plus the torch pin, kept as /opt/venv/mcprl-lock.txt for
# the steps after this one). Where torch comes from, first match wins:
#   1. a wheel of that version in docker/wheels/ (offline hosts; docker/torch-wheel.sh fills it)
#   2. TORCH_INDEX_URL, an index for torch alone (such as PyTorch's CPU wheel index)
#   3. the default index, which for Linux x86_64 serves the CUDA build: fine for GPU images,
#      refused when TORCH_VARIANT=cpu (a CPU image would carry ~9 GB of CUDA libraries).
# Runs in the build stage only, from /tmp/build (constraints.txt, constraints-image.txt, wheels/).
set -eu
cd /tmp/build
python -m venv /opt/venv
pip=/opt/venv/bin/pip
{ cat constraints.txt constraints-image.txt; echo "$TORCH_PIN"; } > /opt/venv/mcprl-lock.txt
version=${TORCH_PIN#torch==}
wheel=$(ls wheels/torch-"$version"-*.whl wheels/torch-"$version"+"$TORCH_VARIANT"*.whl 2>/dev/null \
    | head -n 1 || true)
if [ -n "$wheel" ]; then
    echo "torch from $wheel"
    $pip install --no-deps "$wheel"
elif [ -n "${TORCH_INDEX_URL:-}" ]; then
    echo "torch from TORCH_INDEX_URL"
    $pip install --no-deps --index-url "$TORCH_INDEX_URL" "$TORCH_PIN"
elif [ "$TORCH_VARIANT" = cpu ]; then
    echo "No CPU build of $TORCH_PIN: put its wheel in docker/wheels/ (docker/torch-wheel.sh)" >&2
    echo "or set TORCH_INDEX_URL to PyTorch's CPU wheel index." >&2
    exit 1
fi
# torch's own dependencies (and torch itself when no source above applied), from the lock.
$pip install -c /opt/venv/mcprl-lock.txt "$TORCH_PIN"
/opt/venv/bin/python - "$TORCH_VARIANT" <<'PY'
import importlib.metadata as md, sys
import torch
variant = sys.argv[1]
nvidia = sorted(d.metadata["Name"] for d in md.distributions()
                if d.metadata["Name"].lower().startswith("nvidia"))
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); nvidia wheels: {len(nvidia)}")
if variant == "cpu" and (torch.version.cuda or nvidia):
    sys.exit(f"TORCH_VARIANT=cpu but torch {torch.__version__} is a CUDA build ({nvidia[:3]})")
PY
