#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device-check.sh — the one GPU check of issue 9, run on the device machine (one H200, sm_90) through the
# `device` tool's `run`, from the repository root. Within about 8 minutes it:
#   1. finds a build: the bundle carried in .device/bundle.tar.xz (made HERE by scripts/device-prepare.sh),
#      else a local build/release (a machine with our Debian packages, e.g. to test this script);
#   2. runs the CUDA tests (ctest label `cuda`: CUDA device, linear, ops and decoder tests; with the bundle the
#      same gtest binaries are run directly, because a CTest tree does not relocate);
#   3. runs bench_gemm_cuda (part 1: FP4 GEMV/GEMM vs cuBLAS bf16 and vs the device-to-device copy bandwidth it
#      measures first);
#   4. reassembles the default model from the chunks staged in /root/stage by earlier calls (or uses
#      models/default-nvfp4 when present), runs `fp4serve generate` for 32 greedy tokens with --device cpu and
#      --device cuda and compares the texts;
#   5. prints one summary table last and writes it to $OUT/summary.txt (with the logs beside it).
#
# Why a carried build and not a build on the device: the device image has CUDA 13, cmake, ninja and a compiler but
# none of our Debian -dev packages (Highway, fmt, nlohmann-json, CLI11, PCRE2, utf8proc, OpenBLAS, GoogleTest,
# Google Benchmark) and no network; a full build there would also eat most of the 8 minutes. Binaries built on
# Debian 12 (glibc 2.36) run on the device's newer glibc; device-prepare.sh ships the non-system shared libraries
# they need (found with ldd) in bundle/lib, and the CUDA runtime is linked statically (cuBLAS comes from the
# device's own CUDA 13 in /usr/local/cuda/lib64). The tests read their fixtures from the source path compiled into
# them (FP4SERVE_TEST_DATA); this script links that path to the repository root on the device.
#
# Why the model is staged: the working tree (~30–63 MiB) and the carried paths share one 64 MiB limit per call,
# and models/default-nvfp4 is ~115 MB (FP4 codes and bf16 tables: zstd -19 saves only 15%, so it is not
# compressed). device-prepare.sh tars it and splits the tar into chunks that fit
# beside the tree; one `run` per chunk copies it to /root/stage, which survives between calls while the machine
# stays warm (30 s after each call: issue the calls back to back). A missing or corrupt stage makes step 4 report
# "model not staged" and the rest still runs. The exact sequence of calls is printed by device-prepare.sh.
#
# Testing here (no GPU): `FP4SERVE_FAKE_NO_GPU=1 scripts/device-check.sh` hides any GPU (CUDA_VISIBLE_DEVICES=)
# and must reach every CUDA step and report "no GPU" for each, cleanly.
# Environment: OUT (default .device/out), FP4SERVE_STAGE (default /root/stage, else .device/stage when /root is not
# writable), FP4SERVE_BUILD (default build/release), FP4SERVE_MODEL (a model folder to use instead of the stage).
set -uo pipefail

root=$(pwd)
start=$(date +%s)
OUT=${OUT:-$root/.device/out}
mkdir -p "$OUT"
stage=${FP4SERVE_STAGE:-/root/stage}
if ! mkdir -p "$stage" 2>/dev/null; then stage=$root/.device/stage; mkdir -p "$stage"; fi
build=${FP4SERVE_BUILD:-$root/build/release}
summary=()
row() { summary+=("$(printf '| %-26s | %-8s | %s |' "$1" "$2" "$3")"); }
elapsed() { echo $(( $(date +%s) - start )); }
log() { echo "[device-check $(elapsed)s] $*"; }

# ---- 0. the GPU -------------------------------------------------------------------------------------------------
if [[ ${FP4SERVE_FAKE_NO_GPU:-0} == 1 ]]; then
  export CUDA_VISIBLE_DEVICES=
  log "FP4SERVE_FAKE_NO_GPU=1: every GPU hidden"
fi
gpu="none"
if [[ ${FP4SERVE_FAKE_NO_GPU:-0} != 1 ]] && command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  [[ -z $gpu ]] && gpu="none"
fi
have_gpu=0
[[ $gpu != none ]] && have_gpu=1
row "GPU" "$([[ $have_gpu == 1 ]] && echo ok || echo 'no GPU')" "${gpu}"
log "GPU: $gpu"

