#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device-prepare.sh [BUILD_DIR] — run HERE (the Debian 12 build machine, no GPU) before the GPU check. It
# builds what the check runs and packs it into the git-ignored .device/bundle.tar.xz, which travels with the ONE
# device call of scripts/device-check.sh (that script explains why the device cannot build the project itself):
#   bin/   fp4serve, bench_gemm_cuda, bench_attention_cuda and every CUDA test binary (cuda_*_test), stripped;
#   lib/   the non-system shared libraries they load (ldd; glibc, the CUDA driver, cuBLAS/cudart and the C++
#          runtime excluded: the device has its own, newer ones);
#   tests.txt (the test binaries, in the order device-check.sh runs them), source_dir (the source path compiled
#   into the tests, where they look for fixtures), built_on.
# Then it checks that tree + bundle fit one call (64 MiB) and prints that call. The model is NOT staged: the check
# builds a SmolLM2-shaped random model on the device (tools/make_random_model.py + fp4serve quantize).
set -euo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
build=$(realpath "${1:-build/release}")
limit=$((64 * 1024 * 1024))
margin=$((1024 * 1024))  # headroom for files that appear between this script and the call
dev=$root/.device

if ! git check-ignore -q .device/probe; then
  echo "device-prepare: .device/ is not git-ignored (it is in .gitignore on main); refusing to fill the tree" >&2
  exit 1
fi
[[ -f $build/CMakeCache.txt ]] || { echo "device-prepare: no CMake build in $build" >&2; exit 1; }
grep -q '^FP4SERVE_CUDA_ARCHS.*90' "$build/CMakeCache.txt" ||
  echo "device-prepare: warning: $build does not list sm_90 in FP4SERVE_CUDA_ARCHS" >&2

# Cheap, quick tests first: a call cut short by its deadline still reports the basics.
order=(cuda_device_test cuda_fp4_math_test cuda_partition_test cuda_mma_fragment_test cuda_ops_test cuda_linear_test
       backend_parity_test cuda_greedy_check_test)
mapfile -t all_tests < <(ninja -C "$build" -t targets all | grep -Eo '^cuda_[a-z0-9_]+_test' | sort -u)
tests=("${order[@]}")
for t in "${all_tests[@]}"; do case " ${order[*]} " in *" $t "*) ;; *) tests+=("$t") ;; esac; done
echo "== building fp4serve bench_gemm_cuda bench_attention_cuda ${tests[*]} in $build"
cmake --build "$build" -j"${FP4SERVE_JOBS:-$(nproc)}" --target fp4serve bench_gemm_cuda bench_attention_cuda "${tests[@]}"

echo "== bundle"
rm -rf "$dev/bundle" "$dev/bundle.tar.xz" && mkdir -p "$dev/bundle/bin" "$dev/bundle/lib"
binaries=("$build/fp4serve" "$build/bench/bench_gemm_cuda" "$build/bench/bench_attention_cuda")
: >"$dev/bundle/tests.txt"
for t in "${tests[@]}"; do
  path=$(find "$build/tests" -type f -name "$t" -perm -u+x | head -1)
  [[ -n $path ]] || { echo "device-prepare: $t was not built" >&2; exit 1; }
  binaries+=("$path")
  echo "$t" >>"$dev/bundle/tests.txt"
done
for b in "${binaries[@]}"; do
  cp "$b" "$dev/bundle/bin/" && strip --strip-unneeded "$dev/bundle/bin/$(basename "$b")"
done
for b in "${binaries[@]}"; do ldd "$b"; done | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libcudart*|libstdc++*|libgcc_s*) ;;
    *) cp -L "$lib" "$dev/bundle/lib/" && strip --strip-unneeded "$dev/bundle/lib/$(basename "$lib")" 2>/dev/null || true ;;
  esac
done
sed -n 's/^fp4serve_SOURCE_DIR:STATIC=//p' "$build/CMakeCache.txt" >"$dev/bundle/source_dir"
echo "Debian $(cat /etc/debian_version 2>/dev/null), glibc $(ldd --version | head -1 | grep -Eo '[0-9.]+$'), commit $(git rev-parse --short HEAD)" \
  >"$dev/bundle/built_on"
# One xz stream over the whole tar (no -T): the test binaries share most of their code, which a single
# dictionary finds across files.
tar -C "$dev/bundle" -cf - . | xz -9 -c >"$dev/bundle.tar.xz.tmp"
mv "$dev/bundle.tar.xz.tmp" "$dev/bundle.tar.xz"
bundle_bytes=$(stat -c %s "$dev/bundle.tar.xz")
echo "bundle: ${#binaries[@]} binaries (${#tests[@]} test binaries), $(ls "$dev/bundle/lib" | wc -l) libraries," \
  "$(du -sk "$dev/bundle" | cut -f1) KiB unpacked, $((bundle_bytes / 1024)) KiB as .device/bundle.tar.xz"

# What travels with every call: tracked files plus untracked files git does not ignore.
# FP4SERVE_TREE_BYTES overrides it when the call will be made from another checkout (the tool sends the session's).
tree_bytes=${FP4SERVE_TREE_BYTES:-$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)}
echo "working tree: $((tree_bytes / 1024)) KiB; tree + bundle: $(((tree_bytes + bundle_bytes) / 1024)) KiB of the $((limit / 1024)) KiB per call"
if (( tree_bytes + bundle_bytes + margin > limit )); then
  echo "device-prepare: the tree ($tree_bytes B) and the bundle ($bundle_bytes B) exceed one call's 64 MiB" >&2
  exit 1
fi
echo
echo "== the device call (one; then give_back):"
echo "run command='bash scripts/device-check.sh' carry=[\".device/bundle.tar.xz\"] timeout_s=360"
echo "(a global deadline of 300 s inside; FP4SERVE_DEADLINE=N before 'bash' changes it — keep timeout_s ≥ N + 60)"
