#!/usr/bin/env bash
# Builds xgrammar's C++ core (the grammar engine vLLM and SGLang use for structured outputs) from its PyPI sdist,
# pinned by version and SHA-256, into .deps/xgrammar (lib/libxgrammar.a, include/xgrammar, include/dlpack), where
# cmake/Deps.cmake finds it. scripts/install-deps.sh runs it; idempotent: a prefix whose stamp matches the pin is
# left alone.
#
#   scripts/build-xgrammar.sh [--prefix DIR] [--jobs N]
#
# The sdist vendors picojson and dlpack, so the build needs only a C++17 compiler, CMake and Ninja. Flags:
#  - Python bindings off: the sdist's cmake/config.cmake turns them on unconditionally, so a config.cmake in the
#    build folder (which its CMakeLists.txt reads first) turns them off again;
#  - -fno-lto: its CMakeLists adds -flto=auto, which would leave GCC LTO bytecode in the archive (clang cannot link
#    it and every fp4serve link would redo the optimization);
#  - -Wno-error: a compiler newer than the one the pinned release was tested with must not fail the build on a
#    new warning in code fp4serve does not own.
# Apache-2.0 (the sdist's LICENSE and NOTICE are installed beside the library).
set -euo pipefail

VERSION=0.2.9
SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
URL="https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-$VERSION.tar.gz"
CXXFLAGS_XGR="-fno-lto -Wno-error"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="$ROOT/.deps/xgrammar"
JOBS="${JOBS:-$(nproc)}"
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX="$2"; shift 2 ;;
        --jobs) JOBS="$2"; shift 2 ;;
        -h|--help) sed -n 2,17p "$0"; exit 0 ;;
        *) echo "build-xgrammar: unknown argument $1" >&2; exit 2 ;;
    esac
done
log() { echo "build-xgrammar: $*"; }
die() { echo "build-xgrammar: error: $*" >&2; exit 1; }

STAMP="$PREFIX/.fp4serve-stamp"
want="xgrammar $VERSION sha256 $SHA256 flags $CXXFLAGS_XGR compiler $(c++ -dumpfullversion 2>/dev/null || echo unknown)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -f "$PREFIX/lib/libxgrammar.a" ]; then
    log "xgrammar $VERSION present in $PREFIX"
    exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/fp4serve-xgrammar.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
SDIST="$WORK/xgrammar-$VERSION.tar.gz"
log "downloading the xgrammar $VERSION sdist from PyPI"
# Python's urllib rather than curl: python3 is already a dependency, curl is not in every minimal image.
python3 - "$URL" "$SDIST" <<'EOF' || die "download of $URL failed"
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=120) as r, open(sys.argv[2], "wb") as f:
    while chunk := r.read(1 << 20):
        f.write(chunk)
EOF
got="$(sha256sum "$SDIST" | cut -d' ' -f1)"
[ "$got" = "$SHA256" ] || die "SHA-256 of the sdist is $got, expected $SHA256 (pinned); refusing to build it"
tar xzf "$SDIST" -C "$WORK"
SRC="$WORK/xgrammar-$VERSION"
BUILD="$WORK/build"
mkdir -p "$BUILD"
cat > "$BUILD/config.cmake" <<'EOF'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
EOF
log "building (about 10 CPU-minutes; -j $JOBS)"
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$CXXFLAGS_XGR" \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" -DCMAKE_INSTALL_LIBDIR=lib > "$WORK/cmake.log" 2>&1 ||
    { tail -30 "$WORK/cmake.log" >&2; die "configuring xgrammar failed"; }
nice cmake --build "$BUILD" -j "$JOBS" > "$WORK/build.log" 2>&1 ||
    { tail -40 "$WORK/build.log" >&2; die "building xgrammar failed"; }
rm -rf "$PREFIX"
cmake --install "$BUILD" > "$WORK/install.log" 2>&1 || { tail -20 "$WORK/install.log" >&2; die "installing failed"; }
install -m 644 "$SRC/LICENSE" "$SRC/NOTICE" "$PREFIX/"
echo "$want" > "$STAMP"
log "installed xgrammar $VERSION into $PREFIX"
