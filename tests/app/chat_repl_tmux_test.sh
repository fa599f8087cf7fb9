#!/bin/sh
# The chat REPL in a real terminal (tmux): line editing, history, /help and /reset handled locally, Ctrl-C stops
# a reply and keeps the conversation, Ctrl-C at the prompt drops the line, /quit exits 0.
# usage: chat_repl_tmux_test.sh FP4SERVE MODEL_DIR
# Skips (exit 77) when tmux is missing outside CI; CI installs it (scripts/install-deps.sh), so there it fails.
set -u
FP4SERVE=$1
MODEL=$2
if ! command -v tmux >/dev/null 2>&1; then
  if [ -n "${CI:-}" ]; then echo "FAIL: tmux is not installed (scripts/install-deps.sh installs it)"; exit 1; fi
  echo "SKIP: tmux is not installed"
  exit 77
fi
WORK=$(mktemp -d)
SOCK="$WORK/tmux.sock"
T="tmux -S $SOCK"
cleanup() { $T kill-server >/dev/null 2>&1; rm -rf "$WORK"; }
trap cleanup EXIT

# A fixed, plain terminal; an empty ~/.editrc so a developer's bindings cannot change the keys below.
: > "$WORK/editrc"
$T -f /dev/null new-session -d -s repl -x 160 -y 50 \
  "env HOME=$WORK EDITRC=$WORK/editrc TERM=xterm $FP4SERVE chat $MODEL -n 480 --temperature 0 -t 1; echo EXIT=\$?; sleep 600"

screen() { $T capture-pane -p -t repl; }
# wait_for REGEX [SECONDS]: poll the screen until a line matches.
wait_for() {
  i=0
  limit=$(( ${2:-60} * 10 ))
  while [ $i -lt $limit ]; do
    if screen | grep -Eq -- "$1"; then return 0; fi
    sleep 0.1
    i=$((i + 1))
  done
  echo "FAIL: timed out waiting for /$1/; the screen:"
  screen
  exit 1
}
keys() { $T send-keys -t repl "$@"; }

wait_for '/help lists the commands'
wait_for '^> ?$'

# /help is answered locally.
keys -l '/help'; keys Enter
wait_for '^commands: /help'

# Line editing: Left moves the cursor (no ^[[D on the screen); Ctrl-C at the prompt drops the line.
keys -l 'helo'; keys Left; keys -l 'l'
wait_for '^> hello$'
keys C-c
wait_for '^> hello\^C$'
if screen | grep -q '\^\[\['; then echo "FAIL: an arrow key was echoed as an escape sequence"; screen; exit 1; fi

# A reply stopped by Ctrl-C: the session goes on and the conversation keeps both turns. The tiny model may finish
# its 480-token reply before the key arrives (≈ 40 ms on a fast CPU), or the key may beat Enter, so up to 10 tries,
# the key sent 0–45 ms after Enter; a try whose reply finished resets the conversation (a finished reply fills the
# context, and every later message would be refused) and clears the screen.
tries=0
until screen | grep -Eq '^\[interrupted after [0-9]+ tokens'; do
  tries=$((tries + 1))
  [ $tries -le 10 ] || { echo "FAIL: no reply was interrupted in 10 tries"; screen; exit 1; }
  keys -l 'first message'; keys Enter
  [ $tries -gt 1 ] && sleep "0.0$(( (tries - 1) / 2 ))5"
  keys C-c
  wait_for '^> ?$'
  sleep 0.2
  if ! screen | grep -Eq '^\[interrupted after [0-9]+ tokens'; then
    keys -l '/reset'; keys Enter
    wait_for '^\(history cleared'
    keys C-l
    $T clear-history -t repl
    wait_for '^> ?$'
  fi
done
keys -l '/reset'; keys Enter
wait_for '^\(history cleared: [0-9]*[02468] messages dropped\)'

# History: after clearing the screen, Up Up recalls the earlier message.
keys C-l
$T clear-history -t repl
keys Up; keys Up
wait_for '^> first message$'
keys C-u
keys -l '/help'; keys Enter
wait_for '^commands: /help'


# /quit leaves with status 0.
keys -l '/quit'; keys Enter
wait_for '^EXIT=0$'
screen | sed -e '/^$/d' -e 's/^/  | /'
echo "PASS"
