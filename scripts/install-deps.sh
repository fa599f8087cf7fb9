#!/usr/bin/env bash
# Installs the Debian packages fp4serve builds against (cmake/Deps.cmake finds each one; docs/testing.md "Build options").
# tmux runs the chat REPL test (tests/app/chat_repl_tmux_test.sh); libedit-dev is the REPL's line editor; Open MPI
# (libopenmpi-dev, openmpi-bin) is tensor parallelism's launcher and host transport (src/dist); python3-venv is
# the virtual environment scripts/get-default-model.sh builds the default model in (`make run`); jq and bc are
# read by the benchmark scripts. Idempotent: does nothing when every package is already installed. Needs root
# (or sudo) only when something is missing. Ends by checking every command the Makefile and scripts run, so a
# missing tool is named here rather than after a 16-minute build. Then it builds the one dependency Debian does not
# package, xgrammar's C++ core (constrained decoding), from its pinned PyPI sdist into .deps/xgrammar
# (scripts/build-xgrammar.sh; a no-op once built). FP4SERVE_SKIP_XGRAMMAR=1 skips it (then configure with
# -DFP4SERVE_XGRAMMAR=OFF).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

packages=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libboost-dev libfmt-dev
  libpcre2-dev libutf8proc-dev libopenblas-dev libedit-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev xz-utils
  clang-14 libclang-rt-14-dev tmux python3 python3-venv jq bc
)
# --arm64: also what `make test-arm` needs (the cross compiler, qemu-user and the arm64 multiarch -dev packages
# the kernels, prepare, quant and model suites link; header-only packages are shared between architectures).
arm64=0
[ "${1:-}" = "--arm64" ] && arm64=1
if [ "$arm64" -eq 1 ]; then
  packages+=(g++-aarch64-linux-gnu qemu-user libhwy-dev:arm64 libgtest-dev:arm64 libgmock-dev:arm64 libfmt-dev:arm64
             libssl-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libedit-dev:arm64 libcpp-httplib-dev:arm64
             libgomp1:arm64)
fi

# Every command the Makefile, scripts/ and bench/peer/ run (the package that provides it, for the message).
check_tools() {
  local tools=(c++:build-essential cmake:cmake ninja:ninja-build pkg-config:pkg-config git:git
               python3:python3 mpirun:openmpi-bin tmux:tmux clang++-14:clang-14 xz:xz-utils tar:tar
               sha256sum:coreutils jq:jq bc:bc)
  [ "$arm64" -eq 1 ] && tools+=(aarch64-linux-gnu-g++:g++-aarch64-linux-gnu qemu-aarch64:qemu-user)
  local absent=() t
  for t in "${tools[@]}"; do command -v "${t%%:*}" >/dev/null 2>&1 || absent+=("${t%%:*} (Debian package ${t#*:})"); done
  # get-default-model.sh makes a virtual environment: python3 alone is not enough on Debian.
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || absent+=("python3 -m venv (Debian package python3-venv)")
  if [ ${#absent[@]} -gt 0 ]; then
    printf 'install-deps: still missing after installing: %s\n' "${absent[@]}" >&2
    exit 1
  fi
}

# The arm64 cross build configures without xgrammar (scripts/test-arm.sh), so --arm64 does not build it.
build_xgrammar() {
  [ "$arm64" -eq 1 ] || [ "${FP4SERVE_SKIP_XGRAMMAR:-0}" = 1 ] || "$ROOT/scripts/build-xgrammar.sh"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  check_tools
  echo "install-deps: all ${#packages[@]} packages present"
  build_xgrammar
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
check_tools
build_xgrammar
