#!/usr/bin/env python3
"""Writes tests/data/configs/<name>/: tiny checkpoints (config.json [+ hf_quant_config.json] + model.safetensors)
whose quantization configs follow the structure of real published ones (compressed-tensors / llm-compressor,
NVIDIA ModelOpt, GPT-OSS native mxfp4) and whose tensors follow docs/FORMATS.md §2-§5 (names, dtypes, shapes).
Weights are random codes with realistic scales; they are not trained models. Used by tests/plan and the
`fp4serve explain` CLI tests.

Usage: python3 tools/gen_config_fixtures.py   (needs numpy, ml_dtypes, safetensors)
"""
import json
import pathlib
import shutil

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "configs"
H, I, V, LAYERS, HEADS, KV, HD = 64, 96, 128, 2, 4, 2, 16
E, MOE_I = 4, 32
BF16 = ml_dtypes.bfloat16
E4M3 = "torch.float8_e4m3fn"


# --- tensor writers (FORMATS.md §2, §3, §5) -------------------------------------------------------------------
def dense(rng, t, name, shape):
    t[name] = (rng.standard_normal(shape) * 0.02).astype(BF16)


def ct_nvfp4(rng, t, p, n, k, w4a4, zero_global=False):
    t[f"{p}.weight_packed"] = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    t[f"{p}.weight_scale"] = rng.uniform(0.5, 40.0, size=(n, k // 16)).astype(ml_dtypes.float8_e4m3fn)
    gs = 0.0 if zero_global else 448.0 * 6.0 / rng.uniform(0.05, 0.2)
    t[f"{p}.weight_global_scale"] = np.array([gs], dtype=np.float32)
    if w4a4:
        t[f"{p}.input_global_scale"] = np.array([448.0 * 6.0 / rng.uniform(2.0, 8.0)], dtype=np.float32)


def mo_nvfp4(rng, t, p, n, k, w4a4):
    t[f"{p}.weight"] = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    t[f"{p}.weight_scale"] = rng.uniform(0.5, 40.0, size=(n, k // 16)).astype(ml_dtypes.float8_e4m3fn)
    t[f"{p}.weight_scale_2"] = np.array(rng.uniform(0.05, 0.2) / (448.0 * 6.0), dtype=np.float32)  # 0-d
    if w4a4:
        t[f"{p}.input_scale"] = np.array(rng.uniform(2.0, 8.0) / (448.0 * 6.0), dtype=np.float32)


def ct_mxfp4(rng, t, p, n, k):
    t[f"{p}.weight_packed"] = rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8)
    t[f"{p}.weight_scale"] = rng.integers(118, 127, size=(n, k // 32), dtype=np.uint8)


def ct_int4(rng, t, p, n, k, g):
    t[f"{p}.weight_packed"] = rng.integers(-2**31, 2**31 - 1, size=(n, (k + 7) // 8), dtype=np.int32)
    t[f"{p}.weight_scale"] = rng.uniform(0.001, 0.01, size=(n, k // g)).astype(BF16)
    t[f"{p}.weight_shape"] = np.array([n, k], dtype=np.int64)


def ct_fp8_channel(rng, t, p, n, k):
    t[f"{p}.weight"] = rng.uniform(-448, 448, size=(n, k)).astype(ml_dtypes.float8_e4m3fn)
    t[f"{p}.weight_scale"] = rng.uniform(1e-4, 1e-3, size=(n, 1)).astype(BF16)


def mo_fp8(rng, t, p, n, k):
    t[f"{p}.weight"] = rng.uniform(-448, 448, size=(n, k)).astype(ml_dtypes.float8_e4m3fn)
    t[f"{p}.weight_scale"] = np.array(rng.uniform(1e-4, 1e-3), dtype=np.float32)
    t[f"{p}.input_scale"] = np.array(rng.uniform(1e-3, 1e-2), dtype=np.float32)


# --- model skeletons (checkpoint naming, FORMATS.md §4) ---------------------------------------------------------
def base_config(arch, model_type, **extra):
    c = {"architectures": [arch], "model_type": model_type, "hidden_size": H, "intermediate_size": I,
         "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
         "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 256,
         "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    c.update(extra)
    return c


def linears(arch):
    """(module name, N, K) of every Linear, plus (name, shape) of other float tensors."""
    mods, others = [], [("model.embed_tokens.weight", (V, H)), ("model.norm.weight", (H,))]
    for layer in range(LAYERS):
        p = f"model.layers.{layer}"
        others += [(f"{p}.input_layernorm.weight", (H,)), (f"{p}.post_attention_layernorm.weight", (H,))]
        a = f"{p}.self_attn"
        mods += [(f"{a}.q_proj", HEADS * HD, H), (f"{a}.k_proj", KV * HD, H), (f"{a}.v_proj", KV * HD, H),
                 (f"{a}.o_proj", H, HEADS * HD)]
        if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
            others += [(f"{a}.q_norm.weight", (HD,)), (f"{a}.k_norm.weight", (HD,))]
        if arch == "Qwen3MoeForCausalLM":
            mods.append((f"{p}.mlp.gate", E, H))
            for e in range(E):
                x = f"{p}.mlp.experts.{e}"
                mods += [(f"{x}.gate_proj", MOE_I, H), (f"{x}.up_proj", MOE_I, H), (f"{x}.down_proj", H, MOE_I)]
        elif arch == "MixtralForCausalLM":
            mods.append((f"{p}.block_sparse_moe.gate", E, H))
            for e in range(E):
                x = f"{p}.block_sparse_moe.experts.{e}"
                mods += [(f"{x}.w1", I, H), (f"{x}.w3", I, H), (f"{x}.w2", H, I)]
        elif arch == "GraniteMoeForCausalLM":
            mods.append((f"{p}.block_sparse_moe.router.layer", E, H))
            others += [(f"{p}.block_sparse_moe.input_linear.weight", (E, 2 * I, H)),
                       (f"{p}.block_sparse_moe.output_linear.weight", (E, H, I))]
        else:
            mods += [(f"{p}.mlp.gate_proj", I, H), (f"{p}.mlp.up_proj", I, H), (f"{p}.mlp.down_proj", H, I)]
    mods.append(("lm_head", V, H))
    return mods, others


def write(name, config, tensors, hf_quant_config=None):
    d = OUT / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if hf_quant_config is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(hf_quant_config, indent=2) + "\n")
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})


def ct_args(bits, typ, strategy, group, dynamic=False, scale_dtype=None, symmetric=True, actorder=None):
    return {"num_bits": bits, "type": typ, "symmetric": symmetric, "group_size": group, "strategy": strategy,
            "block_structure": None, "dynamic": dynamic, "actorder": actorder, "scale_dtype": scale_dtype,
            "zp_dtype": None, "observer": "minmax", "observer_kwargs": {}}


def ct_config(fmt, weights, inputs, ignore, version="0.12.2"):
    return {"quant_method": "compressed-tensors", "version": version, "format": fmt,
            "quantization_status": "compressed", "global_compression_ratio": None, "ignore": ignore,
            "kv_cache_scheme": None, "sparsity_config": {}, "transform_config": {},
            "config_groups": {"group_0": {"targets": ["Linear"], "format": fmt, "weights": weights,
                                          "input_activations": inputs, "output_activations": None}}}


def build(rng, arch, quantize, skip=()):
    """quantize(name, n, k, tensors) returns True when it wrote the module's tensors; else a bf16 weight."""
    mods, others = linears(arch)
    t = {}
    for name, shape in others:
        dense(rng, t, name, shape)
    for name, n, k in mods:
        if name in skip:
            continue
        if not quantize(name, n, k, t):
            dense(rng, t, f"{name}.weight", (n, k))
    return t


def is_router(name):
    return name.endswith("mlp.gate") or name.endswith("block_sparse_moe.gate") or name.endswith("router.layer")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    rng = np.random.default_rng(20261129)
    nv_w = ct_args(4, "float", "tensor_group", 16, False, E4M3)
    nv_a = ct_args(4, "float", "tensor_group", 16, "local", E4M3)
    mx_w = ct_args(4, "float", "group", 32, False, "torch.uint8")
    mx_a = ct_args(4, "float", "group", 32, True, "torch.uint8")

    # compressed-tensors NVFP4 W4A4, Llama (llm-compressor NVFP4 recipe: ignore lm_head)
    def q(name, n, k, t, w4a4=True):
        if name == "lm_head":
            return False
        ct_nvfp4(rng, t, name, n, k, w4a4)
        return True
    write("ct-nvfp4-llama", base_config("LlamaForCausalLM", "llama",
          quantization_config=ct_config("nvfp4-pack-quantized", nv_w, nv_a, ["lm_head"])), build(rng, "LlamaForCausalLM", q))

    # compressed-tensors NVFP4A16 written with the preset form, Qwen3
    cfg = ct_config("nvfp4-pack-quantized", None, None, ["lm_head"])
    cfg["config_groups"] = {"NVFP4A16": ["Linear"]}
    write("ct-nvfp4a16-qwen3", base_config("Qwen3ForCausalLM", "qwen3", quantization_config=cfg),
          build(rng, "Qwen3ForCausalLM", lambda n_, n, k, t: q(n_, n, k, t, False)))

    # compressed-tensors NVFP4 W4A4, Qwen3-MoE; routers ignored by exact name (as llm-compressor writes them)
    ignore = ["lm_head"] + [f"model.layers.{i}.mlp.gate" for i in range(LAYERS)]
    def q_moe(name, n, k, t):
        if name == "lm_head" or is_router(name):
            return False
        ct_nvfp4(rng, t, name, n, k, True)
        return True
    write("ct-nvfp4-qwen3moe", base_config("Qwen3MoeForCausalLM", "qwen3_moe", num_experts=E, num_experts_per_tok=2,
          moe_intermediate_size=MOE_I, decoder_sparse_step=1, mlp_only_layers=[],
          quantization_config=ct_config("nvfp4-pack-quantized", nv_w, nv_a, ignore)), build(rng, "Qwen3MoeForCausalLM", q_moe))

    # compressed-tensors MXFP4 W4A4, Mixtral; router ignored by a recipe-style regex
    def q_mx(name, n, k, t):
        if name == "lm_head" or is_router(name):
            return False
        ct_mxfp4(rng, t, name, n, k)
        return True
    write("ct-mxfp4-mixtral", base_config("MixtralForCausalLM", "mixtral", num_local_experts=E, num_experts_per_tok=2,
          quantization_config=ct_config("mxfp4-pack-quantized", mx_w, mx_a, ["lm_head", "re:.*block_sparse_moe.gate$"],
                                        version="0.13.0")), build(rng, "MixtralForCausalLM", q_mx))

    # compressed-tensors MXFP4A16, Llama
    write("ct-mxfp4a16-llama", base_config("LlamaForCausalLM", "llama",
          quantization_config=ct_config("mxfp4-pack-quantized", mx_w, None, ["lm_head"], version="0.13.0")),
          build(rng, "LlamaForCausalLM", q_mx))

    # compressed-tensors W4A16 (int4, group 32, symmetric), Qwen3-MoE
    int_w = ct_args(4, "int", "group", 32, False, None)
    def q_int(name, n, k, t):
        if name == "lm_head" or is_router(name):
            return False
        ct_int4(rng, t, name, n, k, 32)
        return True
    write("ct-w4a16-qwen3moe", base_config("Qwen3MoeForCausalLM", "qwen3_moe", num_experts=E, num_experts_per_tok=2,
          moe_intermediate_size=MOE_I, quantization_config=ct_config("pack-quantized", int_w, None, ignore)),
          build(rng, "Qwen3MoeForCausalLM", q_int))

    # compressed-tensors FP8_DYNAMIC (channel weights, dynamic per-token activations), GraniteMoe: the 3-D
    # experts are not Linear modules, so the "Linear" target leaves them in bf16
    fp8_w = ct_args(8, "float", "channel", None, False, None)
    fp8_a = ct_args(8, "float", "token", None, True, None)
    def q_fp8(name, n, k, t):
        if name == "lm_head" or is_router(name):
            return False
        ct_fp8_channel(rng, t, name, n, k)
        return True
    write("ct-fp8-granitemoe", base_config("GraniteMoeForCausalLM", "granitemoe", num_local_experts=E,
          num_experts_per_tok=2, quantization_config=ct_config("float-quantized", fp8_w, fp8_a,
          ["lm_head"] + [f"model.layers.{i}.block_sparse_moe.router.layer" for i in range(LAYERS)])),
          build(rng, "GraniteMoeForCausalLM", q_fp8))

    # ModelOpt NVFP4 (hf_quant_config.json), Llama, lm_head excluded
    hf = {"producer": {"name": "modelopt", "version": "0.29.0"},
          "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                           "exclude_modules": ["lm_head"]}}
    def q_mo(name, n, k, t):
        if name == "lm_head":
            return False
        mo_nvfp4(rng, t, name, n, k, True)
        return True
    write("mo-nvfp4-llama", base_config("LlamaForCausalLM", "llama"), build(rng, "LlamaForCausalLM", q_mo), hf)

    # ModelOpt MIXED_PRECISION, Qwen3: attention NVFP4, MLP of layer 0 FP8, layer 1 MLP not listed (unquantized)
    layers = {}
    for layer in range(LAYERS):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            layers[f"model.layers.{layer}.self_attn.{proj}"] = {"quant_algo": "NVFP4", "group_size": 16}
    for proj in ("gate_proj", "up_proj", "down_proj"):
        layers[f"model.layers.0.mlp.{proj}"] = {"quant_algo": "FP8"}
    hf = {"producer": {"name": "modelopt", "version": "0.29.0"},
          "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": layers}}
    def q_mixed(name, n, k, t):
        algo = layers.get(name, {}).get("quant_algo")
        if algo == "NVFP4":
            mo_nvfp4(rng, t, name, n, k, True)
        elif algo == "FP8":
            mo_fp8(rng, t, name, n, k)
        return algo is not None
    write("mo-mixed-qwen3", base_config("Qwen3ForCausalLM", "qwen3"), build(rng, "Qwen3ForCausalLM", q_mixed), hf)

    # GPT-OSS native mxfp4: expert blocks/scales, everything else bf16 (HF convert_gpt_oss_weights_to_hf.py)
    cfg = base_config("GptOssForCausalLM", "gpt_oss", num_local_experts=E, num_experts_per_tok=2, intermediate_size=H,
                      attention_bias=True, swiglu_limit=7.0,
                      quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": [
                          "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]})
    t = {}
    for name, shape in [("model.embed_tokens.weight", (V, H)), ("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]:
        dense(rng, t, name, shape)
    for layer in range(LAYERS):
        p = f"model.layers.{layer}"
        for name, shape in [(f"{p}.input_layernorm.weight", (H,)), (f"{p}.post_attention_layernorm.weight", (H,)),
                            (f"{p}.self_attn.sinks", (HEADS,)), (f"{p}.mlp.router.weight", (E, H)),
                            (f"{p}.mlp.router.bias", (E,))]:
            dense(rng, t, name, shape)
        for proj, n, k in [("q_proj", HEADS * HD, H), ("k_proj", KV * HD, H), ("v_proj", KV * HD, H), ("o_proj", H, HEADS * HD)]:
            dense(rng, t, f"{p}.self_attn.{proj}.weight", (n, k))
            dense(rng, t, f"{p}.self_attn.{proj}.bias", (n,))
        x = f"{p}.mlp.experts"
        for proj, n, k in [("gate_up_proj", 2 * H, H), ("down_proj", H, H)]:
            t[f"{x}.{proj}_blocks"] = rng.integers(0, 256, size=(E, n, k // 32, 16), dtype=np.uint8)
            t[f"{x}.{proj}_scales"] = rng.integers(118, 127, size=(E, n, k // 32), dtype=np.uint8)
            dense(rng, t, f"{x}.{proj}_bias", (E, n))
    write("gptoss-mxfp4", cfg, t)

    # Rule 8: a compressed-tensors NVFP4 checkpoint whose one expert-like shard has a zero global scale
    def q_zero(name, n, k, t):
        if name == "lm_head":
            return False
        ct_nvfp4(rng, t, name, n, k, True, zero_global=(name == "model.layers.1.mlp.up_proj"))
        return True
    write("ct-nvfp4-zero-global-scale", base_config("LlamaForCausalLM", "llama",
          quantization_config=ct_config("nvfp4-pack-quantized", nv_w, nv_a, ["lm_head"])), build(rng, "LlamaForCausalLM", q_zero))


if __name__ == "__main__":
    main()
