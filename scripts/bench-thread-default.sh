#!/bin/bash
# Thread-default measurement: the README quick-start command, variants interleaved round-robin in one run.
# usage: scripts/bench-thread-default.sh OLD_FP4SERVE NEW_FP4SERVE MODEL [ROUNDS]
# OLD_FP4SERVE: a binary from before the passive-wait default (it takes -m); NEW_FP4SERVE: this one. Prints the
# markdown table of README "Threads"; per-run lines go to stderr.
OLD=$1; NEW=$2; M=$3; R=${4:-3}
ARGS=(-p "The capital of France is" -n 32 --ignore-eos --temperature 0)
declare -A NAME CMD
NAME[a]="before: OpenMP default (spin, then sleep), all CPUs";      CMD[a]="env -u OMP_WAIT_POLICY $OLD generate -m $M"
NAME[b]="now: default (passive wait), all CPUs";                    CMD[b]="env -u OMP_WAIT_POLICY $NEW generate $M"
NAME[c]="--threads 1";                                              CMD[c]="env -u OMP_WAIT_POLICY $NEW generate $M -t 1"
NAME[d]="OMP_WAIT_POLICY=active (spin only), all CPUs";             CMD[d]="env OMP_WAIT_POLICY=active $NEW generate $M"
out=$(mktemp)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), nproc $(nproc)"
for r in $(seq 1 $R); do
  for k in a b c d; do
    t0=$(date +%s.%N)
    line=$(${CMD[$k]} "${ARGS[@]}" 2>&1 >/dev/null | grep '^load ')
    t1=$(date +%s.%N)
    tps=$(echo "$line" | sed -E 's/.*decode [0-9]+ tokens, ([0-9.]+) tokens\/s.*/\1/')
    echo "$k $r $(echo "$t1 - $t0" | bc) $tps" >> $out
    echo "round $r $k: wall $(echo "$t1 - $t0" | bc) s, decode $tps tok/s | ${line##*| }" >&2
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| setting | wall s, median [min–max] | decode tokens/s, median [min–max] |"
echo "|---|---|---|"
for k in a b c d; do
  python3 - "$out" "$k" "${NAME[$k]}" <<'PY'
import sys, statistics
rows=[l.split() for l in open(sys.argv[1]) if l.split()[0]==sys.argv[2]]
w=[float(r[2]) for r in rows]; t=[float(r[3]) for r in rows]
print(f"| {sys.argv[3]} | {statistics.median(w):.2f} [{min(w):.2f}–{max(w):.2f}] | {statistics.median(t):.1f} [{min(t):.1f}–{max(t):.1f}] |")
PY
done
rm -f $out
