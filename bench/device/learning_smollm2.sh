#!/usr/bin/env bash
# The SmolLM2 learning proof (bench/learning_run.py) on a lent GPU box, within what its calls
# carry: 64 MiB and 10 minutes each, the machine (and $HOME) kept only while warm. So the
# 98 MB GGUF travels in parts, the run starts in the background, and later calls wait on it.
#
#   bash bench/device/learning_smollm2.sh stash         # each call: install carried .whl/ into
#                                                       # ~/site, move carried .carry/* to ~/parts
#   bash bench/device/learning_smollm2.sh drift         # join + check + convert, then
#                                                       # bench/control_drift.py (DRIFT_ARGS)
#   bash bench/device/learning_smollm2.sh start         # join + check the GGUF, convert, start
#   bash bench/device/learning_smollm2.sh wait SECONDS  # follow the run; results into $OUT
#
# Here, before the calls: `make gpu-wheels`, the warm start's demonstrations
# (`bench/learning_run.py ... --prepare-only --out runs/lr-smollm2`, same arguments as RUN_ARGS
# below) and the GGUF parts (`bench/device/split_gguf.sh`). Plan the lease: with one engine
# per run (the default here), six runs step every ~26 s; 140 s after `start` the before-eval
# is done and the runs begin (2026-12-04), so BUDGET_S=450 needs a second `wait` call. A
# `wait` that finds the run going brings back partial.tgz (the metrics and evals so far);
# a lease lost between calls loses the run, so issue the next `wait` at once. What comes back: learning_run.json,
# curves.png, results-section.md, the warm-start adapter and the logs (tarballs).
# 2026-12-06 08:40 (H100, six runs, lr 0.05, seeds 11-13): three calls carried .whl + part-aa,
# part-ab, part-ac (the last one also `start` + `wait 560`), a fourth `wait` ended it 250 s
# later: 803 s from start to JSON, --paired-before included. A second run on the same lease
# (`mv ~/lr ~/lr1` first) needs no GGUF again. ARMS picks the arms (an --extra-arm in
# EXTRA_ARGS always runs). The next proof run, configs/smollm2.yaml (lr 0.05), other seeds:
#   KV_CACHE_GB=3 BUDGET_S=450 WARM_START=demo/checkpoints/smollm2-warm-start \
#     EXTRA_ARGS='--first-seed 14' bash bench/device/learning_smollm2.sh start
# Learning per minute with rollouts overlapped (issue 15), synchronous GRPO beside it; run
# 2026-12-06 11:31 (H100) with BUDGET_S=450 KV_CACHE_GB=3: 765 s from start to JSON, the
# same three calls + one `wait` (docs/results.md):
#   ARMS=grpo BUDGET_S=450 WARM_START=... EXTRA_ARGS='--first-seed 11 --no-paired-before
#     --extra-arm overlap:train.max_staleness=1:3' bash bench/device/learning_smollm2.sh start
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=$HOME/site PARTS=$HOME/parts RUN=$HOME/lr
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
export PYTHONPATH=$SITE:$(printf "$PWD/%s/src:" common inference mcp-server scenario-gen judge \
  trainer demo stack) HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# WARM_START=demo/checkpoints/smollm2-warm-start skips the SFT and RL-trains the shipped adapter.
if [ -n "${WARM_START:-}" ]; then WARM_ARGS=(--warm-start "$WARM_START")
else WARM_ARGS=(--warmstart-config configs/warmstart-smollm2.yaml --reuse-warmstart-data); fi
RUN_ARGS=(--device cuda --base-model models/smollm2-135m-instruct "${WARM_ARGS[@]}"
  --trainer-config configs/smollm2.yaml --sft-excludes entities --scenarios 400 --eval-max 48 --sampled-eval 2 --eval-concurrency 48
  --curve-every 4 --curve-points 5 --arms "${ARMS:-grpo,shuffled}" --control-seeds 3 --engine-per-run
  ${EXTRA_ARGS:-} --budget-s "${BUDGET_S:-450}" --stop-grace-s 40 --parallel "${PARALLEL:-6}")
# 7 trainers with 32k-token micro-batches beside the engine ran out of GPU memory at their
# first update (CUBLAS_STATUS_ALLOC_FAILED); 5 with 8k-token micro-batches peak at ~7 GB each.
# With --engine-per-run every engine takes KV_CACHE_GB of KV cache (8 GB holds ~350k SmolLM2
# tokens, a step's 32 rollouts need <140k): seven engines and six trainers used 82 GB. Eight
# runs with 3 GB each (2026-12-06, H100) used 71 GB at a sample, and two engines failed a
# request at once (their logs, now in logs.tgz, did not come back then): keep six on an H100.
export INFERENCE_MAX_BATCH_SIZE=128 INFERENCE_KV_CACHE_MEMORY_GB=${KV_CACHE_GB:-8} \
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

