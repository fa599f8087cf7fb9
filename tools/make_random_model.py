#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes a checkpoint of random weights in the Hugging Face layout (config.json, safetensors shards with an index,
tokenizer files) at the shape of a published model, so that speed and memory can be measured at real size where
the real checkpoint cannot be fetched (the device machine has no network) or would not fit the disk.

Shapes (--shape; the numbers are the published config.json's):
  smollm2-135m   LlamaForCausalLM, 30 layers, hidden 576, 9 / 3 heads of 64, tied (the default)
  llama-3.2-3b   LlamaForCausalLM, 28 layers, hidden 3072, 24 / 8 heads of 128, intermediate 8192, tied
  llama-3.1-8b   LlamaForCausalLM, 32 layers, hidden 4096, 32 / 8 heads of 128, intermediate 14336
  qwen3-30b-a3b  Qwen3MoeForCausalLM, 48 layers, hidden 2048, 32 / 4 heads of 128, 128 experts of 768, top 8
  gpt-oss-20b    GptOssForCausalLM, 24 layers, hidden 2880, 64 / 8 heads of 64, 32 experts of 2880, top 4, native
                 MXFP4 experts (`*_blocks` U8 + `*_scales` E8M0 as OpenAI ships them), sinks, sliding window 128
Dense weights are bf16 (`fp4serve quantize --scheme nvfp4a16` turns a dense shape into NVFP4); gpt-oss-20b is
written as published (MXFP4 experts, everything else bf16) and runs as it is.

Standard library only (the machines that run it may lack numpy): each bf16 weight is a random sign, a random
exponent byte drawn from a small set and 7 random mantissa bits, i.e. |w| uniform-ish in [2^-9, 2^-4) (rms about
0.02, like initializer_range = 0.02); norm weights are 1; MXFP4 codes are random bytes with E8M0 scales 2^-7…2^-5.
Deterministic for a given --seed. Shards of at most --shard-gib; each is written to a temporary and renamed.
The tokenizer is copied from --tokenizer (its vocabulary may be smaller than the shape's: ids above it are never
produced, and llama.cpp's converter pads the vocabulary).

    python3 tools/make_random_model.py --shape llama-3.2-3b --out DIR \\
        --tokenizer tests/data/tokenizers/smollm2-real/tokenizer.json.xz
"""
import argparse
import json
import lzma
import os
import random
import shutil
import struct

SHAPES = {
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
        "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    },
    "llama-3.2-3b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
        "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
        "mlp_only_layers": [], "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False, "use_sliding_window": False,
    },
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088, "num_local_experts": 32,
        "experts_per_token": 4, "num_experts_per_tok": 4, "sliding_window": 128, "swiglu_limit": 7.0,
        "attention_bias": True, "max_position_embeddings": 131072, "initial_context_length": 4096,
        "rope_theta": 150000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096},
    },
}


def dense_layer(p, c):
    h, i = c["hidden_size"], c["intermediate_size"]
    return [(p + "mlp.gate_proj.weight", "BF16", [i, h], "random"),
            (p + "mlp.up_proj.weight", "BF16", [i, h], "random"),
            (p + "mlp.down_proj.weight", "BF16", [h, i], "random")]


def qwen3_moe_layer(p, c):
    h, i, e = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]
    out = [(p + "mlp.gate.weight", "BF16", [e, h], "random")]
    for x in range(e):
        q = f"{p}mlp.experts.{x}."
        out += [(q + "gate_proj.weight", "BF16", [i, h], "random"),
                (q + "up_proj.weight", "BF16", [i, h], "random"),
                (q + "down_proj.weight", "BF16", [h, i], "random")]
    return out


def gpt_oss_layer(p, c):
    h, i, e = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
    m = p + "mlp."
    return [(m + "router.weight", "BF16", [e, h], "random"), (m + "router.bias", "BF16", [e], "random"),
            (m + "experts.gate_up_proj_blocks", "U8", [e, 2 * i, h // 32, 16], "codes"),
            (m + "experts.gate_up_proj_scales", "U8", [e, 2 * i, h // 32], "e8m0"),
            (m + "experts.gate_up_proj_bias", "BF16", [e, 2 * i], "random"),
            (m + "experts.down_proj_blocks", "U8", [e, h, i // 32, 16], "codes"),
            (m + "experts.down_proj_scales", "U8", [e, h, i // 32], "e8m0"),
            (m + "experts.down_proj_bias", "BF16", [e, h], "random")]


def tensor_list(c):
    """(name, dtype, shape, fill) for every tensor of the shape, in checkpoint order."""
    h, v = c["hidden_size"], c["vocab_size"]
    d = c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    arch = c["architectures"][0]
    out = [("model.embed_tokens.weight", "BF16", [v, h], "random")]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        out += [(p + "input_layernorm.weight", "BF16", [h], "ones"),
                (a + "q_proj.weight", "BF16", [q, h], "random"),
                (a + "k_proj.weight", "BF16", [kv, h], "random"),
                (a + "v_proj.weight", "BF16", [kv, h], "random"),
                (a + "o_proj.weight", "BF16", [h, q], "random")]
        if c.get("attention_bias"):
            out += [(a + "q_proj.bias", "BF16", [q], "random"), (a + "k_proj.bias", "BF16", [kv], "random"),
                    (a + "v_proj.bias", "BF16", [kv], "random"), (a + "o_proj.bias", "BF16", [h], "random")]
        if arch == "Qwen3MoeForCausalLM":
            out += [(a + "q_norm.weight", "BF16", [d], "ones"), (a + "k_norm.weight", "BF16", [d], "ones")]
        if arch == "GptOssForCausalLM":
            out.append((a + "sinks", "BF16", [c["num_attention_heads"]], "random"))
        out.append((p + "post_attention_layernorm.weight", "BF16", [h], "ones"))
        if arch == "Qwen3MoeForCausalLM":
            out += qwen3_moe_layer(p, c)
        elif arch == "GptOssForCausalLM":
            out += gpt_oss_layer(p, c)
        else:
            out += dense_layer(p, c)
    out.append(("model.norm.weight", "BF16", [h], "ones"))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", "BF16", [v, h], "random"))
    return out


# High byte of a bf16 = sign bit + the exponent's upper 7 bits; exponent bytes 0x3B..0x3D give 2^-9 … 2^-4.
HIGH = bytes((b & 0x80) | (0x3B + (b & 0x7F) % 3) for b in range(256))
# E8M0 scale bytes 120…122: 2^-7 … 2^-5, so code · scale stays in the bf16 weights' range.
E8M0 = bytes(120 + b % 3 for b in range(256))
CHUNK = 1 << 24  # elements generated per write, to bound memory


def fill_bytes(rng, fill, count):
    """The bytes of `count` elements."""
    if fill == "ones":
        return b"\x80\x3f" * count
    if fill == "codes":
        return rng.randbytes(count)
    if fill == "e8m0":
        return rng.randbytes(count).translate(E8M0)
    buf = bytearray(2 * count)
    buf[0::2] = rng.randbytes(count)  # exponent LSB + mantissa
    buf[1::2] = rng.randbytes(count).translate(HIGH)
    return buf


def element_bytes(dtype):
    return {"BF16": 2, "U8": 1}[dtype]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_shard(path, tensors, rng):
    header, offset = {}, 0
    for name, dtype, shape, _ in tensors:
        size = numel(shape) * element_bytes(dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, dtype, shape, fill in tensors:
            left = numel(shape)
            while left > 0:
                n = min(left, CHUNK)
                f.write(fill_bytes(rng, fill, n))
                left -= n
    os.replace(tmp, path)
    return offset


def write_checkpoint(out, tensors, rng, shard_bytes):
    shards, current, size = [], [], 0
    for t in tensors:
        b = numel(t[2]) * element_bytes(t[1])
        if current and size + b > shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(t)
        size += b
    shards.append(current)
    if len(shards) == 1:
        return write_shard(os.path.join(out, "model.safetensors"), shards[0], rng)
    total, weight_map = 0, {}
    for k, shard in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(os.path.join(out, name), shard, rng)
        for t in shard:
            weight_map[t[0]] = name
    index = os.path.join(out, "model.safetensors.index.json")
    with open(index + ".tmp", "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    os.replace(index + ".tmp", index)
    return total


def config_json(c):
    config = {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
              "rope_scaling": None, "bos_token_id": 1, "eos_token_id": 2, **c}
    if c["architectures"][0] == "GptOssForCausalLM":
        config["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention"
                                 for i in range(c["num_hidden_layers"])]
        config["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                                       "lm_head"]}
    return config


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer.json (or tokenizer.json.xz) to copy")
    ap.add_argument("--tokenizer-config", help="tokenizer_config.json to copy (default: beside --tokenizer)")
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES), help="published shape to copy")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers (a shorter model of the same width)")
    ap.add_argument("--shard-gib", type=float, default=4.0, help="largest shard in GiB (default 4)")
    ap.add_argument("--seed", type=int, default=21)
    args = ap.parse_args()

    c = dict(SHAPES[args.shape])
    if args.layers:
        if args.layers < 1:
            ap.error(f"--layers {args.layers}: expected at least 1")
        c["num_hidden_layers"] = args.layers
    os.makedirs(args.out, exist_ok=True)
    config = config_json(c)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, f)
    src = args.tokenizer
    opener = lzma.open if src.endswith(".xz") else open
    with opener(src, "rb") as fin, open(os.path.join(args.out, "tokenizer.json"), "wb") as fout:
        shutil.copyfileobj(fin, fout)
    tok_config = args.tokenizer_config or os.path.join(os.path.dirname(src), "tokenizer_config.json")
    if os.path.exists(tok_config):
        shutil.copy(tok_config, os.path.join(args.out, "tokenizer_config.json"))
    tensors = tensor_list(c)
    size = write_checkpoint(args.out, tensors, random.Random(args.seed), int(args.shard_gib * (1 << 30)))
    # An MXFP4 code byte holds 2 weights; its scales are not weights.
    params = sum(numel(t[2]) * {"codes": 2, "e8m0": 0}.get(t[3], 1) for t in tensors)
    print(f"make_random_model: {args.out}: {args.shape}, {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
          f"vocab {c['vocab_size']}, {params / 1e9:.2f} B parameters, {size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
