#!/usr/bin/env bash
# The main job's answer must not rest on a near-tie of the 4-bit model: asks MODEL the PROMPT (its chat template,
# greedy) under every --activation-precision and --kv-cache-dtype and checks that each answer contains EXPECTED.
# Usage: scripts/check-demo.sh FP4SERVE MODEL PROMPT EXPECTED   (make check-demo)
set -euo pipefail
[ $# -eq 4 ] || { echo "usage: $0 FP4SERVE MODEL PROMPT EXPECTED" >&2; exit 2; }
fp4serve="$1" model="$2" prompt="$3" expected="$4"
failed=0 runs=0
for precision in auto fp32 bf16 int8 int8-decode; do
  for kv in auto fp32 bf16 fp16; do
    answer="$("$fp4serve" generate -q -m "$model" --chat -p "$prompt" -n 24 --activation-precision "$precision" \
      --kv-cache-dtype "$kv" | tr '\n' ' ')"
    runs=$((runs + 1))
    if [[ "$answer" == *"$expected"* ]]; then
      echo "ok    --activation-precision $precision --kv-cache-dtype $kv: $answer"
    else
      echo "WRONG --activation-precision $precision --kv-cache-dtype $kv: $answer"
      failed=$((failed + 1))
    fi
  done
done
echo "check-demo: $((runs - failed))/$runs answers contain '$expected'"
[ "$failed" -eq 0 ]