# ---- 1. the build -----------------------------------------------------------------------------------------------
bin=""
tests_mode=""
if [[ -f $root/.device/bundle.tar.xz ]]; then
  bundle=/tmp/fp4serve-bundle
  rm -rf "$bundle" && mkdir -p "$bundle"
  tar -xJf "$root/.device/bundle.tar.xz" -C "$bundle" 2>/dev/null ||
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      "$root/.device/bundle.tar.xz" "$bundle"
  if [[ -x $bundle/bin/fp4serve ]]; then
    bin=$bundle/bin
    tests_mode=bundle
    export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    if ! ls /usr/local/cuda/lib64/libcublas.so.* >/dev/null 2>&1; then  # else PyTorch's pip copy of cuBLAS
      cublas=$(find /opt /usr -name 'libcublas.so.*' 2>/dev/null | head -1)
      [[ -n $cublas ]] && export LD_LIBRARY_PATH="$(dirname "$cublas"):$LD_LIBRARY_PATH"
    fi
    missing=$(for b in "$bundle"/bin/*; do ldd "$b"; done 2>/dev/null | grep 'not found' | sort -u | tr -s ' \t\n' ' ')
    [[ -n $missing ]] && row "libraries" "FAIL" "missing: $missing"
    # Large fixtures are tracked xz-compressed and inflated by the CMake build (cmake/TestData.cmake when
    # present); with a carried build nobody builds here, so inflate them the same way (Python's lzma: no xz needed).
    python3 - <<'EOF_XZ'
import lzma, pathlib, shutil
for packed in pathlib.Path("tests/data").rglob("*.xz"):
    plain = packed.with_suffix("")
    if not plain.exists() or plain.stat().st_mtime < packed.stat().st_mtime:
        with lzma.open(packed) as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
EOF_XZ
    src=$(cat "$bundle/source_dir")
    if [[ ! -e $src/tests/data ]]; then mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"; fi
    row "build" "ok" "carried bundle ($(cat "$bundle/built_on" 2>/dev/null)); fixtures via $src"
  else
    row "build" "FAIL" ".device/bundle.tar.xz did not unpack"
  fi
elif [[ -x $build/fp4serve ]]; then
  bin=$build
  tests_mode=ctest
  row "build" "ok" "local build $build"
else
  row "build" "FAIL" "no .device/bundle.tar.xz and no $build/fp4serve: run scripts/device-prepare.sh here first"
fi
log "build: ${bin:-none}"

# ---- 2. CUDA tests ----------------------------------------------------------------------------------------------
if [[ -n $bin ]]; then
  : >"$OUT/tests.log"
  if [[ $tests_mode == ctest ]]; then
    timeout 240 ctest --test-dir "$build" -L cuda --output-on-failure -V >"$OUT/tests.log" 2>&1
    rc=$?
    total="ctest -L cuda: $(grep -Eo '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$OUT/tests.log" | tail -1)"
    skipped=$(grep -Ec '^[[:space:]]+[0-9]+ - .*\(Skipped\)$' "$OUT/tests.log")
  else
    rc=0
    for t in $(cat "$bundle/tests.txt"); do
      echo "=== $t" >>"$OUT/tests.log"
      timeout 150 "$bin/$t" --gtest_color=no >>"$OUT/tests.log" 2>&1 || rc=1
    done
    passed=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$OUT/tests.log" | awk '{s+=$4} END {print s+0}')
    failed=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$OUT/tests.log" | awk '{s+=$4} END {print s+0}')
    total="binaries: $(wc -w <"$bundle/tests.txt"), tests passed $passed, failed $failed"
    skipped=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$OUT/tests.log" | awk '{s+=$4} END {print s+0}')
  fi
  if [[ $rc == 0 && $have_gpu == 1 ]]; then status=ok; elif [[ $rc == 0 ]]; then status="no GPU"; else status=FAIL; fi
  row "cuda tests" "$status" "$total; skipped $skipped"
  while read -r line; do row "  decoder parity" "info" "${line#*] }"; done < <(grep '^\[cuda-parity\]' "$OUT/tests.log")
  grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/tests.log" | sort -u | head -8 | while read -r line; do echo "  $line"; done
else
  row "cuda tests" "skipped" "no build"
fi
log "tests done"

# ---- 3. GEMM benchmark + copy bandwidth -------------------------------------------------------------------------
bench_bin=""
for b in "$bin/bench_gemm_cuda" "$bin/bench/bench_gemm_cuda"; do [[ -x $b ]] && bench_bin=$b && break; done
if [[ -z $bench_bin ]]; then
  row "bench_gemm_cuda" "skipped" "not in this build"
elif [[ $have_gpu == 0 ]]; then
  "$bench_bin" >"$OUT/bench.log" 2>&1
  row "bench_gemm_cuda" "no GPU" "$(head -c 150 "$OUT/bench.log" | tr '\n' ' ')"
else
  timeout 200 "$bench_bin" --benchmark_out="$OUT/bench.json" --benchmark_out_format=json >"$OUT/bench.log" 2>&1
  rc=$?
  copy=$(grep -Eo 'copy bandwidth [0-9.]+ GB/s' "$OUT/bench.log" | head -1)
  row "bench_gemm_cuda" "$([[ $rc == 0 ]] && echo ok || echo "rc=$rc")" "D2D ${copy:-copy bandwidth not printed}"
  if [[ -s $OUT/bench.json ]]; then
    while read -r line; do summary+=("$line"); done < <(python3 - "$OUT/bench.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1])).get("benchmarks", [])
for b in rows:
    if b.get("run_type") == "aggregate":
        continue
    c = lambda k: ("%.2f" % b[k]) if k in b else "-"
    print("|   %-60s | GB/s %8s | copy_ratio %5s | vs_cublas %5s | TFLOP/s %7s |" %
          (b["name"][:60], c("weight_GBps"), c("copy_ratio"), c("vs_cublas"), c("TFLOPs")))
EOF
    )
  fi
fi
log "bench done"

# ---- 4. generate: CPU vs GPU on the default model ---------------------------------------------------------------
model=${FP4SERVE_MODEL:-}
if [[ -z $model && -d $root/models/default-nvfp4 ]]; then model=$root/models/default-nvfp4; fi
if [[ -z $model && -f $stage/model.sha256 ]]; then
  if (cd "$stage" && cat part-* 2>/dev/null | sha256sum | cut -d' ' -f1 | cmp -s - model.sha256); then
    rm -rf "$stage/model" && mkdir -p "$stage/model"
    cat "$stage"/part-* | tar -xf - -C "$stage/model" && model=$stage/model/default-nvfp4
  fi
fi
prompt="The capital of France is"
if [[ -z $bin ]]; then
  row "generate cpu vs cuda" "skipped" "no build"
elif [[ -z $model || ! -f $model/model.safetensors ]]; then
  row "generate cpu vs cuda" "skipped" "model not staged (need every chunk in $stage: see scripts/device-prepare.sh)"
else
  gen() {  # $1 = device
    timeout 90 "$bin/fp4serve" generate -m "$model" -p "$prompt" -n 32 --temperature 0 --ignore-eos \
      --device "$1" --max-model-len 256 >"$OUT/generate-$1.txt" 2>"$OUT/generate-$1.err"
  }
  gen cpu; cpu_rc=$?
  gen cuda; gpu_rc=$?
  cpu_speed=$(grep -Eo 'decode [0-9]+ tokens, [0-9.]+ tokens/s' "$OUT/generate-cpu.err" | tail -1)
  gpu_speed=$(grep -Eo 'decode [0-9]+ tokens, [0-9.]+ tokens/s' "$OUT/generate-cuda.err" | tail -1)
  row "generate --device cpu" "$([[ $cpu_rc == 0 ]] && echo ok || echo "rc=$cpu_rc")" "${cpu_speed:-$(tail -1 "$OUT/generate-cpu.err")}"
  if [[ $gpu_rc == 0 ]]; then
    row "generate --device cuda" "ok" "$gpu_speed"
  elif [[ $have_gpu == 0 ]]; then
    row "generate --device cuda" "no GPU" "exit $gpu_rc: $(grep -m1 -o 'fp4serve:.*' "$OUT/generate-cuda.err" | head -c 150)"
  else
    row "generate --device cuda" "FAIL" "exit $gpu_rc: $(tail -1 "$OUT/generate-cuda.err" | head -c 150)"
  fi
  if [[ $cpu_rc == 0 && $gpu_rc == 0 ]]; then
    if cmp -s "$OUT/generate-cpu.txt" "$OUT/generate-cuda.txt"; then
      row "32 greedy tokens cpu=cuda" "ok" "identical text"
    else
      diverge=$(cmp "$OUT/generate-cpu.txt" "$OUT/generate-cuda.txt" | grep -Eo 'byte [0-9]+')
      row "32 greedy tokens cpu=cuda" "DIFFER" "texts differ from $diverge (see generate-*.txt)"
    fi
  fi
  { echo "--- cpu:"; cat "$OUT/generate-cpu.txt"; echo "--- cuda:"; cat "$OUT/generate-cuda.txt"; } | head -40
fi
log "generate done"

# ---- 5. summary -------------------------------------------------------------------------------------------------
{
  echo "fp4serve device-check ($(date -u +%Y-%m-%dT%H:%MZ), $(elapsed) s, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  printf '| %-26s | %-8s | %s |\n' "step" "status" "detail"
  printf '|%s|%s|%s|\n' "----------------------------" "----------" "--------"
  printf '%s\n' "${summary[@]}"
} | tee "$OUT/summary.txt"
