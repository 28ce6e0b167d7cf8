#!/usr/bin/env bash
# Warm-start SFT variants side by side on one GPU, each then scored on the demo's held-out
# val split (python -m mcprl_demo.warmstart --stages sft, then --stages eval). One device
# command: the variants share the GPU (a 5M-14M model leaves it mostly idle, so they overlap
# well) and each stops at the same wall-clock budget with a complete LR schedule
# (sft.max_seconds).
#
#   bash bench/warmstart_sweep.sh DATA OUT [BUDGET_S]
#
# DATA holds what the CPU stages made (here, with `--stages scenarios,expert`):
#   sft-<kind>.jsonl.gz per expert noise kind, scenarios/<set_id>/{train,val}.jsonl, base5/
#   and base14/ (config + tokenizer of the 5M spec and of tiny-learn; the init is random).
# OUT receives per variant: sft.json, eval.json, and the checkpoint as <name>.tar.
set -euo pipefail
DATA=${1:?DATA dir}; OUT=${2:?OUT dir}; BUDGET=${3:-300}
CONFIG=configs/warmstart.yaml
WORK=${WORK:-/tmp/warmstart-sweep}
mkdir -p "$OUT" "$WORK"
trap 'kill $(jobs -p) 2>/dev/null' EXIT  # a timeout on this script stops the variants too
trap 'exit 143' TERM
for f in "$DATA"/sft-*.jsonl.gz; do gunzip -c "$f" > "$WORK/$(basename "$f" .gz)"; done

# name | SFT data | overrides (base.path: tokenizer + config; the init is random)
VARIANTS=${VARIANTS:-"
w5c|sft-corrupt|base.path=$DATA/base5 sft.lr=2e-3 sft.batch_size=16 sft.micro_batch_tokens=40000
w5g|sft-guess|base.path=$DATA/base5 sft.lr=2e-3 sft.batch_size=32 sft.shared_prefix=true sft.micro_batch_tokens=65536
w14g|sft-guess|base.path=$DATA/base14 sft.lr=1e-3 sft.batch_size=32 sft.shared_prefix=true sft.micro_batch_tokens=65536
"}
mapfile -t VARIANTS < <(grep -v '^$' <<< "$VARIANTS")

run_stage() {  # name stage overrides...
  local name=$1 stage=$2; shift 2
  local sets=(--set "work_dir=$WORK/$name" --set "output_dir=$WORK/$name/model" --set base.spec=null)
  for kv in "$@"; do sets+=(--set "$kv"); done
  exec python3 -m mcprl_demo.warmstart --config "$CONFIG" --stages "$stage" "${sets[@]}"
}

pids=()
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name data rest <<< "$v"; read -r -a over <<< "$rest"
  mkdir -p "$WORK/$name"
  ln -sf "$WORK/$data.jsonl" "$WORK/$name/sft.jsonl"
  ln -sfn "$(realpath "$DATA/scenarios")" "$WORK/$name/scenarios"
  run_stage "$name" sft "${over[@]}" sft.steps=1000000 "sft.max_seconds=$BUDGET" \
    sft.warmup_steps=50 sft.log_every=200 sft.save_dtype=bfloat16 \
    > "$OUT/$name-sft.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || echo "an SFT variant failed (see $OUT/*-sft.log)"; done

export INFERENCE_KV_CACHE_MEMORY_GB=4  # several engines share the GPU
pids=()
for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name data rest <<< "$v"; read -r -a over <<< "$rest"
  [ -f "$WORK/$name/model/config.json" ] || continue
  run_stage "$name" eval "${over[@]}" "eval.max_scenarios=${EVAL_N:-60}" eval.concurrency=16 \
    eval.base_too=false > "$OUT/$name-eval.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || echo "an eval failed (see $OUT/*-eval.log)"; done

for v in "${VARIANTS[@]}"; do
  IFS='|' read -r name data rest <<< "$v"
  [ -d "$WORK/$name/model" ] || continue
  cp "$WORK/$name/sft.json" "$OUT/$name-sft.json" 2>/dev/null || true
  cp "$WORK/$name/eval.json" "$OUT/$name-eval.json" 2>/dev/null || true
  tar cf "$OUT/$name.tar" -C "$WORK/$name" model
done
python3 - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for f in sorted(out.glob("*-eval.json")):
    r = json.loads(f.read_text()).get("after_sft", {})
    s = json.loads((out / f.name.replace("-eval", "-sft")).read_text()) if (
        out / f.name.replace("-eval", "-sft")).exists() else {}
    print(json.dumps({"variant": f.name.removesuffix("-eval.json"),
                      "heldout_success": r.get("success_rate"), "n": r.get("n"),
                      "completed": r.get("completed_rate"), "sft_steps": s.get("steps"),
                      "sft_loss": s.get("final_loss"), "tokens_per_s": s.get("tokens_per_s")}))
EOF
