#!/usr/bin/env bash
# Fails when a file under src/ includes a header of a module it must not depend on (docs/ARCHITECTURE.md):
# data flows core → checkpoint → quant → plan → model → backends → runtime → server → app; dist and text sit beside
# the flow (core only); each device's wing (backends/cpu, backends/cuda) sees the model and its own kernels and
# weight layout (backends/cpu/prepare), never the other wing. The build enforces the same through per-module
# include roots (cmake/Warnings.cmake, fp4serve_add_module); this check names every offending line at once.
# Usage: scripts/check-layering.sh [SRC_DIR]   (ctest: layering.no_upward_include)
set -euo pipefail

SRC="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/src}"

# Module (a folder under src/, most specific first) → the modules its files may include.
ABOVE_MODEL="core dist checkpoint quant plan"
declare -A ALLOWED=(
  [core]="core"
  [dist]="core dist"
  [text]="core text"
  [checkpoint]="core checkpoint"
  [quant]="core checkpoint quant"
  [plan]="core checkpoint quant plan"
  [backends/cpu/prepare]="core checkpoint quant backends/cpu/prepare"
  [model]="$ABOVE_MODEL model"
  [backends/cpu/kernels]="core quant backends/cpu/prepare backends/cpu/kernels"
  [backends/cuda/kernels]="core quant backends/cuda/kernels"
  [backends/cpu]="$ABOVE_MODEL model backends/cpu"
  [backends/cuda]="$ABOVE_MODEL model backends/cuda"
  [backends]="$ABOVE_MODEL model backends"
  [runtime]="$ABOVE_MODEL model backends text runtime"
  [server]="$ABOVE_MODEL model backends text runtime server"
  [app]="$ABOVE_MODEL model backends text runtime server app"
)
# Most specific first, so that backends/cpu/kernels is matched before backends/cpu and backends.
ORDER=(backends/cpu/prepare backends/cpu/kernels backends/cuda/kernels backends/cpu backends/cuda backends core dist
       text checkpoint quant plan model runtime server app)
MODULES="core dist text checkpoint quant plan model backends runtime server app"

module_of() {  # src-relative path → its module
  local rel="$1" m
  for m in "${ORDER[@]}"; do
    if [[ "$rel" == "$m/"* ]]; then echo "$m"; return; fi
  done
  echo ""
}

allowed() {  # module, included path → 0 when allowed
  local module="$1" inc="$2" a
  for a in ${ALLOWED[$module]}; do
    if [[ "$inc" == "$a/"* ]]; then echo ok; return; fi
  done
  echo no
}

bad=0
while IFS= read -r -d '' file; do
  rel="${file#"$SRC"/}"
  module="$(module_of "$rel")"
  [[ -z "$module" ]] && continue
  while IFS= read -r line; do
    inc="${line#*\"}"; inc="${inc%%\"*}"
    top="${inc%%/*}"
    [[ " $MODULES " == *" $top "* ]] || continue  # a library (hwy/, fmt/) or the public include/ tree
    if [[ "$(allowed "$module" "$inc")" != ok ]]; then
      echo "layering: $rel (module $module) includes \"$inc\"; $module may include: ${ALLOWED[$module]}"
      bad=$((bad + 1))
    fi
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$file" || true)
done < <(find "$SRC" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) -print0)

if [[ $bad -gt 0 ]]; then
  echo "layering: $bad include(s) against the module order (docs/ARCHITECTURE.md)"
  exit 1
fi
echo "layering: every include under $SRC follows the module order"
