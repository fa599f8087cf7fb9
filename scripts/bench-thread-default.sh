#!/bin/bash
# Thread-default measurement: a 64-token generate of the default model, the wait settings interleaved
# round-robin in one run, optionally beside HOGS busy-loop processes (the "busy machine" case).
# usage: [HOGS=N] scripts/bench-thread-default.sh FP4SERVE MODEL [ROUNDS]
# Prints the markdown table of docs/performance.md "Threads"; per-run lines (with the summary line's choice) go to stderr.
set -u
NEW=$1; M=$2; R=${3:-3}; HOGS=${HOGS:-0}
ARGS=(-p "The capital of France is" -n 64 --ignore-eos --temperature 0)
declare -A NAME CMD
NAME[a]="default (short spin when idle, else passive), all CPUs"; CMD[a]="env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT $NEW generate $M"
NAME[b]="OMP_WAIT_POLICY=passive, all CPUs";                       CMD[b]="env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive $NEW generate $M"
NAME[c]="GOMP_SPINCOUNT=10000, all CPUs";                          CMD[c]="env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=10000 $NEW generate $M"
NAME[d]="GOMP_SPINCOUNT=300000 (OpenMP's default), all CPUs";      CMD[d]="env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=300000 $NEW generate $M"
NAME[e]="--threads 1";                                             CMD[e]="env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive $NEW generate $M -t 1"
hogs=()
for _ in $(seq 1 "$HOGS"); do sh -c 'while :; do :; done' & hogs+=($!); done
trap '[ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}" 2>/dev/null' EXIT
out=$(mktemp)
sleep 1
echo "load before: $(cut -d' ' -f1-4 /proc/loadavg), nproc $(nproc), $HOGS busy loops beside it"
for r in $(seq 1 "$R"); do
  for k in a b c d e; do
    t0=$(date +%s.%N)
    line=$(timeout 300 ${CMD[$k]} "${ARGS[@]}" 2>&1 >/dev/null | grep '^load ')
    t1=$(date +%s.%N)
    tps=$(echo "$line" | sed -E 's/.*decode [0-9]+ tokens, ([0-9.]+) tokens\/s.*/\1/')
    [ -n "$tps" ] || tps=0
    echo "$k $r $(echo "$t1 - $t0" | bc) $tps" >> "$out"
    echo "round $r $k: wall $(echo "$t1 - $t0" | bc) s, decode $tps tok/s | ${line##*| }" >&2
  done
done
echo "load after: $(cut -d' ' -f1-4 /proc/loadavg)"
echo "| setting | wall s, median [min–max] | decode tokens/s, median [min–max] |"
echo "|---|---|---|"
for k in a b c d e; do
  python3 - "$out" "$k" "${NAME[$k]}" <<'PY'
import sys, statistics
rows=[l.split() for l in open(sys.argv[1]) if l.split()[0]==sys.argv[2]]
w=[float(r[2]) for r in rows]; t=[float(r[3]) for r in rows]
print(f"| {sys.argv[3]} | {statistics.median(w):.2f} [{min(w):.2f}–{max(w):.2f}] | {statistics.median(t):.1f} [{min(t):.1f}–{max(t):.1f}] |")
PY
done
rm -f "$out"
