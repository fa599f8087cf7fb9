#!/usr/bin/env bash
# Side-by-side CPU benchmark: fp4serve vs llama.cpp on the same source weights (models/default-src).
#
#   bench/peer/llamacpp.sh [--threads "1 2"] [--reps 5] [--prompt 128] [--gen 64] [--prepare-only]
#
# (--prepare-only: build, convert and quantize, no measurement. PEER_DIR, PEER_VENV and PEER_JOBS override the
# work folder, the Python venv and the build parallelism; PEER_OMP_WAIT_POLICY=passive|active sets OpenMP's wait
# policy for both tools, which otherwise wait as they do by default. PEER_SRC, PEER_NVFP4, PEER_MXFP4 and PEER_TAG
# replace the default model's three folders and the GGUF names' prefix: scripts/bench-scale.sh runs it so on
# full-size random models. PEER_NATIVE, a checkpoint published in native MXFP4 such as gpt-oss's, replaces all three:
# see "Native MXFP4" below.)
#
# 1. llama.cpp is built from the llama-cpp-python 0.3.36 sdist on PyPI (it vendors llama.cpp), CPU only,
#    with the x86 extensions /proc/cpuinfo lists except AMX (some VMs list AMX and fault on its instructions).
# 2. models/default-src is converted with that llama.cpp's convert_hf_to_gguf.py to F16, then llama-quantize
#    makes Q4_0, Q4_K_M, and NVFP4 / MXFP4: this llama.cpp has no NVFP4 or dense-MXFP4 file type (its MXFP4_MOE
#    turns a dense model's linears into Q8_0), so those two are `--tensor-type 'blk\.=nvfp4'` (resp. mxfp4) on a
#    Q8_0 base with `--token-embedding-type f16 --output-tensor-type f16`: every linear of the blocks in that type,
#    the tied embedding / output F16 (the bytes fp4serve's checkpoints keep in bf16). (An F16 base type would
#    copy every tensor unchanged, overrides included.)
# 3. fp4serve runs models/default-nvfp4 and an MXFP4A16 quantization of default-src with its default
#    activations (auto: bf16 on a CPU with AVX512-BF16, else fp32) and int8, and the NVFP4 model also with fp32.
#    Every (model, T) sample is a fresh process, interleaved
#    A B A B … over --reps rounds, one llama-bench -p P -n N -d 0,P -r 1 per llama.cpp sample and one
#    `fp4serve bench model -r 1` per fp4serve sample.
#    Decode is measured after the prompt in both (llama-bench -d P; its depth-0 decode is printed for reference).
# Native MXFP4 (PEER_NATIVE=DIR, a GptOssForCausalLM checkpoint with quantization_config mxfp4): no requantizing on
#    either side, both tools run the file as it is published. llama.cpp's converter keeps the experts' MXFP4 blocks
#    (GGUF type MXFP4, repacked, not requantized) and writes the other matrices as bf16, the bytes the checkpoint
#    keeps (1-D tensors as F32); fp4serve loads DIR itself with `auto` and `int8` activations. The baseline of the
#    ratios is that GGUF (`llama:native`) instead of Q4_0. fp4serve runs with --weight-cache off (the cache of a 20B
#    checkpoint is another 12.8 GiB on disk; only loading differs). PEER_TAG defaults to the folder's name.
# 4. It prints medians per model and thread count, the ratios fp4serve / llama.cpp Q4_0 and / each other
#    llama.cpp type, and the bytes of each model's weights, every tensor once: what a decode token reads when the
#    model is tied (its embedding is the output matrix), as the default model is; an untied model's embedding and a
#    MoE's idle experts are counted too.
# Not part of `make test`: it downloads (PyPI: the sdist, torch + transformers for the converter) and builds.
# Everything lands in build/peer/ (PEER_DIR); a second run reuses the build and the GGUFs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PEER="${PEER_DIR:-$ROOT/build/peer}"
FP4SERVE="$ROOT/build/release/fp4serve"
SRC="${PEER_SRC:-$ROOT/models/default-src}"
NVFP4="${PEER_NVFP4:-$ROOT/models/default-nvfp4}"
MXFP4="${PEER_MXFP4:-$ROOT/models/default-mxfp4a16}"
NATIVE="${PEER_NATIVE:-}"
if [ -n "$NATIVE" ]; then
    SRC="$NATIVE"
    TAG="${PEER_TAG:-$(basename "$NATIVE")}"  # results and GGUF named after the checkpoint
