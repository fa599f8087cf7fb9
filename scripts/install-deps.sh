#!/usr/bin/env bash
# Installs the Debian packages fp4serve builds against (cmake/Deps.cmake finds each one; README "Build options").
# tmux runs the chat REPL test (tests/app/chat_repl_tmux_test.sh); libedit-dev is the REPL's line editor. Idempotent:
# does nothing when every package is already installed. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libboost-dev libfmt-dev
  libpcre2-dev libutf8proc-dev libopenblas-dev libedit-dev
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev xz-utils
  clang-14 libclang-rt-14-dev tmux
)
command -v python3 >/dev/null 2>&1 || packages+=(python3)

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
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
