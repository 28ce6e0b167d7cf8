#!/usr/bin/env bash
# One RL step at the 3B shape, ours next to TRL's GRPOTrainer (bench/bench_rl_step.py), on a
# lent H200 within one call: install the carried wheels, run both sides, JSON into $OUT.
#
#   bash bench/device/rl_step.sh single     # the issue-15 anchor's workload
#   bash bench/device/rl_step.sh multi      # 4 turns, a 100-token tool result between turns
#   bash bench/device/rl_step.sh stash      # only install the carried wheels into $SITE
#
# Here, before the call: `make gpu-wheels gpu-wheels-trl` (.whl/ and .whl-trl/: carry both,
# or, when the tree and both pass a call's 64 MiB, `stash` carrying .whl and then the run
# carrying .whl-trl, back to back on the warm machine).
# What comes back: rl_step.json (rewritten after each side, so a run stopped at the time limit
# still has ours) and rl_step.log (the bench's progress, its stderr).
# BUDGET_S (default 540) bounds the whole call; EXTRA_ARGS go to the bench (e.g. --only ours).
set -euo pipefail
cd "$(dirname "$0")/../.."
VARIANT=${1:-single}
case "$VARIANT" in
  single) VARIANT_ARGS=(--variant single) ;;
  multi) VARIANT_ARGS=(--variant multiturn) ;;
  stash) ;;  # install the carried wheels only (the tree, .whl and .whl-trl pass 64 MiB)
  *) echo "usage: $0 single | multi | stash" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/out}
SITE=${SITE:-$HOME/site-rl-step}  # kept while the machine is warm: wheels may come in 2 calls
mkdir -p "$OUT"
wheels=()
for dir in .whl .whl-trl; do
  if compgen -G "$dir/*.whl" >/dev/null; then wheels+=("$dir"/*.whl); fi
done
if [ ${#wheels[@]} -gt 0 ]; then  # each call installs what it carries, beside earlier calls'
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}"
fi
if [ "$VARIANT" = stash ]; then du -sh "$SITE"; exit 0; fi
export PYTHONPATH=$SITE:$(printf "$PWD/%s/src:" common inference trainer) HF_HUB_OFFLINE=1 \
  PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1 \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 - <<'EOF' || true
from importlib import metadata


def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


print({n: version(n) for n in ("torch", "transformers", "peft", "accelerate", "trl", "datasets",
                               "pyarrow", "fsspec", "pandas", "huggingface-hub")})
EOF
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
left=$(( ${BUDGET_S:-540} - SECONDS ))
rc=0
# SIGTERM at the limit: the bench stops its engine process (in its own session) and exits.
timeout -k 20 "$left" python3 bench/bench_rl_step.py --shape 3b --device cuda --steps 5 \
  --warmup 2 "${VARIANT_ARGS[@]}" --workdir /tmp/rl-step --out "$OUT/rl_step.json" \
  ${EXTRA_ARGS:-} > /dev/null 2> "$OUT/rl_step.log" || rc=$?
tail -n 40 "$OUT/rl_step.log"
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader || true
if [ -f "$OUT/rl_step.json" ]; then
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: (d[k] or {}).get('seconds_per_step') for k in ('ours','trl')}, 'speedup', d.get('speedup'))" "$OUT/rl_step.json"
fi
echo "exit $rc"
exit "$rc"
