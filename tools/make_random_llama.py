#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes a LlamaForCausalLM checkpoint of random bf16 weights in the Hugging Face layout (config.json,
model.safetensors, tokenizer files): the SmolLM2-135M shape by default (30 layers, hidden 576, 9 heads / 3 KV
heads of 64, intermediate 1536, vocab 49152, tied embeddings), so that speed can be measured on a real-sized model
where no real checkpoint can be fetched (the device machine of scripts/device-check.sh has no network).
`fp4serve quantize --scheme nvfp4a16` then turns it into an NVFP4 checkpoint.

Standard library only (the machines that run it may lack numpy): each bf16 weight is a random sign, a random
exponent byte drawn from a small set and 7 random mantissa bits, i.e. |w| uniform-ish in [2^-9, 2^-4) (rms about
0.02, like initializer_range = 0.02); norm weights are 1. Deterministic for a given --seed.

    python3 tools/make_random_llama.py --out DIR --tokenizer tests/data/tokenizers/smollm2-real/tokenizer.json.xz
"""
import argparse
import json
import lzma
import os
import random
import shutil
import struct

SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def tensor_list(c):
    h, i, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    out = [("model.embed_tokens.weight", [v, h], "random")]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [
            (p + "input_layernorm.weight", [h], "ones"),
            (p + "self_attn.q_proj.weight", [q, h], "random"),
            (p + "self_attn.k_proj.weight", [kv, h], "random"),
            (p + "self_attn.v_proj.weight", [kv, h], "random"),
            (p + "self_attn.o_proj.weight", [h, q], "random"),
            (p + "post_attention_layernorm.weight", [h], "ones"),
            (p + "mlp.gate_proj.weight", [i, h], "random"),
            (p + "mlp.up_proj.weight", [i, h], "random"),
            (p + "mlp.down_proj.weight", [h, i], "random"),
        ]
    out.append(("model.norm.weight", [h], "ones"))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", [v, h], "random"))
    return out


# High byte of a bf16 = sign bit + the exponent's upper 7 bits; exponent bytes 0x3B..0x3D give 2^-9 … 2^-4.
HIGH = bytes((b & 0x80) | (0x3B + (b & 0x7F) % 3) for b in range(256))


def random_bf16(rng, count):
    buf = bytearray(2 * count)
    buf[0::2] = rng.randbytes(count)  # exponent LSB + mantissa
    buf[1::2] = rng.randbytes(count).translate(HIGH)
    return buf


def write_safetensors(path, tensors, rng):
    header, offset = {}, 0
    for name, shape, _ in tensors:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name, shape, kind in tensors:
            n = header[name]["data_offsets"][1] // 2 - header[name]["data_offsets"][0] // 2
            f.write(random_bf16(rng, n) if kind == "random" else b"\x80\x3f" * n)
    os.replace(tmp, path)
    return offset


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (or tokenizer.json.xz) to copy")
    ap.add_argument("--tokenizer-config", help="tokenizer_config.json to copy (default: beside --tokenizer)")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers")
    ap.add_argument("--seed", type=int, default=21)
    args = ap.parse_args()

    c = dict(SMOLLM2_135M)
    if args.layers:
        c["num_hidden_layers"] = args.layers
    os.makedirs(args.out, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        "rope_scaling": None,
        **c,
    }
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"]}, f)
    src = args.tokenizer
    opener = lzma.open if src.endswith(".xz") else open
    with opener(src, "rb") as fin, open(os.path.join(args.out, "tokenizer.json"), "wb") as fout:
        shutil.copyfileobj(fin, fout)
    tok_config = args.tokenizer_config or os.path.join(os.path.dirname(src), "tokenizer_config.json")
    if os.path.exists(tok_config):
        shutil.copy(tok_config, os.path.join(args.out, "tokenizer_config.json"))
    size = write_safetensors(os.path.join(args.out, "model.safetensors"), tensor_list(c), random.Random(args.seed))
    print(f"make_random_llama: {args.out}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
          f"vocab {c['vocab_size']}, {size / 2 / 1e6:.1f} M parameters (bf16)")


if __name__ == "__main__":
    main()