else
    TAG="${PEER_TAG:-default}"
fi
VERSION=0.3.36
THREADS="1 2"
REPS=5
PROMPT=128
GEN=64
PREPARE_ONLY=0
while [ $# -gt 0 ]; do
    case "$1" in
        --threads) THREADS="$2"; shift 2 ;;
        --reps) REPS="$2"; shift 2 ;;
        --prompt) PROMPT="$2"; shift 2 ;;
        --gen) GEN="$2"; shift 2 ;;
        --prepare-only) PREPARE_ONLY=1; shift ;;
        -h|--help) sed -n 2,37p "$0"; exit 0 ;;
        *) echo "llamacpp.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
log() { echo "peer: $*" >&2; }
die() { echo "peer: error: $*" >&2; exit 1; }

if [ -z "$NATIVE" ]; then
    [ -f "$SRC/config.json" ] || die "$SRC has no config.json: run scripts/get-default-model.sh first"
elif [ ! -f "$NATIVE/config.json" ] ||
    [ "$(jq -r '.quantization_config.quant_method // empty' "$NATIVE/config.json")" != mxfp4 ]; then
    die "PEER_NATIVE=$NATIVE: expected a checkpoint whose config.json has quantization_config.quant_method \"mxfp4\""
fi
mkdir -p "$PEER/gguf" "$PEER/results"

# ---- the Python side: a venv for pip download (scikit-build-core reads the sdist's metadata) and the converter
VENV="${PEER_VENV:-$PEER/venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
if [ ! -f "$VENV/.ready" ]; then
    log "installing the converter's Python packages (torch, transformers, …) into $VENV"
    "$VENV/bin/pip" install -q scikit-build-core torch 'numpy<2.3' 'sentencepiece<0.3' 'transformers==4.57.6' \
        'protobuf<5' safetensors
    touch "$VENV/.ready"
fi

# ---- llama.cpp from the llama-cpp-python sdist
SDIST="$PEER/llama_cpp_python-$VERSION.tar.gz"
LLAMA="$PEER/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$SDIST" ]; then
    # --no-build-isolation: the sdist's build backend comes from the venv instead of being built from source.
    "$VENV/bin/pip" download --no-binary :all: --no-deps --no-build-isolation "llama-cpp-python==$VERSION" -d "$PEER"
fi
[ -d "$LLAMA" ] || tar xzf "$SDIST" -C "$PEER"
if [ ! -f "$VENV/.gguf-py" ]; then
    "$VENV/bin/pip" install -q "$LLAMA/gguf-py"
    touch "$VENV/.gguf-py"
fi
flags="$(grep -m1 '^flags' /proc/cpuinfo)"
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
LBUILD="$PEER/llama-build"
if [ ! -x "$LBUILD/bin/llama-bench" ] || [ ! -x "$LBUILD/bin/llama-quantize" ]; then
    log "building llama.cpp (llama-bench, llama-quantize)"
    cmake -S "$LLAMA" -B "$LBUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF \
        -DGGML_AVX=ON -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" \
        -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AVX512="$(has avx512f)" \
        -DGGML_AVX512_VBMI="$(has avx512vbmi)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
        -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
        > "$PEER/llama-cmake.log"
    nice cmake --build "$LBUILD" -j "${PEER_JOBS:-2}" --target llama-bench llama-quantize > "$PEER/llama-build.log"
fi

