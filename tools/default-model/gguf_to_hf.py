#!/usr/bin/env python3
"""Convert a llama-architecture GGUF (as produced by llama.cpp's converter) back
into a Hugging Face style checkpoint folder:

    model.safetensors       BF16 weights with HF LlamaForCausalLM tensor names
    config.json             LlamaForCausalLM config rebuilt from the GGUF metadata
    generation_config.json
    tokenizer.json          byte-level BPE rebuilt from the GGUF vocab / merges
    tokenizer_config.json   special tokens + chat template from the GGUF
    special_tokens_map.json

Quantized GGUF tensors (Q4_1, Q8_0, ...) are dequantized to float32 with the
`gguf` package and then rounded to BF16, so the result is only as good as the
GGUF: a dequantized checkpoint is NOT the original 16-bit training output.

llama.cpp's converter permutes the rows of q_proj / k_proj so that each RoPE
pair (i, i + head_dim/2) of the HF "rotate_half" layout becomes adjacent
(2i, 2i + 1), which is what ggml's normal-mode RoPE expects.  We apply the
inverse permutation so the output tensors use the HF layout again.

After writing, the tokenizer is verified against the GGUF (vocab, token types,
special token ids, an encode -> decode round trip of a multilingual text) and
the script exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors import TensorSpec, serialize_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3

# GGUF tensor name -> HF name.  "{n}" is the block index.
BLOCK_NAME_MAP = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAME_MAP = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


class ConversionError(Exception):
    pass


# --------------------------------------------------------------------------- #
# GGUF metadata helpers
# --------------------------------------------------------------------------- #
def field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise ConversionError(f"GGUF metadata key {key!r} is missing")
        return default
    return f.contents()


def f32_to_py(x: float) -> float:
    """Shortest decimal that round-trips the float32 value (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


# --------------------------------------------------------------------------- #
# Weights
# --------------------------------------------------------------------------- #
def hf_name(gguf_name: str) -> str:
    base, suffix = gguf_name.rsplit(".", 1)  # suffix: weight / bias
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m:
        part = BLOCK_NAME_MAP.get(m.group(2))
        if part is None:
            raise ConversionError(f"unknown block tensor {gguf_name}")
        return f"model.layers.{int(m.group(1))}.{part}.{suffix}"
    if base in TOP_NAME_MAP:
        return f"{TOP_NAME_MAP[base]}.{suffix}"
    raise ConversionError(f"unknown tensor {gguf_name}")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation.

    llama.cpp writes W_gguf = W_hf.reshape(h, 2, d/2, in).swapaxes(1, 2).reshape(...),
    i.e. within every head row 2i+j of the GGUF tensor is row j*d/2+i of HF.
    """
    rows, cols = w.shape
    head_dim = rows // n_heads
    if n_heads * head_dim != rows or head_dim % 2:
        raise ConversionError(f"cannot un-permute {w.shape} with {n_heads} heads")
    return w.reshape(n_heads, head_dim // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def tensor_to_f32(t) -> np.ndarray:
    """Tensor data as float32 in numpy (row-major, HF) shape."""
    shape = tuple(int(x) for x in reversed(t.shape))  # GGUF ne[] is fastest-first
    data = gguf.quants.dequantize(t.data, t.tensor_type)
    return np.ascontiguousarray(data, dtype=np.float32).reshape(shape)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16, returned as uint16 bit patterns."""
    if not np.all(np.isfinite(x)):
        raise ConversionError("non-finite weight value")
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def convert_weights(reader: gguf.GGUFReader, n_head: int, n_head_kv: int, out_path: Path):
    tensors = {}
    buffers = []  # TensorSpec holds raw pointers: keep the arrays alive until written
    dtypes: dict[str, int] = {}
    worst_rel = 0.0
    for t in reader.tensors:
        name = hf_name(t.name)
        w = tensor_to_f32(t)
        if name.endswith("self_attn.q_proj.weight"):
            w = unpermute_rope_rows(w, n_head)
        elif name.endswith("self_attn.k_proj.weight"):
            w = unpermute_rope_rows(w, n_head_kv)
        bits = f32_to_bf16_bits(w)
        back = bf16_bits_to_f32(bits)
        scale = float(np.max(np.abs(w))) or 1.0
        worst_rel = max(worst_rel, float(np.max(np.abs(back - w))) / scale)
        buffers.append(bits)
        tensors[name] = TensorSpec(dtype="bfloat16", shape=list(w.shape), data_ptr=bits.ctypes.data, data_len=bits.nbytes)
        dtypes[t.tensor_type.name] = dtypes.get(t.tensor_type.name, 0) + 1
    serialize_file(tensors, str(out_path), metadata={"format": "pt"})
    return sorted(tensors), dtypes, worst_rel


# --------------------------------------------------------------------------- #
# Tokenizer
# --------------------------------------------------------------------------- #
def pre_tokenizer_for(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        # llama.cpp "smollm": split every digit, then the GPT-2 regex.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("gpt-2", "default"):
        return byte_level
    raise ConversionError(f"unsupported tokenizer.ggml.pre {pre!r}")


def build_tokenizer(reader: gguf.GGUFReader):
    tok_model = field(reader, "tokenizer.ggml.model")
    if tok_model != "gpt2":
        raise ConversionError(f"only byte-level BPE (gpt2) tokenizers are supported, got {tok_model!r}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    pre = field(reader, "tokenizer.ggml.pre", "default")

    unexpected = sorted({int(x) for x in types} - {TOKEN_NORMAL, TOKEN_CONTROL})
    if unexpected:
        raise ConversionError(f"token types {unexpected} are not handled")

    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ConversionError("duplicate tokens in the GGUF vocab")
    merge_pairs = []
    for m in merges:
        a, b = m.split(" ")
        if a + b not in vocab:
            raise ConversionError(f"merge {m!r} produces a token not in the vocab")
        merge_pairs.append((a, b))

    bpe = models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizer_for(pre)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [tokens[i] for i, ty in enumerate(types) if ty == TOKEN_CONTROL]
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False, single_word=False) for s in special]
    )
    return tok, tokens, types, special


