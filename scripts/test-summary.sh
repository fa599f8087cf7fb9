#!/usr/bin/env bash
# One line that says how a test run went, from the JUnit files ctest writes (`ctest --output-junit`):
#   make test: release 975 passed, 0 failed, 68 skipped (67 need a CUDA GPU, none found; 1 other: NAME) | asan ...
# Skips are counted apart: the CUDA tests skip on a machine without a GPU (every CI run; their output says so),
# anything else that skips is named. Usage: scripts/test-summary.sh LABEL=JUNIT.xml [LABEL=JUNIT.xml ...] [--extra TEXT]
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
  # Each skipped test as "gpu NAME" or "other NAME": a GPU skip says so in its output ("no CUDA GPU", "no GPU").
  mapfile -t skipped < <(awk '
    /<testcase / && /status="notrun"/ { match($0, /name="[^"]*"/); name = substr($0, RSTART + 6, RLENGTH - 7); gpu = 0; open = 1 }
    open && /no CUDA GPU|no GPU|CUDA device/ { gpu = 1 }
    open && /<\/testcase>/ { print (gpu ? "gpu " : "other ") name; open = 0 }' "$file")
  gpu=0
  others=()
  for entry in "${skipped[@]}"; do
    if [[ "$entry" == gpu\ * ]]; then
      gpu=$((gpu + 1))
    else
      others+=("${entry#other }")
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
