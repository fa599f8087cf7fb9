#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Large test data stored xz-compressed: tests/data/<path>.xz is tracked, <path> is inflated next to it.

Why: the tracked tree is shipped whole to the GPU machine (64 MiB per call, build outputs included), and the
big fixtures compress well (tokenizer JSON 8x, format tables 7x, random-weight checkpoints ~1.25x). The build
inflates every tests/data/**/*.xz before any test or benchmark is built (cmake/TestData.cmake, target
fp4serve_test_data), so tests, benchmarks and the CLI read the plain files as before; the plain files are
listed in tests/data/.gitignore. Python tools that read them call inflate() (no build needed).

  python3 tools/test_data_xz.py compress tests/data/ref/llama-nvfp4/model.safetensors ...
      writes <file>.xz (xz format, preset 9e, CRC64: byte-identical for identical input), keeps <file>,
      adds it to tests/data/.gitignore; then `git rm --cached <file>` if it was tracked, `git add <file>.xz`
  python3 tools/test_data_xz.py inflate            # every tests/data/**/*.xz whose plain file is missing/stale
  python3 tools/test_data_xz.py check              # every .xz inflates to its plain file, every plain file listed
Only the standard library is needed.
"""
import lzma
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
IGNORE = os.path.join(DATA, ".gitignore")
IGNORE_HEAD = ("# Plain copies of the files stored as <file>.xz (tools/test_data_xz.py); the build inflates them.\n")


def compress(path):
    """Write path + '.xz' and list path in tests/data/.gitignore. Returns (plain bytes, compressed bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    packed = lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64,
                           preset=9 | lzma.PRESET_EXTREME)
    with open(path + ".xz", "wb") as f:
        f.write(packed)
    ignored = set(_ignored())
    ignored.add(_rel(path))
    with open(IGNORE, "w") as f:
        f.write(IGNORE_HEAD + "".join(f"/{p}\n" for p in sorted(ignored)))
    return len(data), len(packed)


def inflate(path):
    """Make sure `path` exists and matches path + '.xz' when that exists; returns path."""
    xz = path + ".xz"
    if os.path.exists(xz) and (not os.path.exists(path) or os.path.getmtime(path) < os.path.getmtime(xz)):
        with open(xz, "rb") as f:
            data = lzma.decompress(f.read())
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


def all_xz():
    for d, _, files in os.walk(DATA):
        for f in sorted(files):
            if f.endswith(".xz"):
                yield os.path.join(d, f)


def _rel(path):
    return os.path.relpath(os.path.abspath(path), DATA)


def _ignored():
    if not os.path.exists(IGNORE):
        return []
    return [ln.strip().lstrip("/") for ln in open(IGNORE) if ln.strip() and not ln.startswith("#")]


def main(argv):
    if len(argv) < 1 or argv[0] not in ("compress", "inflate", "check"):
        print(__doc__)
        return 2
    if argv[0] == "compress":
        for p in argv[1:]:
            n, c = compress(p)
            print(f"{p}: {n} -> {c} bytes ({c / n:.1%})")
        return 0
    if argv[0] == "inflate":
        for xz in all_xz():
            inflate(xz[:-3])
        return 0
    bad = 0
    listed = set(_ignored())
    for xz in all_xz():
        plain = xz[:-3]
        with open(xz, "rb") as f:
            data = lzma.decompress(f.read())
        if os.path.exists(plain) and open(plain, "rb").read() != data:
            print(f"{plain}: differs from {os.path.basename(xz)}")
            bad += 1
        if _rel(plain) not in listed:
            print(f"{plain}: not listed in tests/data/.gitignore")
            bad += 1
    print(f"{sum(1 for _ in all_xz())} compressed files, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