def tokenizer_config(reader, tokens, special, max_len):
    ids = {
        "bos": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos": field(reader, "tokenizer.ggml.eos_token_id"),
        "unk": field(reader, "tokenizer.ggml.unknown_token_id"),
        "pad": field(reader, "tokenizer.ggml.padding_token_id"),
    }
    cfg = {
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": bool(field(reader, "tokenizer.ggml.add_space_prefix", False)),
        "added_tokens_decoder": {
            str(tokens.index(s)): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for s in special
        },
        # Chat-role markers are the ones the chat template uses; the remaining
        # control tokens (code / jupyter markers) stay plain special tokens.
        "additional_special_tokens": [s for s in ("<|im_start|>", "<|im_end|>") if s in special],
        "bos_token": tokens[ids["bos"]],
        "chat_template": field(reader, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": tokens[ids["eos"]],
        "model_max_length": max_len,
        "pad_token": tokens[ids["pad"]],
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tokens[ids["unk"]],
        "vocab_size": len(tokens),
    }
    special_map = {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token", "additional_special_tokens")}
    return cfg, special_map, ids


# --------------------------------------------------------------------------- #
# Config
# --------------------------------------------------------------------------- #
def model_config(reader, ids, has_lm_head: bool):
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise ConversionError(f"architecture {arch!r} is not llama")
    hidden = int(field(reader, "llama.embedding_length"))
    n_head = int(field(reader, "llama.attention.head_count"))
    rope_dim = int(field(reader, "llama.rope.dimension_count", hidden // n_head))
    if rope_dim != hidden // n_head:
        raise ConversionError("partial rotary embeddings are not supported")
    if "llama.rope.scaling.type" in reader.fields:
        raise ConversionError("rope scaling is not supported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": int(ids["bos"]),
        "eos_token_id": int(ids["eos"]),
        "hidden_act": "silu",
        "hidden_size": hidden,
        # Training-only field, not stored in GGUF; SmolLM2 uses 1/sqrt(hidden).
        "initializer_range": hidden**-0.5,
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": n_head,
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_key_value_heads": int(field(reader, "llama.attention.head_count_kv")),
        "pad_token_id": int(ids["pad"]),
        "pretraining_tp": 1,
        "rms_norm_eps": f32_to_py(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_scaling": None,
        "rope_theta": f32_to_py(field(reader, "llama.rope.freq_base")),
        "tie_word_embeddings": not has_lm_head,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": int(field(reader, "llama.vocab_size", len(field(reader, "tokenizer.ggml.tokens")))),
    }


# --------------------------------------------------------------------------- #
# Verification
# --------------------------------------------------------------------------- #
def verify_tokenizer(tok_path: Path, tokens, types, special, ids, roundtrip_text: str) -> list[str]:
    tok = Tokenizer.from_file(str(tok_path))  # reload: checks what was written
    log = []
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ConversionError(f"vocab size {tok.get_vocab_size()} != {len(tokens)}")
    for i, t in enumerate(tokens):
        if tok.id_to_token(i) != t or tok.token_to_id(t) != i:
            raise ConversionError(f"token id mismatch at {i}: {t!r}")
    log.append(f"vocab: all {len(tokens)} tokens map to their GGUF ids")

    added = {a.content: (i, a.special) for i, a in tok.get_added_tokens_decoder().items()}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        is_special = t in added and added[t][1]
        if (ty == TOKEN_CONTROL) != is_special:
            raise ConversionError(f"token {i} {t!r}: GGUF type {ty} but special={is_special}")
    log.append(f"token types: {len(special)} CONTROL tokens == the special added tokens, rest NORMAL")

    for role, i in ids.items():
        t = tokens[i]
        enc = tok.encode(t, add_special_tokens=False).ids
        if enc != [i]:
            raise ConversionError(f"{role} token {t!r} encodes to {enc}, GGUF id {i}")
        log.append(f"{role}: {t!r} -> id {i} (matches GGUF)")
    for t in special:
        if tok.encode(t, add_special_tokens=False).ids != [tokens.index(t)]:
            raise ConversionError(f"special token {t!r} does not encode to its own id")

    enc = tok.encode(roundtrip_text, add_special_tokens=False)
    dec = tok.decode(enc.ids, skip_special_tokens=False)
    if dec != roundtrip_text:
        first = next((k for k, (a, b) in enumerate(zip(dec, roundtrip_text)) if a != b), min(len(dec), len(roundtrip_text)))
        raise ConversionError(f"round trip differs at char {first}: {roundtrip_text[first:first+40]!r} vs {dec[first:first+40]!r}")
    log.append(
        f"round trip: {len(roundtrip_text)} chars / {len(roundtrip_text.encode())} bytes -> {len(enc.ids)} tokens -> identical text"
    )

    chat = "<|im_start|>user\nWhat is 12+30?<|im_end|>\n"
    ids_chat = tok.encode(chat, add_special_tokens=False).ids
    if ids_chat[0] != ids["bos"] or ids["eos"] not in ids_chat or tok.decode(ids_chat, skip_special_tokens=False) != chat:
        raise ConversionError(f"chat markers not tokenized as special tokens: {ids_chat}")
    digits = tok.encode("2024", add_special_tokens=False).tokens
    if digits != ["2", "0", "2", "4"]:
        raise ConversionError(f"digits are not split individually: {digits}")
    log.append(f"chat markers: {chat!r} -> {ids_chat}; '2024' -> {digits}")
    return log


# --------------------------------------------------------------------------- #
def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--roundtrip-text", type=Path, default=Path(__file__).with_name("roundtrip.txt"))
    args = ap.parse_args(argv)

    reader = gguf.GGUFReader(str(args.gguf))
    out = args.outdir
    out.mkdir(parents=True, exist_ok=True)

    tok, tokens, types, special = build_tokenizer(reader)
    tok.save(str(out / "tokenizer.json"))
    max_len = int(field(reader, "llama.context_length"))
    tcfg, smap, ids = tokenizer_config(reader, tokens, special, max_len)
    write_json(out / "tokenizer_config.json", tcfg)
    write_json(out / "special_tokens_map.json", smap)

    has_lm_head = any(t.name == "output.weight" for t in reader.tensors)
    cfg = model_config(reader, ids, has_lm_head)
    write_json(out / "config.json", cfg)
    write_json(
        out / "generation_config.json",
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"]},
    )

    names, dtypes, worst_rel = convert_weights(
        reader, cfg["num_attention_heads"], cfg["num_key_value_heads"], out / "model.safetensors"
    )
    print(f"weights: {len(names)} tensors written as BF16; GGUF tensor types: {dtypes}")
    quantized = {k: v for k, v in dtypes.items() if k not in ("F32", "F16", "BF16")}
    if quantized:
        print(
            f"WARNING: the GGUF weights are quantized ({quantized}); they were DEQUANTIZED, "
            "so model.safetensors is NOT the original 16-bit checkpoint."
        )
    print(f"weights: worst BF16 rounding error relative to tensor max |w|: {worst_rel:.2e}")
    print(f"lm_head: {'separate tensor' if has_lm_head else 'tied to model.embed_tokens'}")

    for line in verify_tokenizer(
        out / "tokenizer.json", tokens, types, special, ids, args.roundtrip_text.read_text(encoding="utf-8")
    ):
        print("tokenizer:", line)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ConversionError as e:
        print(f"gguf_to_hf: error: {e}", file=sys.stderr)
        sys.exit(1)
