#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device-check.sh — the GPU check (issues 9 and 21), ONE `run` call of the device tool on the device
# machine (one H200, sm_90), from the repository root, with nothing staged beforehand:
#     run command='bash scripts/device-check.sh' carry=[".device/bundle.tar.xz"] timeout_s=360
# (.device/bundle.tar.xz is made here by scripts/device-prepare.sh). Under a global deadline (FP4SERVE_DEADLINE,
# default 300 s) it:
#   1. unpacks the carried build (fp4serve, the CUDA test binaries, bench_gemm_cuda and the shared libraries the
#      device lacks), else uses a local build/release (a machine with our Debian packages, e.g. this one);
#   2. inflates the tracked xz fixtures (Python's lzma) and, in the background on the CPU cores, builds a
#      SmolLM2-135M-shaped model from random weights and the fixture SmolLM2 tokenizer
#      (tools/make_random_model.py, then `fp4serve quantize --scheme nvfp4a16`);
#   3. runs the CUDA test binaries (label `cuda`): device, layouts, ops, linear vs CPU, decoder parity on the
#      reference fixtures (one row per fixture and prompt), teacher-forced greedy with the near-tie rule;
#   4. runs bench_gemm_cuda: the FP4 kernels verified once against float64, then timed against cuBLAS bf16 and the
#      device-to-device copy bandwidth (one table row per shape and M); then bench_attention_cuda: split-KV decode
#      attention verified against the serial kernel, then timed against it (vs_serial, KV bytes per second);
#   5. on the random SmolLM2-shaped model: `fp4serve generate` 32 greedy tokens on the CPU and on the GPU
#      (tokens/s of prefill and decode), `fp4serve bench model --device cuda` with and without CUDA graphs
#      (FP4SERVE_CUDA_GRAPHS=0) and the teacher-forced greedy comparison of CPU and GPU (margins printed; a
#      mismatch fails only when its margin exceeds 1e-3 · max|logit|).
# Each step's row is appended to $OUT/summary.txt the moment it ends (a call cut short keeps what finished), the
# whole table is printed last, and the exit status is 1 when any step FAILED (or hit its time limit).
#
# Why a carried build and not a build on the device: the device image has CUDA 13, cmake, ninja and a compiler but
# none of our Debian -dev packages (Highway, fmt, nlohmann-json, CLI11, PCRE2, utf8proc, OpenBLAS, GoogleTest,
# Google Benchmark) and no network, so the project cannot be configured there at all. The build is made on
# Debian 12 (glibc 2.36), which runs on the device's newer glibc; device-prepare.sh ships the non-system shared
# libraries found with ldd. The tests read fixtures from the source path compiled into them (FP4SERVE_TEST_DATA):
# this script links that path to the repository root on the device.
# Why a random model and not the default one: models/default-nvfp4 is ~115 MB, more than one call can carry next to
# the tree; the random model has the same shapes (and so the same speed) and the real tokenizer, but its text
# is meaningless and its logits are close together, which is exactly where the near-tie rule matters.
#
# Testing here (no GPU): `FP4SERVE_FAKE_NO_GPU=1 scripts/device-check.sh` hides any GPU (CUDA_VISIBLE_DEVICES=)
# and must reach every step and report "no GPU" for the GPU ones, cleanly (exit 0).
# Environment: OUT (default .device/out), FP4SERVE_DEADLINE (s, default 300), FP4SERVE_BUILD (default
# build/release), FP4SERVE_WORK (scratch, default /tmp/fp4serve-device), FP4SERVE_THREADS (CPU threads of the CPU
# generate, default all cores).
set -uo pipefail

root=$(pwd)
start=$(date +%s)
deadline=${FP4SERVE_DEADLINE:-300}
OUT=${OUT:-$root/.device/out}
work=${FP4SERVE_WORK:-/tmp/fp4serve-device}
build=${FP4SERVE_BUILD:-$root/build/release}
threads=${FP4SERVE_THREADS:-$(nproc)}
mkdir -p "$OUT" "$work"
summary=$OUT/summary.txt
failed=0
elapsed() { echo $(( $(date +%s) - start )); }
left() { echo $(( deadline - $(elapsed) )); }
log() { echo "[device-check $(elapsed)s] $*"; }
# row STEP STATUS DETAIL: one table row, appended to summary.txt at once. FAIL and TIMEOUT make the exit status 1.
row() {
  local line
  line=$(printf '| %-30s | %-8s | %s |' "$1" "$2" "$3")
  echo "$line" >>"$summary"
  echo "$line"
  case $2 in FAIL | TIMEOUT) failed=1 ;; esac
}
# budget CAP [RESERVE]: seconds a step may take: CAP, less when the deadline (minus RESERVE for later steps) is near.
budget() {
  local cap=$1 reserve=${2:-0} rest
  rest=$(( $(left) - reserve ))
  (( rest < cap )) && cap=$rest
  (( cap < 0 )) && cap=0
  echo "$cap"
}
# status_of RC: ok, TIMEOUT (timeout's 124, or 137 after its KILL) or FAIL.
status_of() { case $1 in 0) echo ok ;; 124 | 137) echo TIMEOUT ;; *) echo FAIL ;; esac; }

