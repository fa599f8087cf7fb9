"""Tiny random transformers models for the reference fixtures.

All fixtures use untied lm_head/embeddings: tied random tiny models degenerate
(the RMS-normed residual is dominated by the last token's own embedding, so greedy
decoding repeats the last prompt token).

Every model is built from a config written here, initialised with a fixed seed by
`init_weights` (not by transformers' own init), cast to bf16 and saved with
`save_pretrained`. Dimensions are chosen so that every quantized Linear has
K % 32 == 0 (MXFP4) and, where int4 group 128 is used, K % 128 == 0.
"""
import math

import torch

VOCAB = 512

# name -> (transformers class name, config kwargs, extra info)
# Kept small: the dense Llama uses the dims of the brief, other archs are smaller
# so that the whole tests/data/ref tree stays under its size budget.
_COMMON = dict(
    vocab_size=VOCAB,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=0,
    use_cache=True,
)

MODELS = {
    "llama": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", moe=False,
        kwargs=dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                    tie_word_embeddings=False, rope_theta=10000.0, **_COMMON),
    ),
    "llama-i352": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig", moe=False,
        kwargs=dict(hidden_size=128, intermediate_size=352, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    tie_word_embeddings=False, rope_theta=10000.0, **_COMMON),
    ),
    "qwen2": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config", moe=False,
        kwargs=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2,
                    tie_word_embeddings=False, rope_theta=1000000.0, **_COMMON),
    ),
    "qwen3": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config", moe=False,
        kwargs=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    tie_word_embeddings=False, rope_theta=1000000.0, **_COMMON),
    ),
    "granite": dict(
        cls="GraniteForCausalLM", cfg="GraniteConfig", moe=False,
        kwargs=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2,
                    tie_word_embeddings=False, rope_theta=10000.0,
                    embedding_multiplier=4.0, residual_multiplier=0.5,
                    attention_multiplier=0.0625, logits_scaling=2.0, **_COMMON),
        embed_std=0.3,
    ),
    "mixtral": dict(
        cls="MixtralForCausalLM", cfg="MixtralConfig", moe=True,
        kwargs=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    num_local_experts=4, num_experts_per_tok=2,
                    tie_word_embeddings=False, rope_theta=1000000.0,
                    sliding_window=None, **_COMMON),
    ),
    "qwen3moe": dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", moe=True,
        kwargs=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                    head_dim=32, num_experts=4, num_experts_per_tok=2,
                    decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
                    tie_word_embeddings=False, rope_theta=1000000.0, **_COMMON),
    ),
    "granitemoe": dict(
        cls="GraniteMoeForCausalLM", cfg="GraniteMoeConfig", moe=True,
        kwargs=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1,
                    num_local_experts=4, num_experts_per_tok=2,
                    tie_word_embeddings=False, rope_theta=10000.0,
                    embedding_multiplier=4.0, residual_multiplier=0.5,
                    attention_multiplier=0.0625, logits_scaling=2.0, **_COMMON),
        embed_std=0.3,
    ),
    "gptoss": dict(
        cls="GptOssForCausalLM", cfg="GptOssConfig", moe=True,
        kwargs=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                    num_local_experts=4, num_experts_per_tok=2,
                    layer_types=["sliding_attention", "full_attention"],
                    sliding_window=128, tie_word_embeddings=False,
                    rope_theta=150000.0, swiglu_limit=7.0,
                    **dict(_COMMON, max_position_embeddings=131072)),
    ),
}


def build_config(name):
    import transformers
    spec = MODELS[name]
    cfg_cls = getattr(transformers, spec["cfg"])
    cfg = cfg_cls(**spec["kwargs"])
    cfg.dtype = "bfloat16"
    return cfg


def init_weights(model, seed, embed_std=1.0, x_at_w=False, gain=0.5):
    """Deterministic init, realistic enough that 4-bit quantization keeps logits.

    * norm weights: 1 + 0.1 N(0,1)
    * biases (incl. GPT-OSS sinks): 0.02 N(0,1)
    * embeddings: N(0, embed_std)
    * 2-D/3-D projection weights: N(0, (0.5/sqrt(fan_in))^2), fan_in = input dim
      (0.031 for K=256), so each layer adds a prompt-dependent but minority
      share to the residual stream and 4-bit weight noise keeps the top-1 token;
      MoE routers and lm_head N(0, (2/sqrt(K))^2) so routing is decisive and
      greedy top-1/top-2 margins are not tiny.
    Parameters are visited in sorted-name order with one torch.Generator.
    """
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            p = params[name]
            shape = p.shape
            if "norm" in name and p.dim() == 1:
                v = 1.0 + 0.1 * torch.randn(shape, generator=g)
            elif name.endswith("bias") or name.endswith("sinks"):
                v = 0.02 * torch.randn(shape, generator=g)
            elif "embed_tokens" in name:
                v = embed_std * torch.randn(shape, generator=g)
            else:
                fan_in = _fan_in(p, x_at_w)
                std = gain / math.sqrt(fan_in)
                if _is_router(name):
                    std = 2.0 / math.sqrt(fan_in)
                if name.startswith("lm_head"):
                    std = 2.0 / math.sqrt(fan_in)
                v = std * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))


def _is_router(name):
    return (".mlp.gate." in name or "block_sparse_moe.gate." in name
            or ".router." in name)


def _fan_in(p, x_at_w):
    # transformers' fused 3-D expert params: GPT-OSS stores them for x @ W
    # ([E, in, out]); the others store [E, out, in] like a Linear.
    if p.dim() == 3 and x_at_w:
        return p.shape[1]
    return p.shape[-1]


def build_model(name, seed):
    """Build, init and bf16-cast the tiny model `name`."""
    import transformers
    spec = MODELS[name]
    cfg = build_config(name)
    torch.manual_seed(seed)
    model = getattr(transformers, spec["cls"])(cfg)
    init_weights(model, seed, spec.get("embed_std", 1.0), x_at_w=(name == "gptoss"),
                 gain=spec.get("gain", 0.5))
    if cfg.tie_word_embeddings:
        model.tie_weights()
    model = model.to(torch.bfloat16)
    model.eval()
    return model
