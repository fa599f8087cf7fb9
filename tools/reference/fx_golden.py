"""Golden outputs of the reference tools for one fixture folder."""
import json
import os

import torch

N_GREEDY = 8


# ---------------------------------------------------------------------------
# (a) reference dequantization

def _layer0(name, moe_experts=None):
    return ".layers.0." in name


def ct_dequant(folder, keep=_layer0):
    """compressed-tensors' own decompression of every quantized Linear.

    Mirrors compressed_tensors.entrypoints.convert CompressedTensorsDequantizer
    .process, but keeps the compressor's native output dtype.
    Returns {module_name: tensor}, {module_name: info}.
    """
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.format import infer_module_format
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils.match import match_quantizable_tensors
    from safetensors.torch import load_file

    cfg = json.load(open(os.path.join(folder, "config.json")))["quantization_config"]
    qc = QuantizationConfig.model_validate(cfg)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    out, info = {}, {}
    for scheme in qc.config_groups.values():
        scheme.format = CompressionFormat(scheme.format or
                                          infer_module_format(torch.nn.Linear, scheme))
        comp = BaseCompressor.get_value_from_registry(scheme.format)
        pnames = comp.compression_param_names(scheme)
        for mod, _ in match_quantizable_tensors(tensors, ignore=qc.ignore,
                                                targets=scheme.targets,
                                                param_targets=[pnames[0]]):
            if not keep(mod):
                continue
            sd = {p: tensors[f"{mod}.{p}"] for p in pnames if f"{mod}.{p}" in tensors}
            w = comp.decompress(sd, scheme)["weight"]
            out[mod] = w
            info[mod] = {"format": scheme.format.value, "compressor": comp.__name__,
                         "dtype": str(w.dtype).replace("torch.", ""),
                         "shape": list(w.shape)}
    return out, info


def modelopt_dequant(folder, keep=_layer0):
    """nvidia-modelopt's own NVFP4QTensor.dequantize (per_block = s * weight_scale_2)."""
    from modelopt.torch.quantization.qtensor import NVFP4QTensor
    from safetensors.torch import load_file
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    out, info = {}, {}
    for name in sorted(tensors):
        if not name.endswith(".weight_scale_2"):
            continue
        mod = name[: -len(".weight_scale_2")]
        if not keep(mod):
            continue
        packed = tensors[f"{mod}.weight"]
        shape = torch.Size([packed.shape[0], packed.shape[1] * 2])
        qt = NVFP4QTensor(shape, torch.bfloat16, packed)
        w = qt.dequantize(dtype=torch.bfloat16, scale=tensors[f"{mod}.weight_scale"],
                          double_scale=tensors[name], block_sizes={-1: 16})
        out[mod] = w
        info[mod] = {"format": "modelopt NVFP4", "function":
                     "modelopt.torch.quantization.qtensor.NVFP4QTensor.dequantize",
                     "dtype": "bfloat16", "shape": list(w.shape)}
    return out, info


# ---------------------------------------------------------------------------
# (b)(c) logits and greedy continuation

