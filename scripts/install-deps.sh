#!/usr/bin/env bash
# Installs the Debian packages fp4serve builds against (cmake/Deps.cmake finds each one; README "Build options").
# tmux runs the chat REPL test (tests/app/chat_repl_tmux_test.sh); libedit-dev is the REPL's line editor; Open MPI
# (libopenmpi-dev, openmpi-bin) is tensor parallelism's launcher and host transport (src/dist). Idempotent:
# does nothing when every package is already installed. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libboost-dev libfmt-dev
  libpcre2-dev libutf8proc-dev libopenblas-dev libedit-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev xz-utils
  clang-14 libclang-rt-14-dev tmux
)
command -v python3 >/dev/null 2>&1 || packages+=(python3)
# --arm64: also what `make test-arm` needs (the cross compiler, qemu-user and the arm64 multiarch -dev packages
# the kernels, prepare, quant and model suites link; header-only packages are shared between architectures).
arm64=0
[ "${1:-}" = "--arm64" ] && arm64=1
if [ "$arm64" -eq 1 ]; then
  packages+=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libfmt-dev:arm64
             libssl-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libedit-dev:arm64 libcpp-httplib-dev:arm64
             libgomp1:arm64)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
if [ "$arm64" -eq 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  "${sudo_cmd[@]}" dpkg --add-architecture arm64
fi
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