# ---- GGUFs
native_gguf() {  # the native checkpoint as llama.cpp's converter writes it (no llama-quantize)
    local out="$PEER/gguf/$TAG-native.gguf"
    if [ ! -f "$out" ]; then
        log "converting $NATIVE to GGUF (MXFP4 experts as they are, the rest bf16)"
        "$VENV/bin/python" "$LLAMA/convert_hf_to_gguf.py" "$NATIVE" --outtype bf16 --outfile "$out.tmp" \
            > "$PEER/convert-$TAG.log" 2>&1 || die "conversion failed: see $PEER/convert-$TAG.log"
        mv "$out.tmp" "$out"
    fi
}
dense_ggufs() {  # Q4_0, Q4_K_M, NVFP4 and MXFP4 quantized by llama-quantize from an F16 conversion
    # The F16 GGUF is only the quantizer's input: made when a quantized GGUF is missing, removed once they all
    # exist (2 bytes a weight: 6.4 GB at the Llama-3.2-3B shape, which once filled this VM's disk between two runs).
    local f16="$PEER/gguf/$TAG-f16.gguf" need_f16=0 type
    for type in q4_0 q4_k_m nvfp4 mxfp4; do [ -f "$PEER/gguf/$TAG-$type.gguf" ] || need_f16=1; done
    if [ "$need_f16" = 1 ] && [ ! -f "$f16" ]; then
        log "converting $SRC to F16 GGUF"
        "$VENV/bin/python" "$LLAMA/convert_hf_to_gguf.py" "$SRC" --outtype f16 --outfile "$f16.tmp" > "$PEER/convert.log" 2>&1
        mv "$f16.tmp" "$f16"
    fi
    quantize() {  # name, llama-quantize's type, then its arguments before the input/output pair
        local out="$PEER/gguf/$TAG-$1.gguf" qtype="$2"
        shift 2
        if [ ! -f "$out" ]; then
            "$LBUILD/bin/llama-quantize" "$@" "$f16" "$out.tmp" "$qtype" > "$PEER/quantize-$(basename "$out").log" 2>&1
            mv "$out.tmp" "$out"
        fi
    }
    quantize q4_0 Q4_0
    quantize q4_k_m Q4_K_M
    # An F16 base type makes llama-quantize copy every tensor, overrides included: base Q8_0, embedding/output F16.
    quantize nvfp4 Q8_0 --tensor-type 'blk\.=nvfp4' --token-embedding-type f16 --output-tensor-type f16
    quantize mxfp4 Q8_0 --tensor-type 'blk\.=mxfp4' --token-embedding-type f16 --output-tensor-type f16
    rm -f "$f16"
}
if [ -n "$NATIVE" ]; then native_gguf; else dense_ggufs; fi
[ -x "$FP4SERVE" ] || die "$FP4SERVE is missing: build it first (cmake --build --preset release --target fp4serve)"
if [ -z "$NATIVE" ]; then
    [ -f "$NVFP4/config.json" ] || die "$NVFP4 is missing: run scripts/get-default-model.sh"
    if [ ! -f "$MXFP4/config.json" ]; then
        log "quantizing $SRC to MXFP4A16 with fp4serve"
        "$FP4SERVE" quantize -m "$SRC" -o "$MXFP4" --scheme mxfp4a16
    fi
fi

if [ "$PREPARE_ONLY" = 1 ]; then
    log "prepared: $(ls "$PEER/gguf")"
    exit 0
fi

