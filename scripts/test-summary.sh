#!/usr/bin/env bash
# One line that says how a test run went, from the JUnit files ctest writes (`ctest --output-junit`):
#   make test: release 975 passed, 0 failed, 68 skipped (67 need a CUDA GPU, none found; 1 other: NAME) | asan ...
# Skips are counted apart: the CUDA suites skip on a machine without a GPU (every CI run), anything else that
# skips is named. Usage: scripts/test-summary.sh LABEL=JUNIT.xml [LABEL=JUNIT.xml ...] [--extra TEXT]
# Exit status 1 when a file is missing or records a failure, else 0.
set -euo pipefail

parts=()
status=0
extra=""
while [ $# -gt 0 ]; do
  if [ "$1" = "--extra" ]; then
    extra="$2"
    shift 2
    continue
  fi
  label="${1%%=*}"
  file="${1#*=}"
  shift
  if [ ! -f "$file" ]; then
    parts+=("$label: no results ($file missing)")
    status=1
    continue
  fi
  # One <testcase ... status="run|fail|notrun"> per test; a skip carries <skipped .../> and its output.
  passed=$(grep -c '<testcase .*status="run"' "$file" || true)
  failed=$(grep -c '<testcase .*status="fail"' "$file" || true)
  mapfile -t skipped < <(grep -o '<testcase name="[^"]*"[^>]*status="notrun"' "$file" | sed 's/<testcase name="\([^"]*\)".*/\1/')
  gpu=0
  others=()
  for name in "${skipped[@]}"; do
    if [[ "$name" == Cuda* || "$name" == *[Cc]uda* ]]; then
      gpu=$((gpu + 1))
    else
      others+=("$name")
    fi
  done
  detail=""
  if [ ${#skipped[@]} -gt 0 ]; then
    detail=" ("
    [ "$gpu" -gt 0 ] && detail+="$gpu need a CUDA GPU, none found"
    if [ ${#others[@]} -gt 0 ]; then
      [ "$gpu" -gt 0 ] && detail+="; "
      detail+="${#others[@]} other: $(IFS=,; echo "${others[*]}" | sed 's/,/, /g')"
    fi
    detail+=")"
  fi
  parts+=("$label $passed passed, $failed failed, ${#skipped[@]} skipped$detail")
  [ "$failed" -eq 0 ] || status=1
done
[ -n "$extra" ] && parts+=("$extra")
line="$(printf '%s | ' "${parts[@]}")"
echo "make test: ${line% | }"
exit "$status"
