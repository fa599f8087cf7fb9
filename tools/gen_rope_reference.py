#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes tests/data/rope/hf_rope_reference.json: cos/sin tables computed by transformers' own rotary
embedding modules (LlamaRotaryEmbedding, GptOssRotaryEmbedding, DeepseekV3RotaryEmbedding) for a set of
config.json rope blocks, so tests/kernel_ops/ops_rope_test.cpp checks fp4serve's RopeCache and
parse_rope_scaling against the reference implementation itself, not against a re-derivation.

Needs torch + transformers (tools/reference/.venv on the fixtures branch): python tools/gen_rope_reference.py
"""
import json
import pathlib

import torch
import transformers
from transformers import DeepseekV3Config, GptOssConfig, LlamaConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

POSITIONS = [0, 1, 2, 37, 1000, 4095, 70000]

# (name, config class, rotary module, config.json subset, rotary_dim)
CASES = [
    ("default_theta_10000", LlamaConfig, LlamaRotaryEmbedding,
     {"hidden_size": 96, "num_attention_heads": 3, "head_dim": 32, "max_position_embeddings": 2048,
      "rope_theta": 10000.0, "rope_scaling": None}, 32),
    ("linear_factor_4", LlamaConfig, LlamaRotaryEmbedding,
     {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64, "max_position_embeddings": 8192,
      "rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 4.0}}, 64),
    ("llama3_1_8b", LlamaConfig, LlamaRotaryEmbedding,
     {"hidden_size": 256, "num_attention_heads": 2, "head_dim": 128, "max_position_embeddings": 131072,
      "rope_theta": 500000.0,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}}, 128),
    ("gpt_oss_yarn_no_truncate", GptOssConfig, GptOssRotaryEmbedding,
     {"hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
      "max_position_embeddings": 131072, "rope_theta": 150000,
      "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                       "original_max_position_embeddings": 4096, "truncate": False}}, 64),
    ("deepseek_yarn_mscale", DeepseekV3Config, DeepseekV3RotaryEmbedding,
     {"hidden_size": 256, "num_attention_heads": 4, "qk_rope_head_dim": 64, "qk_nope_head_dim": 32,
      "v_head_dim": 32, "max_position_embeddings": 163840, "rope_theta": 10000,
      "rope_scaling": {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                       "mscale_all_dim": 0.5, "original_max_position_embeddings": 4096}}, 64),
    ("yarn_attention_factor_given", LlamaConfig, LlamaRotaryEmbedding,
     {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64, "max_position_embeddings": 32768,
      "rope_theta": 1000000.0,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.25,
                       "original_max_position_embeddings": 8192}}, 64),
]


def main():
    cases = []
    for name, cfg_cls, rope_cls, cfg_json, rotary_dim in CASES:
        config = cfg_cls(**json.loads(json.dumps(cfg_json)))
        rope = rope_cls(config)
        pos = torch.tensor([POSITIONS], dtype=torch.int64)
        x = torch.zeros(1, 1, len(POSITIONS), rotary_dim, dtype=torch.float32)
        cos, sin = rope(x, pos)
        half = rotary_dim // 2
        assert cos.dtype == torch.float32 and cos.shape[-1] in (half, rotary_dim), (name, cos.shape)
        if cos.shape[-1] == rotary_dim:
            # Most modules duplicate the frequencies (cat(freqs, freqs)); GPT-OSS returns one half.
            assert torch.equal(cos[0, :, :half], cos[0, :, half:]), name
        cases.append({
            "name": name,
            "config": cfg_json,
            "rotary_dim": rotary_dim,
            "positions": POSITIONS,
            "inv_freq": [float(v) for v in rope.inv_freq],
            "attention_scaling": float(rope.attention_scaling),
            "cos": [[float(v) for v in row[:half]] for row in cos[0]],
            "sin": [[float(v) for v in row[:half]] for row in sin[0]],
        })
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/data/rope/hf_rope_reference.json"
    out.write_text(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {out} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