# ---- bytes of weights read per token: every tensor once (tied models read the embedding as lm_head)
gguf_bytes() {
    "$VENV/bin/python" - "$1" <<'EOF'
import sys
from gguf import GGUFReader
print(sum(int(t.n_bytes) for t in GGUFReader(sys.argv[1]).tensors))
EOF
}
st_bytes() {  # safetensors: file sizes minus headers
    local total=0 f
    for f in "$1"/*.safetensors; do
        local size header
        size=$(stat -c %s "$f")
        header=$(od -An -t u8 -N 8 "$f" | tr -d ' ')
        total=$((total + size - 8 - header))
    done
    echo "$total"
}

# ---- samples, interleaved: (model × threads) in rotating order, one process each
# LLAMA: llama.cpp's models, the first the baseline of the ratios; FP4: fp4serve's (folder:activations).
if [ -n "$NATIVE" ]; then
    LLAMA=(llama:native)
    FP4=(fp4serve:native:auto fp4serve:native:int8)
    FP4SERVE_LOAD=(--weight-cache off)
else
    LLAMA=(llama:q4_0 llama:q4_k_m llama:nvfp4 llama:mxfp4)
    FP4=(fp4serve:nvfp4:auto fp4serve:nvfp4:fp32 fp4serve:nvfp4:int8 fp4serve:mxfp4a16:auto fp4serve:mxfp4a16:int8)
    FP4SERVE_LOAD=()
fi
BASE="${LLAMA[0]}"
MODELS=("${LLAMA[@]}" "${FP4[@]}")
# Each tool waits as it does by default (fp4serve: a short spin on an idle machine; ggml: its own spinning
# barriers) unless PEER_OMP_WAIT_POLICY sets OMP_WAIT_POLICY for both.
if [ -n "${PEER_OMP_WAIT_POLICY:-}" ]; then
    WAIT_ENV=(-u GOMP_SPINCOUNT "OMP_WAIT_POLICY=$PEER_OMP_WAIT_POLICY")
    WAIT_NOTE="OMP_WAIT_POLICY=$PEER_OMP_WAIT_POLICY"
else
    WAIT_ENV=(-u GOMP_SPINCOUNT -u OMP_WAIT_POLICY)
    WAIT_NOTE="each tool's default wait policy"
fi
fp4serve_dir() {
    case "$1" in
        nvfp4) echo "$NVFP4" ;;
        mxfp4a16) echo "$MXFP4" ;;
        native) echo "$NATIVE" ;;
    esac
}
RES="$PEER/results/$TAG-samples.tsv"
: > "$RES"
run_sample() {  # model spec, threads → "prefill_tps decode_tps [decode_tps_from_empty]"
    local spec="$1" t="$2"
    IFS=: read -r kind name precision <<< "$spec"
    if [ "$kind" = llama ]; then
        # fp4serve decodes after its prompt (positions P … P+N−1); llama-bench's tg test starts from an empty
        # context unless -d gives it a depth. Both depths run: prefill at 0, decode at P (the same work as
        # fp4serve's), and decode at 0 kept for reference.
        env "${WAIT_ENV[@]}" "$LBUILD/bin/llama-bench" -m "$PEER/gguf/$TAG-$name.gguf" -p "$PROMPT" -n "$GEN" \
            -d "0,$PROMPT" -t "$t" -r 1 -o json 2> /dev/null |
            jq -r --argjson p "$PROMPT" '[(.[] | select(.n_gen == 0 and .n_depth == 0) | .avg_ts),
                (.[] | select(.n_prompt == 0 and .n_depth == $p) | .avg_ts),
                (.[] | select(.n_prompt == 0 and .n_depth == 0) | .avg_ts)] | @tsv'
    else
        env "${WAIT_ENV[@]}" "$FP4SERVE" bench model -m "$(fp4serve_dir "$name")" -p "$PROMPT" -n "$GEN" -r 1 \
            --threads "$t" --activation-precision "$precision" "${FP4SERVE_LOAD[@]}" --json 2> /dev/null |
            jq -r '.models[0] | [.prefill_tokens_per_s, .decode_tokens_per_s] | @tsv'
    fi
}
n=${#MODELS[@]}
for rep in $(seq 1 "$REPS"); do
    for t in $THREADS; do
        for i in $(seq 0 $((n - 1))); do
            spec="${MODELS[$(((i + rep) % n))]}"
            read -r pp tg tg0 <<< "$(run_sample "$spec" "$t")"
            printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$spec" "$t" "$rep" "$pp" "$tg" "${tg0:--}" >> "$RES"
            log "rep $rep T=$t $spec: prefill $pp tok/s, decode $tg tok/s"
        done
    done
done

# ---- table
declare -A BYTES
for spec in "${MODELS[@]}"; do
    IFS=: read -r kind name _ <<< "$spec"
    if [ "$kind" = llama ]; then
        BYTES[$spec]=$(gguf_bytes "$PEER/gguf/$TAG-$name.gguf")
    else
        BYTES[$spec]=$(st_bytes "$(fp4serve_dir "$name")")
    fi
done
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
{
    echo "llama.cpp $VERSION (llama-cpp-python sdist) vs fp4serve, p$PROMPT/n$GEN, $REPS interleaved rounds, medians; $WAIT_NOTE"
    echo "decode: $GEN tokens after the $PROMPT-token prompt for both tools (llama-bench -d $PROMPT)"
    base_name="${BASE#llama:}"
    if [ -n "$NATIVE" ]; then
        echo "a MoE token reads its experts' share of the weights: MB is the whole checkpoint, decode·MB compares files"
        bytes_head="weights MB"
    else
        bytes_head="MB/token"
    fi
    printf '| model | T | %s | prefill tok/s | decode tok/s | decode vs %s | prefill vs %s | decode·MB vs %s |\n' \
        "$bytes_head" "$base_name" "$base_name" "$base_name"
    printf '|---|---|---|---|---|---|---|---|\n'
    for t in $THREADS; do
        q_pp=$(awk -F'\t' -v s="$BASE" -v t="$t" '$1 == s && $2 == t {print $4}' "$RES" | median)
        q_tg=$(awk -F'\t' -v s="$BASE" -v t="$t" '$1 == s && $2 == t {print $5}' "$RES" | median)
        for spec in "${MODELS[@]}"; do
            pp=$(awk -F'\t' -v s="$spec" -v t="$t" '$1 == s && $2 == t {print $4}' "$RES" | median)
            tg=$(awk -F'\t' -v s="$spec" -v t="$t" '$1 == s && $2 == t {print $5}' "$RES" | median)
            awk -v s="$spec" -v t="$t" -v b="${BYTES[$spec]}" -v bq="${BYTES[$BASE]}" -v pp="$pp" -v tg="$tg" \
                -v qpp="$q_pp" -v qtg="$q_tg" 'BEGIN {
                printf "| %s | %s | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f |\n", s, t, b / 1e6, pp, tg, tg / qtg, pp / qpp,
                       (tg * b) / (qtg * bq) }'
        done
    done
    echo
    echo "fp4serve / llama.cpp per type (decode, prefill):"
    for t in $THREADS; do
        for f in "${FP4[@]}"; do
            line="T=$t $f:"
            for l in "${LLAMA[@]}"; do
                r=$(awk -F'\t' -v f="$f" -v l="$l" -v t="$t" '$2 == t && ($1 == f || $1 == l) {print $1, $3, $4, $5}' "$RES" |
                    awk -v f="$f" '{ if ($1 == f) { fp[$2] = $3; ft[$2] = $4 } else { lp[$2] = $3; lt[$2] = $4 } }
                        END { for (r in fp) if (r in lp) { print ft[r] / lt[r], fp[r] / lp[r] } }' |
                    median | awk '{printf "%.2f", $1}')
                rp=$(awk -F'\t' -v f="$f" -v l="$l" -v t="$t" '$2 == t && ($1 == f || $1 == l) {print $1, $3, $4}' "$RES" |
                    awk -v f="$f" '{ if ($1 == f) fp[$2] = $3; else lp[$2] = $3 }
                        END { for (r in fp) if (r in lp) print fp[r] / lp[r] }' |
                    median | awk '{printf "%.2f", $1}')
                line="$line ${l#llama:} ${r}/${rp}"
            done
            echo "  $line"
        done
    done
    echo "(ratios: median over rounds of the per-round ratio; decode/prefill)"
    echo
    echo "llama.cpp decode from an empty context (llama-bench tg at depth 0), medians, for reference:"
    for t in $THREADS; do
        line="  T=$t:"
        for l in "${LLAMA[@]}"; do
            line="$line ${l#llama:} $(awk -F'\t' -v s="$l" -v t="$t" '$1 == s && $2 == t {print $6}' "$RES" | median |
                awk '{printf "%.1f", $1}')"
        done
        echo "$line"
    done
} | tee "$PEER/results/$TAG-table.md"