stash() {
  if compgen -G ".whl/*.whl" >/dev/null && [ ! -f "$SITE/.done" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl && touch "$SITE/.done"
  fi
  mkdir -p "$PARTS"
  if [ -d .carry ]; then cp -r .carry/. "$PARTS/"; fi
  ls -la "$PARTS"; du -sh "$SITE" 2>/dev/null || true
}

base_model() {
  local gguf=$PARTS/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$gguf" ] || cat "$PARTS"/gguf.part-* > "$gguf"
  echo "$GGUF_SHA256  $gguf" | sha256sum -c -
  python3 -m mcprl_inference.base_model --gguf "$gguf" --out models
}

# The control's drift, update by update (bench/control_drift.py) on the expert's rows carried
# as .carry/drift-sft.jsonl.gz (python -m mcprl_demo.warmstart ... --stages scenarios,expert).
drift() {
  base_model
  [ -f "$PARTS/drift-sft.jsonl" ] || gunzip -kf "$PARTS/drift-sft.jsonl.gz"
  # shellcheck disable=SC2086
  python3 bench/control_drift.py --rows "$PARTS/drift-sft.jsonl" --device cuda \
    --out "${1:-${OUT:-/tmp/out}/control_drift.json}" ${DRIFT_ARGS:-} 2> >(grep -v -i warn >&2)
}

start() {
  base_model
  mkdir -p "$RUN"
  if [ -d "$PARTS/warmstart" ] && [ ! -d "$RUN/warmstart" ]; then cp -r "$PARTS/warmstart" "$RUN/"; fi
  if [ -d "$RUN/warmstart" ]; then find "$RUN/warmstart" -name '*.gz' -exec gunzip -f {} +; fi
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
  setsid nohup python3 bench/learning_run.py "${RUN_ARGS[@]}" \
    --out "$RUN" > "$RUN/run.log" 2> "$RUN/progress.log" < /dev/null &
  echo $! > "$RUN/pid"
  echo "started: ${RUN_ARGS[*]}"
  if [ "${DRIFT_BESIDE:-0}" = 1 ]; then  # the drift bench beside the run (one small process)
    setsid nohup bash "$0" drift "$RUN/control_drift.json" > "$RUN/drift.log" 2>&1 < /dev/null &
    echo "control_drift started beside it: ${DRIFT_ARGS:-}"
  fi
}

wait_run() {
  local until=$((SECONDS + ${1:-540})) pid
  pid=$(cat "$RUN/pid")
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $until ]; do sleep 10; done
  tail -n 25 "$RUN/progress.log"
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader || true
  local out=${OUT:-/tmp/out}
  if kill -0 "$pid" 2>/dev/null; then
    # A lease can end before the run does: bring back what the runs have logged so far.
    tar -czf "$out/partial.tgz" -C "$RUN" progress.log \
      $(cd "$RUN" && ls runs/*/metrics.jsonl runs/*/evals.jsonl 2>/dev/null) 2>/dev/null || true
    cp "$RUN"/control_drift.json "$RUN"/drift.log "$out"/ 2>/dev/null || true
    echo "RUNNING"; return 0
  fi
  echo "DONE"
  cp "$RUN"/control_drift.json "$RUN"/drift.log "$out"/ 2>/dev/null || true
  cp "$RUN"/learning_run.json "$RUN"/curves.png "$RUN"/results-section.md "$out"/ 2>/dev/null || true
  tail -c 4000 "$RUN/run.log" > "$out/run-tail.txt" || true
  tar -czf "$out/warm-start.tgz" -C "$RUN/warmstart" model sft.json expert.json 2>/dev/null || true
  tar -czf "$out/logs.tgz" -C "$RUN" progress.log logs configs \
    $(cd "$RUN" && ls runs/*/metrics.jsonl runs/*/evals.jsonl stack/*/logs/*.log 2>/dev/null) \
    || true
}

case "${1:-}" in
  stash) stash ;;
  drift) stash; drift "${2:-}" ;;
  start) stash; start ;;
  wait) wait_run "${2:-540}" ;;
  *) echo "usage: $0 stash | drift | start | wait SECONDS" >&2; exit 2 ;;
esac
