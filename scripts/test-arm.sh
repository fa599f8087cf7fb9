#!/usr/bin/env bash
# Cross-builds the kernels, prepare, quant and model suites for 64-bit Arm (cmake/aarch64-linux-gnu.cmake) and
# runs them under qemu-user with three CPU models, so that Highway's run-time dispatch picks each Arm target:
#   neon      qemu -cpu max,sve=off      → NEON
#   sve-128   qemu -cpu max,sve128=on    → SVE with 128-bit vectors (Grace / Graviton 4 length)
#   sve-256   qemu -cpu max,sve256=on    → SVE_256 (Graviton 3 length)
# Each kernel test also loops over every compiled target the CPU model supports (EMU128 included). Prints one
# line per suite × CPU model with its pass count and the target linear() dispatched to; exits non-zero on any
# failure. Needs the packages of `scripts/install-deps.sh --arm64`. JOBS (default 2) bounds the build.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
BUILD=build/aarch64
SUITES=(backends/cpu/kernels/kernels_linear_test backends/cpu/kernels/kernel_ops_test backends/cpu/prepare/prepare_test quant/quant_test model/model_test)
CPUS=("neon:max,sve=off" "sve-128:max,sve128=on" "sve-256:max,sve256=on")

command -v aarch64-linux-gnu-g++ >/dev/null || { echo "test-arm: aarch64-linux-gnu-g++ missing (scripts/install-deps.sh --arm64)"; exit 2; }
command -v qemu-aarch64 >/dev/null || { echo "test-arm: qemu-aarch64 missing (scripts/install-deps.sh --arm64)"; exit 2; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
  -DFP4SERVE_BUILD_BENCH=OFF -DFP4SERVE_CUDA=OFF -DFP4SERVE_MPI=OFF -DFP4SERVE_XGRAMMAR=OFF >/dev/null
targets=()
for s in "${SUITES[@]}"; do targets+=("$(basename "$s")"); done
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=passive
failed=0
printf '%-9s %-22s %-8s %s\n' cpu suite passed "dispatch target (compiled and supported)"
for entry in "${CPUS[@]}"; do
  label=${entry%%:*}
  cpu=${entry#*:}
  for s in "${SUITES[@]}"; do
    log="$BUILD/test-arm-$label-$(basename "$s").log"
    rc=0
    qemu-aarch64 -cpu "$cpu" "$BUILD/tests/$s" --gtest_brief=1 >"$log" 2>&1 || rc=$?
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log")
    total=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran.*/\1/p' "$log")
    target=$(sed -n 's/^\[  target  \] linear() dispatches to \([^;]*\); compiled and supported:\(.*\)/\1 (\2 )/p' "$log")
    printf '%-9s %-22s %-8s %s\n' "$label" "$(basename "$s")" "${passed:-0}/${total:-?}" "${target:--}"
    if [ "$rc" -ne 0 ]; then
      failed=1
      grep -E '^\[  FAILED  \]|Failure|error' "$log" | head -20 || true
    fi
  done
done
exit "$failed"
