#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/device-prepare.sh [BUILD_DIR] [MODEL_DIR] — run HERE (the Debian 12 build machine, no GPU) before the
# GPU check. It prepares, in the git-ignored folder .device/, what the device machine cannot make itself
# (scripts/device-check.sh explains why):
#   .device/bundle.tar.xz   fp4serve, every test binary of the ctest label `cuda`, bench_gemm_cuda (stripped), the
#                           non-system shared libraries they load (ldd; glibc, the CUDA driver and cuBLAS excluded:
#                           the device has its own), the source path compiled into the tests (fixtures) and the
#                           list of test binaries;
#   .device/model/part-*    MODEL_DIR (default models/default-nvfp4, made by `make run`) as a tar split into chunks
#                           that fit beside the working tree in one call (64 MiB per call, tree included), plus
#                           model.sha256 of the whole tar;
# and prints the exact sequence of `run` calls (command, carry, timeout_s) for the device tool. The calls must
# follow each other within 30 s (the machine's warm period), or the staged chunks are lost with the machine.
set -euo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
build=$(realpath "${1:-build/release}")
model=$(realpath "${2:-models/default-nvfp4}")
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

echo "== building everything in $build (the cuda test binaries are listed by ctest only once built)"
cmake --build "$build" -j"$(nproc)"

echo "== bundle"
rm -rf "$dev/bundle" "$dev/bundle.tar.xz" && mkdir -p "$dev/bundle/bin" "$dev/bundle/lib"
mapfile -t tests < <(ctest --test-dir "$build" -L cuda --show-only=json-v1 |
  python3 -c 'import json,sys; print("\n".join(sorted({t["command"][0] for t in json.load(sys.stdin)["tests"] if t.get("command")})))')
binaries=("$build/fp4serve")
for t in "${tests[@]}"; do [[ $(head -c4 "$t" | od -An -c | tr -d ' ') == 177ELF ]] && binaries+=("$t"); done
[[ -x $build/bench/bench_gemm_cuda ]] && binaries+=("$build/bench/bench_gemm_cuda")
: >"$dev/bundle/tests.txt"
for b in "${binaries[@]}"; do
  cp "$b" "$dev/bundle/bin/" && strip --strip-unneeded "$dev/bundle/bin/$(basename "$b")"
  case " ${tests[*]} " in *" $b "*) basename "$b" >>"$dev/bundle/tests.txt" ;; esac
done
# Libraries the device lacks: everything ldd resolves except glibc's own, the CUDA driver and cuBLAS/cudart.
for b in "${binaries[@]}"; do ldd "$b"; done | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case $(basename "$lib") in
    # glibc's own, the CUDA driver and toolkit libraries, and the C++ runtime, which the device's compiler brings
    # in a newer (backward compatible) version that its Python and tools also need.
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libcudart*|libstdc++*|libgcc_s*) ;;
    *) cp -L "$lib" "$dev/bundle/lib/" ;;
  esac
done
sed -n 's/^fp4serve_SOURCE_DIR:STATIC=//p' "$build/CMakeCache.txt" >"$dev/bundle/source_dir"
echo "Debian $(cat /etc/debian_version 2>/dev/null), $(ldd --version | head -1 | grep -Eo '[0-9.]+$'), commit $(git rev-parse --short HEAD)" \
  >"$dev/bundle/built_on"
tar -C "$dev/bundle" -cJf "$dev/bundle.tar.xz" .
bundle_bytes=$(stat -c %s "$dev/bundle.tar.xz")
echo "bundle: ${#binaries[@]} binaries ($(wc -l <"$dev/bundle/tests.txt") test binaries), $(ls "$dev/bundle/lib" | wc -l) libraries, $((bundle_bytes / 1024)) KiB"

# What travels with every call: tracked files plus untracked files git does not ignore.
# FP4SERVE_TREE_BYTES overrides it when the calls will be made from another checkout (the tool sends the session's).
tree_bytes=${FP4SERVE_TREE_BYTES:-$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)}
echo "working tree: $((tree_bytes / 1024)) KiB of the $((limit / 1024)) KiB per call"
if (( tree_bytes + bundle_bytes + margin > limit )); then
  echo "device-prepare: the tree ($tree_bytes B) and the bundle ($bundle_bytes B) exceed one call's 64 MiB" >&2
  exit 1
fi

echo "== model chunks of $model"
[[ -f $model/model.safetensors ]] || { echo "device-prepare: no $model/model.safetensors (run make run)" >&2; exit 1; }
chunk=$((limit - tree_bytes - margin - 4096))
(( chunk >= 4 * 1024 * 1024 )) || { echo "device-prepare: only $chunk bytes per call are left for the model" >&2; exit 1; }
rm -rf "$dev/model" && mkdir -p "$dev/model"
tar -C "$(dirname "$model")" -cf - --transform "s|^$(basename "$model")|default-nvfp4|" "$(basename "$model")" |
  split -b "$chunk" -a 2 - "$dev/model/part-"
cat "$dev/model"/part-* | sha256sum | cut -d' ' -f1 >"$dev/model/model.sha256"
mapfile -t parts < <(cd "$dev/model" && ls part-*)
echo "model: ${#parts[@]} chunks of at most $((chunk / 1024)) KiB"

# The last chunk travels with the bundle when both fit in one call.
last=${parts[-1]}
last_bytes=$(stat -c %s "$dev/model/$last")
with_bundle=0
(( tree_bytes + bundle_bytes + last_bytes + margin <= limit )) && with_bundle=1
echo
echo "== the device calls, in order, back to back (each within 30 s of the previous one's end):"
n=1
for p in "${parts[@]}"; do
  [[ $with_bundle == 1 && $p == "$last" ]] && break
  echo "run #$n: command='mkdir -p /root/stage && cp .device/model/$p .device/model/model.sha256 /root/stage/ && ls -l /root/stage'"
  echo "        carry=[\".device/model/$p\", \".device/model/model.sha256\"] timeout_s=120"
  n=$((n + 1))
done
if [[ $with_bundle == 1 ]]; then
  echo "run #$n: command='mkdir -p /root/stage && cp .device/model/$last .device/model/model.sha256 /root/stage/ && bash scripts/device-check.sh'"
  echo "        carry=[\".device/bundle.tar.xz\", \".device/model/$last\", \".device/model/model.sha256\"] timeout_s=540"
else
  echo "run #$n: command='bash scripts/device-check.sh'"
  echo "        carry=[\".device/bundle.tar.xz\"] timeout_s=540"
fi
echo "then give_back. If a call finds a fresh machine (the stage is empty), device-check.sh still runs the tests and"
echo "the benchmark and reports 'model not staged' for the generate comparison."
