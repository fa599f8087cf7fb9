#!/usr/bin/env bash
# Create (or update) the reference-tool venv at tools/reference/.venv. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
stamp="$venv/.requirements.sha256"
want="$(cat "$here/requirements.txt" "$here/requirements-lock.txt" | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "venv up to date: $venv"
  exit 0
fi
"$venv/bin/python" -m pip install --upgrade pip wheel
"$venv/bin/python" -m pip install -r "$here/requirements.txt" -c "$here/requirements-lock.txt"
echo "$want" > "$stamp"
echo "venv ready: $venv"