{
  echo "fp4serve device-check ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), deadline ${deadline}s)"
  printf '| %-30s | %-8s | %s |\n' "step" "status" "detail"
  printf '|%s|%s|%s|\n' "--------------------------------" "----------" "--------"
} >"$summary"

# ---- 0. the GPU -------------------------------------------------------------------------------------------------
if [[ ${FP4SERVE_FAKE_NO_GPU:-0} == 1 ]]; then
  export CUDA_VISIBLE_DEVICES=
  log "FP4SERVE_FAKE_NO_GPU=1: every GPU hidden"
fi
gpu="none"
if [[ ${FP4SERVE_FAKE_NO_GPU:-0} != 1 ]] && command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1)
  [[ -z $gpu ]] && gpu="none"
fi
have_gpu=0
[[ $gpu != none ]] && have_gpu=1
gpu_status() { [[ $have_gpu == 1 ]] && status_of "$1" || { [[ $1 == 0 ]] && echo "no GPU" || status_of "$1"; }; }
row "GPU" "$([[ $have_gpu == 1 ]] && echo ok || echo 'no GPU')" "$gpu; $(nproc) CPU cores"

# ---- 1. the build -----------------------------------------------------------------------------------------------
bin=""
tests=()
if [[ -f $root/.device/bundle.tar.xz ]]; then
  bundle=$work/bundle
  rm -rf "$bundle" && mkdir -p "$bundle"
  tar -xJf "$root/.device/bundle.tar.xz" -C "$bundle" 2>/dev/null ||
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$root/.device/bundle.tar.xz" "$bundle"
  if [[ -x $bundle/bin/fp4serve ]]; then
    bin=$bundle/bin
    mapfile -t tests <"$bundle/tests.txt"
    export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    if ! ls /usr/local/cuda/lib64/libcublas.so.* >/dev/null 2>&1; then  # else PyTorch's pip copy of cuBLAS
      cublas=$(find /opt /usr -name 'libcublas.so.*' 2>/dev/null | head -1)
      [[ -n $cublas ]] && export LD_LIBRARY_PATH="$(dirname "$cublas"):$LD_LIBRARY_PATH"
    fi
    missing=$(for b in "$bundle"/bin/*; do ldd "$b"; done 2>/dev/null | grep 'not found' | sort -u | tr -s ' \t\n' ' ')
    [[ -n $missing ]] && row "libraries" "FAIL" "missing: $missing"
    src=$(cat "$bundle/source_dir")
    if [[ ! -e $src/tests/data ]]; then mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"; fi
    row "build" "ok" "carried bundle ($(cat "$bundle/built_on" 2>/dev/null)); fixtures via $src"
  else
    row "build" "FAIL" ".device/bundle.tar.xz did not unpack"
  fi
elif [[ -x $build/fp4serve ]]; then
  bin=$build
  for t in "$build"/tests/backends/cuda/kernels/cuda_*_test "$build"/tests/model/backend_parity_test; do
    [[ -x $t ]] && tests+=("${t#"$build"/}")
  done
  row "build" "ok" "local build $build"
else
  row "build" "FAIL" "no .device/bundle.tar.xz and no $build/fp4serve: run scripts/device-prepare.sh here first"
fi
binpath() { if [[ -x $bin/$1 ]]; then echo "$bin/$1"; else echo "$bin/$(basename "$1")"; fi; }

# ---- 2. fixtures, and the random model in the background --------------------------------------------------------
# Large fixtures are tracked xz-compressed and inflated by the CMake build; with a carried build nobody builds
# here, so inflate them the same way (Python's lzma: no xz needed).
python3 - <<'EOF_XZ'
import lzma, pathlib, shutil
for packed in pathlib.Path("tests/data").rglob("*.xz"):
    plain = packed.with_suffix("")
    if not plain.exists() or plain.stat().st_mtime < packed.stat().st_mtime:
        with lzma.open(packed) as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
EOF_XZ
model=$work/smollm2-random-nvfp4
model_pid=""
if [[ -n $bin ]]; then
  (
    set -e
    rm -rf "$work/smollm2-random-bf16" "$model"
    python3 tools/make_random_model.py --out "$work/smollm2-random-bf16" \
      --tokenizer tests/data/tokenizers/smollm2-real/tokenizer.json.xz
    "$bin/fp4serve" quantize -m "$work/smollm2-random-bf16" -o "$model" --scheme nvfp4a16
  ) >"$OUT/model.log" 2>&1 &
  model_pid=$!
  model_started=$(date +%s)
fi

# ---- 3. CUDA tests ----------------------------------------------------------------------------------------------
# Each binary gets what is left of a 130 s test budget, never eating the 150 s reserved for steps 4 and 5.
if [[ -n $bin && ${#tests[@]} -gt 0 ]]; then
  tests_end=$(( $(elapsed) + 130 ))
  for t in "${tests[@]}"; do
    name=$(basename "$t")
    cap=$(( tests_end - $(elapsed) ))
    limit=$(budget "$cap" 150)
    if (( limit < 5 )); then row "test $name" "skipped" "deadline"; continue; fi
    timeout -k 5 "$limit" "$(binpath "$t")" --gtest_color=no >"$OUT/test-$name.log" 2>&1
    rc=$?
    passed=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$OUT/test-$name.log" | awk '{s+=$4} END {print s+0}')
    nfail=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$OUT/test-$name.log" | awk '{s+=$4} END {print s+0}')
    skipped=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$OUT/test-$name.log" | awk '{s+=$4} END {print s+0}')
    detail="passed $passed, failed $nfail, skipped $skipped"
    if [[ $rc == 0 && $have_gpu == 0 ]]; then status="no GPU"; else status=$(status_of "$rc"); fi
    [[ $rc == 124 || $rc == 137 ]] && detail="$detail; killed after ${limit}s"
    row "test $name" "$status" "$detail"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/test-$name.log" | sort -u | head -4 | while read -r line; do
      echo "    $line" | tee -a "$summary"
    done
    while read -r line; do row "  parity" "info" "${line#\[cuda-parity\] }"; done < <(grep '^\[cuda-parity\]' "$OUT/test-$name.log")
    while read -r line; do row "  greedy" "info" "${line#\[cuda-greedy\] }"; done < <(grep '^\[cuda-greedy\]' "$OUT/test-$name.log")
    while read -r line; do row "  graphs" "info" "${line#\[cuda-graphs\] }"; done < <(grep '^\[cuda-graphs\]' "$OUT/test-$name.log")
    while read -r line; do row "  linear" "info" "$line"; done < <(grep -E '^\[ .* \] worst' "$OUT/test-$name.log")
  done
else
  row "cuda tests" "skipped" "no build"
fi

# ---- 4. GEMM benchmark + copy bandwidth -------------------------------------------------------------------------
bench_bin=""
[[ -n $bin ]] && for b in "$bin/bench_gemm_cuda" "$bin/bench/bench_gemm_cuda"; do [[ -x $b ]] && bench_bin=$b && break; done
if [[ -z $bench_bin ]]; then
  row "bench_gemm_cuda" "skipped" "not in this build"
else
  limit=$(budget 90 80)
  if (( limit < 10 )); then
    row "bench_gemm_cuda" "skipped" "deadline"
  else
    timeout -k 5 "$limit" "$bench_bin" --benchmark_out="$OUT/bench.json" --benchmark_out_format=json >"$OUT/bench.log" 2>&1
    rc=$?
    if [[ $have_gpu == 0 ]]; then
      row "bench_gemm_cuda" "$(gpu_status $rc)" "$(head -c 150 "$OUT/bench.log" | tr '\n' ' ')"
    else
      copy=$(grep -Eo 'copy bandwidth [0-9.]+ GB/s' "$OUT/bench.log" | head -1)
      row "bench_gemm_cuda" "$(status_of $rc)" "${copy:-copy bandwidth not printed}$([[ $rc == 124 || $rc == 137 ]] && echo "; killed after ${limit}s")"
      while read -r line; do row "  verify" "$([[ $line == *FAIL* ]] && echo FAIL || echo ok)" "$line"; done < <(grep '^verify ' "$OUT/bench.log")
      grep '^| gemm' "$OUT/bench.log" >>"$summary"
    fi
  fi
fi

# ---- 4b. decode attention: split over the KV length vs one block per head ------------------------------------
attn_bin=""
[[ -n $bin ]] && for b in "$bin/bench_attention_cuda" "$bin/bench/bench_attention_cuda"; do [[ -x $b ]] && attn_bin=$b && break; done
if [[ -z $attn_bin ]]; then
  row "bench_attention_cuda" "skipped" "not in this build"
else
  limit=$(budget 30 50)
  if (( limit < 5 )); then
    row "bench_attention_cuda" "skipped" "deadline"
  else
    timeout -k 5 "$limit" "$attn_bin" --benchmark_counters_tabular=true >"$OUT/attention.log" 2>&1
    rc=$?
    if [[ $have_gpu == 0 ]]; then
      row "bench_attention_cuda" "$(gpu_status $rc)" "$(head -c 150 "$OUT/attention.log" | tr '\n' ' ')"
    else
      row "bench_attention_cuda" "$(status_of $rc)" "$(grep -c '^verify .* ok' "$OUT/attention.log") verifications ok$([[ $rc == 124 || $rc == 137 ]] && echo "; killed after ${limit}s")"
      grep '^verify .*FAIL' "$OUT/attention.log" | while read -r line; do row "  verify" "FAIL" "$line"; done
      grep -E '^attention_(serial|decode)/' "$OUT/attention.log" | awk '{print "    " $0}' >>"$summary"
    fi
  fi
fi

# ---- 5. the SmolLM2-shaped random model: generate CPU vs GPU, greedy near-tie check ------------------------------
if [[ -n $model_pid ]]; then
  limit=$(budget 120 40)
  while kill -0 "$model_pid" 2>/dev/null && (( $(date +%s) - model_started < limit + (model_started - start) )) && (( $(left) > 40 )); do
    sleep 1
  done
  if kill -0 "$model_pid" 2>/dev/null; then
    kill "$model_pid" 2>/dev/null
    row "random SmolLM2 model" "TIMEOUT" "not built within the deadline (see model.log)"
    model_ok=0
  else
    wait "$model_pid"
    rc=$?
    model_ok=$([[ $rc == 0 ]] && echo 1 || echo 0)
    row "random SmolLM2 model" "$(status_of $rc)" "$(grep -Eo '[0-9.]+ M parameters' "$OUT/model.log" | head -1) bf16 -> $(grep -Eo '[0-9]+ of [0-9]+ linear layers to [A-Za-z0-9]+' "$OUT/model.log" | head -1) in $(( $(date +%s) - model_started )) s"
  fi
  prompt="The capital of France is"
  gen() {  # $1 = device, $2 = cap (s), $3 = seconds kept for the later steps
    local lim
    lim=$(budget "$2" "$3")
    if (( lim < 5 )); then echo "skipped: deadline" >"$OUT/generate-$1.err"; return 124; fi
    echo "time limit ${lim} s" >"$OUT/generate-$1.limit"
    # --kv-cache-dtype fp32 on both: the GPU's cache is fp32, so the CPU run must not round its cache to bf16.
    timeout -k 5 "$lim" "$bin/fp4serve" generate -m "$model" -p "$prompt" -n 32 --temperature 0 --ignore-eos \
      --device "$1" --threads "$threads" --max-model-len 512 --kv-cache-dtype fp32 >"$OUT/generate-$1.txt" \
      2>"$OUT/generate-$1.err"
  }
  if [[ $model_ok == 1 ]]; then
    gen cpu 120 70  # the CPU is the slow side (on a loaded machine much slower than on the device's 16 cores)
    cpu_rc=$?
    row "generate --device cpu" "$(status_of $cpu_rc)" "$(grep -Eo '(prompt|decode) [0-9]+ tokens, [0-9.]+ tokens/s' "$OUT/generate-cpu.err" | tr '\n' ' ')$([[ $cpu_rc != 0 ]] && { cat "$OUT/generate-cpu.limit" 2>/dev/null; tail -1 "$OUT/generate-cpu.err" | cut -c1-120; } | tr '\n' ' ')"
    gen cuda 45 30
    gpu_rc=$?
    if [[ $have_gpu == 0 ]]; then
      row "generate --device cuda" "$([[ $gpu_rc == 124 || $gpu_rc == 137 ]] && echo TIMEOUT || echo 'no GPU')" "exit $gpu_rc: $(grep -m1 -o 'fp4serve:.*' "$OUT/generate-cuda.err" | cut -c1-140)"
    else
      row "generate --device cuda" "$(status_of $gpu_rc)" "$(grep -Eo '(prompt|decode) [0-9]+ tokens, [0-9.]+ tokens/s' "$OUT/generate-cuda.err" | tr '\n' ' ')$([[ $gpu_rc != 0 ]] && tail -1 "$OUT/generate-cuda.err" | cut -c1-140)"
    fi
    # Prefill and decode tokens/s of `bench model` on the GPU, with CUDA graphs (the default) and without
    # (FP4SERVE_CUDA_GRAPHS=0: every decode step launched kernel by kernel), one after the other.
    for graphs in 1 0; do
      lim=$(budget 35 25)
      if (( lim < 10 )); then row "bench model cuda graphs=$graphs" "skipped" "deadline"; continue; fi
      FP4SERVE_CUDA_GRAPHS=$graphs timeout -k 5 "$lim" "$bin/fp4serve" bench model -m "$model" --device cuda -p 128 -n 64 \
        -r 2 --json >"$OUT/bench-model-graphs$graphs.json" 2>"$OUT/bench-model-graphs$graphs.err"
      rc=$?
      if [[ $rc == 0 ]]; then
        detail=$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))["models"][0]; print("prefill %.0f tokens/s, decode %.1f tokens/s (128-token prompt, 64 tokens, median of 2)" % (m["prefill_tokens_per_s"], m["decode_tokens_per_s"]))' "$OUT/bench-model-graphs$graphs.json" 2>&1)
      else
        detail="exit $rc: $(grep -m1 -o 'fp4serve:.*' "$OUT/bench-model-graphs$graphs.err" | cut -c1-140)"
      fi
      if [[ $have_gpu == 0 ]]; then
        row "bench model cuda graphs=$graphs" "$([[ $rc == 124 || $rc == 137 ]] && echo TIMEOUT || echo 'no GPU')" "$detail"
      else
        row "bench model cuda graphs=$graphs" "$(status_of $rc)" "$detail"
      fi
    done
    if [[ $cpu_rc == 0 && $gpu_rc == 0 ]]; then
      if cmp -s "$OUT/generate-cpu.txt" "$OUT/generate-cuda.txt"; then
        row "32 greedy tokens cpu vs cuda" "info" "identical text"
      else
        row "32 greedy tokens cpu vs cuda" "info" "texts differ from $(cmp "$OUT/generate-cpu.txt" "$OUT/generate-cuda.txt" | grep -Eo 'byte [0-9]+') (the near-tie check below decides)"
      fi
    fi
    greedy_bin=""
    for t in "${tests[@]}"; do [[ $(basename "$t") == cuda_greedy_check_test ]] && greedy_bin=$(binpath "$t"); done
    limit=$(budget 60 5)
    if [[ -z $greedy_bin ]]; then
      row "greedy near-tie cpu vs cuda" "skipped" "cuda_greedy_check_test not in this build"
    elif (( limit < 5 )); then
      row "greedy near-tie cpu vs cuda" "skipped" "deadline"
    else
      FP4SERVE_GREEDY_MODEL=$model FP4SERVE_GREEDY_TOKENS=32 timeout -k 5 "$limit" "$greedy_bin" --gtest_color=no \
        --gtest_filter='CudaGreedyParity.*' >"$OUT/greedy.log" 2>&1
      rc=$?
      if [[ $have_gpu == 0 ]]; then
        row "greedy near-tie cpu vs cuda" "$(gpu_status $rc)" "$(grep -m1 -o 'no CUDA.*' "$OUT/greedy.log")"
      else
        row "greedy near-tie cpu vs cuda" "$(status_of $rc)" "$(grep -m1 '^\[cuda-greedy\]' "$OUT/greedy.log" | cut -c15-)"
        grep -E '^step [0-9]+:' "$OUT/greedy.log" | head -8 | while read -r line; do echo "    $line" | tee -a "$summary"; done
      fi
    fi
    { echo "--- cpu:"; cat "$OUT/generate-cpu.txt"; echo; echo "--- cuda:"; cat "$OUT/generate-cuda.txt"; echo; } | head -c 3000 >"$OUT/generate.txt"
  fi
fi

# ---- the table, last --------------------------------------------------------------------------------------------
echo
echo "=== summary ($(elapsed) s of ${deadline} s; full logs in $OUT) ==="
cat "$summary"
echo "finished in $(elapsed) s; exit $failed" | tee -a "$summary"
exit "$failed"