def load_ct_fp32(folder):
    """from_pretrained of the compressed folder, decompressed by transformers'
    compressed-tensors integration (dequantize=True), then upcast to fp32."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig
    cfg = json.load(open(os.path.join(folder, "config.json")))
    kw = {}
    if cfg.get("quantization_config", {}).get("quant_method") == "compressed-tensors":
        kw["quantization_config"] = CompressedTensorsConfig(dequantize=True)
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, **kw)
    m = m.float().eval()
    attach_online_transforms(m, folder)
    return m


ONLINE_LOCATIONS = ("input", "output", "q_attn", "k_cache")


def attach_online_transforms(model, folder):
    """transformers (5.x, dequantize=True) drops a checkpoint's online transforms
    (the `*.<group>_<location>.weight` tensors load as UNEXPECTED), which would make
    the golden logits of a QuIP/SpinQuant checkpoint wrong. Re-attach them with
    compressed-tensors' own apply_transform_config, restricted to the online
    `apply` entries (the weight_* ones are already fused into the stored weights),
    then overwrite the freshly built matrices/perms with the stored ones (shared
    parameters are tied, so the one stored copy per size reaches every module).
    Asserts that every transform parameter was loaded from the file."""
    from compressed_tensors.transform import TransformConfig, apply_transform_config
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(folder, "config.json"))).get("quantization_config", {})
    tc = cfg.get("transform_config") or {}
    if not tc.get("config_groups"):
        return
    tc = json.loads(json.dumps(tc))
    for g in tc["config_groups"].values():
        g["apply"] = [a for a in g["apply"] if a["location"] in ONLINE_LOCATIONS]
    tc["config_groups"] = {k: v for k, v in tc["config_groups"].items() if v["apply"]}
    apply_transform_config(model, TransformConfig.model_validate(tc))
    stored = {k: v for k, v in load_file(os.path.join(folder, "model.safetensors")).items()
              if any(k.endswith(f".{g}_{loc}.{p}") for g in tc["config_groups"]
                     for loc in ONLINE_LOCATIONS for p in ("weight", "perm"))}
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = set()
    with torch.no_grad():
        for k, v in stored.items():
            params[k].copy_(v.to(params[k].dtype))
            loaded.add(id(params[k]))
    missing = [k for k, p in params.items()
               if any(f".{g}_{loc}." in k for g in tc["config_groups"] for loc in ONLINE_LOCATIONS)
               and id(p) not in loaded]
    assert stored and not missing, f"online transform parameters not in the file: {missing[:4]}"


@torch.no_grad()
def cached_keys(model, prompt, layer=0):
    """The key states that layer `layer`'s attention hands to its KV cache for one forward over `prompt`
    (post-RoPE, after any online `k_cache` transform): a forward pre-hook on compressed-tensors'
    QuantizedKVCache registered after the transform's own hook sees the transformed keys.
    Returns [num_kv_heads, tokens, head_dim] fp32."""
    from compressed_tensors.modeling.kvcache import KV_CACHE_ATTR
    attn = model.model.layers[layer].self_attn
    cache = getattr(attn, KV_CACHE_ATTR)
    seen = []

    def grab(_, args, kwargs):
        import inspect
        bound = inspect.signature(cache.forward).bind(*args, **kwargs)
        seen.append(bound.arguments["key_states"].detach().float().clone())
    handle = cache.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        model(torch.tensor([prompt], dtype=torch.long), use_cache=False)
    finally:
        handle.remove()
    assert len(seen) == 1, f"expected one cache update in layer {layer}, saw {len(seen)}"
    return seen[0][0].contiguous()


@torch.no_grad()
def logits_and_greedy(model, prompt):
    ids = torch.tensor([prompt], dtype=torch.long)
    logits = model(ids, use_cache=False).logits[0].float().clone()
    seq = list(prompt)
    greedy, margins = [], []
    for _ in range(N_GREEDY):
        lg = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        top2 = torch.topk(lg, 2)
        tok = int(top2.indices[0])
        greedy.append(tok)
        margins.append(float(top2.values[0] - top2.values[1]))
        seq.append(tok)
    return logits, torch.tensor(greedy, dtype=torch.long), torch.tensor(margins)


# ---------------------------------------------------------------------------
# (d) W4A4 emulation of one Linear with compressed-tensors' own fake quant

@torch.no_grad()
def w4a4_emulation(model, module_name, seed, rows=5):
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize
    mod = model.get_submodule(module_name)
    k = mod.in_features
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g, dtype=torch.float32)
    args = mod.quantization_scheme.input_activations
    x_fq = forward_quantize(mod, x.clone(), "input", args)
    w = mod.weight.float()
    y = x_fq @ w.t()
    if mod.bias is not None:
        y = y + mod.bias.float()
    igs = getattr(mod, "input_global_scale", None)
    return x, x_fq, y, (float(igs.reshape(-1)[0]) if igs is not None else None)


# checkpoint name -> runtime (linearized) module name, per architecture
MOE_RUNTIME_RENAMES = {
    "mixtral": [(".block_sparse_moe.", ".mlp.")],
    "granitemoe": [(".block_sparse_moe.router.layer.", ".block_sparse_moe.router.")],
}


def load_moe_fp32(src_dir, folder, model_key):
    """Logits model for a quantized MoE folder (transformers 5.x cannot load
    llm-compressor's per-expert MoE output: its fused expert params stay MISSING).

    Done by hand with the libraries' own pieces, mirroring what transformers'
    compressed-tensors integration does for dense models: load the bf16 source,
    linearize experts with llm-compressor's linearize_moe (per-expert nn.Linear,
    the module layout that was quantized), apply_quantization_config +
    ModelCompressor.compress_model (compressed parameter layout), load the
    saved tensors strictly, ModelCompressor.decompress_model, then .float().
    """
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from llmcompressor.modeling.moe.linearize import linearize_moe
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.bfloat16)
    linearize_moe(model)
    qc = QuantizationConfig.model_validate(
        json.load(open(os.path.join(folder, "config.json")))["quantization_config"])
    apply_quantization_config(model, qc)
    mc = ModelCompressor(quantization_config=qc)
    mc.compress_model(model)
    sd = load_file(os.path.join(folder, "model.safetensors"))
    ren = MOE_RUNTIME_RENAMES.get(model_key, [])
    sd2 = {}
    for k, v in sd.items():
        for a, b in ren:
            k = k.replace(a, b)
        sd2[k] = v
    r = model.load_state_dict(sd2, strict=False)
    if r.missing_keys or r.unexpected_keys:
        raise RuntimeError(f"MoE load mismatch: missing={r.missing_keys[:8]} "
                           f"unexpected={r.unexpected_keys[:8]}")
    mc.decompress_model(model)
    return model.float().eval()
