#!/usr/bin/env bash
# fp4serve against llama.cpp at real model sizes, on random weights of a published shape (the compute-roof and
# memory questions that the 135M default model cannot answer).
#
#   scripts/bench-scale.sh [--shape llama-3.2-3b] [--layers N] [bench/peer/llamacpp.sh options…]
#
# 1. tools/make_random_model.py writes the shape's bf16 checkpoint into build/scale/<shape>/src (once);
# 2. fp4serve quantizes it to NVFP4A16 (build/scale/<shape>/nvfp4) and MXFP4A16 (…/mxfp4a16) (once);
# 3. bench/peer/llamacpp.sh runs both tools on them exactly as `make bench-peer` does on the default model
#    (llama.cpp from the pinned llama-cpp-python sdist, its Q4_0 / Q4_K_M / NVFP4 / MXFP4 GGUFs of the same
#    weights, interleaved fresh processes, medians and ratios), with GGUFs named after the shape.
# gpt-oss-20b is written as its checkpoint is published, experts in native MXFP4: step 2 is skipped, and step 3
# compares the checkpoint as each tool runs it (llamacpp.sh's PEER_NATIVE: llama.cpp's converter keeps the
# MXFP4 experts, fp4serve loads the folder). Disk: the bf16 source of llama-3.2-3b is 6.4 GB (+ 2 × 2.4 GB
# quantized + the GGUFs), llama-3.1-8b 16 GB; gpt-oss-20b 13.8 GB + a 13.8 GB GGUF. qwen3-30b-a3b is for
# `fp4serve bench model` and memory runs (its bf16 source is 61 GB). Not part of `make test`.
# SCALE_DIR overrides build/scale; other options are passed to llamacpp.sh (--threads, --reps, --prompt, --gen).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHAPE=llama-3.2-3b
LAYERS=""
PASS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --shape) SHAPE="$2"; shift 2 ;;
        --layers) LAYERS="$2"; shift 2 ;;
        -h|--help) sed -n 2,17p "$0"; exit 0 ;;
        *) PASS+=("$1"); shift ;;
    esac
done
case "$SHAPE" in
    llama-3.2-3b|llama-3.1-8b|smollm2-135m|gpt-oss-20b) ;;
    qwen3-30b-a3b)
        echo "bench-scale: $SHAPE has no llama.cpp comparison here (its bf16 source and F16 GGUF are 61 GB each);" \
             "run tools/make_random_model.py --shape $SHAPE and fp4serve bench model on it" >&2
        exit 2 ;;
    *) echo "bench-scale: unknown --shape $SHAPE (llama-3.2-3b, llama-3.1-8b, smollm2-135m, gpt-oss-20b)" >&2; exit 2 ;;
esac
FP4SERVE="$ROOT/build/release/fp4serve"
[ -x "$FP4SERVE" ] || { echo "bench-scale: build fp4serve first (make build-cli)" >&2; exit 1; }
NAME="$SHAPE${LAYERS:+-l$LAYERS}"
DIR="${SCALE_DIR:-$ROOT/build/scale}/$NAME"
mkdir -p "$DIR"
if [ ! -f "$DIR/src/config.json" ]; then
    rm -rf "$DIR/src.tmp"
    python3 "$ROOT/tools/make_random_model.py" --shape "$SHAPE" ${LAYERS:+--layers "$LAYERS"} --out "$DIR/src.tmp" \
        --tokenizer "$ROOT/tests/data/tokenizers/smollm2-real/tokenizer.json.xz"
    mv "$DIR/src.tmp" "$DIR/src"
fi
if [ "$SHAPE" = gpt-oss-20b ]; then
    PEER_NATIVE="$DIR/src" PEER_TAG="$NAME" exec "$ROOT/bench/peer/llamacpp.sh" "${PASS[@]}"
fi
for scheme in nvfp4a16 mxfp4a16; do
    out="$DIR/${scheme%a16}"
    [ "$scheme" = mxfp4a16 ] && out="$DIR/mxfp4a16"
    if [ ! -f "$out/config.json" ]; then
        "$FP4SERVE" quantize -m "$DIR/src" -o "$out" --scheme "$scheme"
    fi
done
PEER_SRC="$DIR/src" PEER_NVFP4="$DIR/nvfp4" PEER_MXFP4="$DIR/mxfp4a16" PEER_TAG="$NAME" \
    exec "$ROOT/bench/peer/llamacpp.sh" "${PASS[@]}"
