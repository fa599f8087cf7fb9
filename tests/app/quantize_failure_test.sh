#!/bin/sh
# `fp4serve quantize` leaves nothing partial behind when writing fails, and a failed or killed run never blocks
# the next one.
# usage: quantize_failure_test.sh FP4SERVE SOURCE_DIR
# 1. A file-size limit (ulimit -f, with SIGXFSZ ignored so write() fails with EFBIG as on a full disk) below the
#    output's size: exit 2 with the write error, and neither OUT nor OUT.tmp exists afterwards.
# 2. A tiny tmpfs as the output's file system (only where this process may mount one, i.e. as root with
#    CAP_SYS_ADMIN): the same, with the real ENOSPC.
# 3. A leftover OUT.tmp (a run killed by SIGKILL) is removed and the rerun succeeds.
set -u
FP4SERVE=$1
SRC=$2
WORK=$(mktemp -d)
cleanup() { umount "$WORK/tiny" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; ls -la "$WORK" "$WORK"/* 2>/dev/null; exit 1; }

# 1. File-size limit: 64 blocks (32-64 KiB), far below the quantized model.
( trap '' XFSZ; ulimit -f 64; "$FP4SERVE" quantize -m "$SRC" -o "$WORK/out" --scheme nvfp4a16 ) > "$WORK/log" 2>&1
rc=$?
cat "$WORK/log"
[ $rc -eq 2 ] || fail "expected exit 2 under the file-size limit, got $rc"
grep -q "write failed" "$WORK/log" || fail "no write error in the message"
[ ! -e "$WORK/out" ] || fail "the partial output folder $WORK/out was left behind"
[ ! -e "$WORK/out.tmp" ] || fail "the staging folder $WORK/out.tmp was left behind"

# 2. A 64 KiB tmpfs, when mounting is allowed here.
mkdir "$WORK/tiny"
if mount -t tmpfs -o size=64k tmpfs "$WORK/tiny" 2>/dev/null; then
  "$FP4SERVE" quantize -m "$SRC" -o "$WORK/tiny/out" --scheme nvfp4a16 > "$WORK/log" 2>&1
  rc=$?
  cat "$WORK/log"
  [ $rc -eq 2 ] || fail "expected exit 2 on a full tmpfs, got $rc"
  [ -z "$(ls -A "$WORK/tiny")" ] || fail "the full tmpfs still holds $(ls -A "$WORK/tiny")"
  umount "$WORK/tiny"
  echo "tmpfs case: checked"
else
  echo "tmpfs case: skipped (cannot mount here)"
fi

# 3. A stale OUT.tmp from a killed run does not block the rerun.
mkdir -p "$WORK/out.tmp" && echo junk > "$WORK/out.tmp/model.safetensors"
"$FP4SERVE" quantize -m "$SRC" -o "$WORK/out" --scheme nvfp4a16 > "$WORK/log" 2>&1 || { cat "$WORK/log"; fail "rerun failed"; }
cat "$WORK/log"
grep -q "removing .*out.tmp" "$WORK/log" || fail "the stale staging folder was not reported"
[ ! -e "$WORK/out.tmp" ] || fail "the stale staging folder is still there"
[ -s "$WORK/out/model.safetensors" ] && [ -s "$WORK/out/config.json" ] || fail "the rerun did not write the model"
echo "PASS"
