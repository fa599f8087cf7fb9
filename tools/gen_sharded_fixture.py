#!/usr/bin/env python3
"""Writes tests/data/sharded-nvfp4/: a two-shard compressed-tensors NVFP4 (W4A4) checkpoint of a one-layer
Llama-shaped model with random codes, written by the reference `safetensors` package. It exercises the shard
index, `fp4serve inspect` and the README's first command. It is not a trained model.

Usage: python3 tools/gen_sharded_fixture.py   (needs numpy, ml_dtypes, safetensors)
"""
import json
import pathlib
import shutil

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "sharded-nvfp4"
HIDDEN, INTER, VOCAB, HEADS, KV_HEADS = 64, 96, 128, 4, 2
HEAD_DIM = HIDDEN // HEADS


def nvfp4_linear(rng, prefix, n, k, out):
    out[f"{prefix}.weight_packed"] = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    scales = rng.uniform(0.5, 40.0, size=(n, k // 16)).astype(ml_dtypes.float8_e4m3fn)
    out[f"{prefix}.weight_scale"] = scales
    out[f"{prefix}.weight_global_scale"] = np.array([448.0 * 6.0 / rng.uniform(0.05, 0.2)], dtype=np.float32)
    out[f"{prefix}.input_global_scale"] = np.array([448.0 * 6.0 / rng.uniform(2.0, 8.0)], dtype=np.float32)


def main():
    rng = np.random.default_rng(7)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    shard1, shard2 = {}, {}
    shard1["model.embed_tokens.weight"] = (rng.standard_normal((VOCAB, HIDDEN)) * 0.02).astype(ml_dtypes.bfloat16)
    L = "model.layers.0"
    shard1[f"{L}.input_layernorm.weight"] = np.ones(HIDDEN, dtype=ml_dtypes.bfloat16)
    shard1[f"{L}.post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=ml_dtypes.bfloat16)
    nvfp4_linear(rng, f"{L}.self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN, shard1)
    nvfp4_linear(rng, f"{L}.self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN, shard1)
    nvfp4_linear(rng, f"{L}.self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN, shard1)
    nvfp4_linear(rng, f"{L}.self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM, shard1)
    nvfp4_linear(rng, f"{L}.mlp.gate_proj", INTER, HIDDEN, shard2)
    nvfp4_linear(rng, f"{L}.mlp.up_proj", INTER, HIDDEN, shard2)
    nvfp4_linear(rng, f"{L}.mlp.down_proj", HIDDEN, INTER, shard2)
    shard2["model.norm.weight"] = np.ones(HIDDEN, dtype=ml_dtypes.bfloat16)
    shard2["lm_head.weight"] = (rng.standard_normal((VOCAB, HIDDEN)) * 0.02).astype(ml_dtypes.bfloat16)

    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file(shard1, str(OUT / names[0]), metadata={"format": "pt"})
    save_file(shard2, str(OUT / names[1]), metadata={"format": "pt"})
    weight_map = {k: names[0] for k in shard1} | {k: names[1] for k in shard2}
    total = sum(v.nbytes for v in shard1.values()) + sum(v.nbytes for v in shard2.values())
    (OUT / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    args = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group",
            "dynamic": False, "actorder": None, "observer": "minmax", "observer_kwargs": {},
            "scale_dtype": "torch.float8_e4m3fn", "zp_dtype": None, "block_structure": None}
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "compressed-tensors", "version": "0.12.2", "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed", "global_compression_ratio": None, "ignore": ["lm_head"],
            "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
            "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
                                          "weights": args, "input_activations": dict(args, dynamic="local"),
                                          "output_activations": None}},
        },
    }
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {OUT} ({total} tensor bytes)")


if __name__ == "__main__":
    main()
