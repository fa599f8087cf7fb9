#!/bin/sh
# `--activation-precision auto` keeps its measurement per machine (backends/activation_precision.h): a second run
# reads it back instead of measuring, a kept entry decides the choice, and a damaged cache file is measured over
# without failing. Skipped (77) on a CPU where auto does not measure (no AVX512-BF16 dot products).
# Usage: explain_precision_cache_test.sh FP4SERVE MODEL_DIR WORK_DIR
set -u
fp4serve=$1 model=$2 work=$3
rm -rf "$work" && mkdir -p "$work" || exit 1
export FP4SERVE_CACHE_DIR="$work"
cache="$work/activation-precision.json"
explain() { "$fp4serve" explain "$model" --device cpu | grep 'CPU activation precision'; }

first=$(explain) || { echo "explain failed"; exit 1; }
echo "$first"
case $first in *"measured on this CPU"*) ;; *) echo "auto does not measure on this CPU: skipped"; exit 77 ;; esac
case $first in *"kept from an earlier run"*) echo "FAIL: the first run found a kept measurement"; exit 1 ;; esac
test -s "$cache" || { echo "FAIL: no cache file written at $cache"; exit 1; }

second=$(explain) || exit 1
echo "$second"
case $second in *"kept from an earlier run"*) ;; *) echo "FAIL: the second run measured again"; exit 1 ;; esac

# A kept entry decides: rewrite it as a clear int8 win and the choice follows.
python3 - "$cache" <<'PY' || exit 1
import json, sys
path = sys.argv[1]
entries = json.load(open(path))
for e in entries.values():
    e["choice"] = "bf16-decode-int8"
    e["int8_batched_s"] = e["bf16_batched_s"] * 0.5
    e["int8_step_s"] = e["bf16_step_s"] * 0.5
json.dump(entries, open(path, "w"))
PY
third=$(explain) || exit 1
echo "$third"
case $third in *"linears ("*"): bf16-decode-int8. Why: auto"*"ratio 0.50"*"kept from an earlier run"*) ;;
  *) echo "FAIL: the kept entry did not decide"; exit 1 ;; esac

# A damaged file is measured over, not fatal.
echo '{"truncated' > "$cache"
fourth=$(explain) || { echo "FAIL: explain failed on a damaged cache"; exit 1; }
echo "$fourth"
case $fourth in *"kept from an earlier run"*) echo "FAIL: a damaged cache was read"; exit 1 ;; esac
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$cache" || { echo "FAIL: the cache was not rewritten"; exit 1; }
rm -rf "$work"
echo "ok"
