#!/usr/bin/env bash
# Structured outputs, forced tool calls and n > 1 on the default model through the official `openai` client
# (tools/openai-check/check_structured.py: 20 JSON schemas validated with jsonschema, regex, choice, grammar,
# tool_choice required / named, n = 3). Starts `fp4serve serve` on a free port, runs the checks, stops it.
# Not part of `make test` (it installs the client from PyPI and needs models/default-nvfp4): `make check-structured`.
#
#   scripts/check-structured-outputs.sh [FP4SERVE] [MODEL_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FP4SERVE="${1:-$ROOT/build/release/fp4serve}"
MODEL="${2:-$ROOT/models/default-nvfp4}"
TOOL="$ROOT/tools/openai-check"
VENV="$TOOL/.venv"
die() { echo "check-structured-outputs: error: $*" >&2; exit 1; }
[ -x "$FP4SERVE" ] || die "$FP4SERVE is missing: build it first"
[ -f "$MODEL/config.json" ] || die "$MODEL is missing: run scripts/get-default-model.sh"
if [ ! -f "$VENV/.ready" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -r "$TOOL/requirements.txt"
    touch "$VENV/.ready"
fi
LOG="$(mktemp)"
# Compact JSON: SmolLM2 writes newlines until max_tokens when whitespace is free (docs/serving.md).
"$FP4SERVE" serve -m "$MODEL" --port 0 --served-model-name default --structured-outputs-config.disable_any_whitespace \
    > "$LOG" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -f "$LOG"' EXIT
PORT=""
for _ in $(seq 1 600); do
    PORT="$(sed -n 's|^serving .* on http://127.0.0.1:\([0-9]*\)$|\1|p' "$LOG")"
    [ -n "$PORT" ] && break
    kill -0 "$SERVER" 2>/dev/null || { cat "$LOG" >&2; die "the server exited"; }
    sleep 0.2
done
[ -n "$PORT" ] || { cat "$LOG" >&2; die "the server did not start within 120 s"; }
grep -E "structured outputs|tool calls" "$LOG" || true
timeout 1800 "$VENV/bin/python" "$TOOL/check_structured.py" "http://127.0.0.1:$PORT" default
