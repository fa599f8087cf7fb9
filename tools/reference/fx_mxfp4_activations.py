#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""MXFP4 activation fake quant as compressed-tensors computes it, on recorded and on edge-case activations.

Writes tests/data/mxfp4-activations/{fq.safetensors,MANIFEST.json}:
  recorded.<module>      F32 [T, K]  the input of <module> in the fp32 forward of the llama-bf16 reference fixture
                                     on prompt0 (forward pre-hooks; layer 0 q_proj, layer 1 gate_proj and
                                     down_proj: K = 256, 256, 512)
  recorded_fq.<module>   F32 [T, K]  compressed-tensors 0.19 `forward_quantize(module, x, "input", args)` with the
                                     MXFP4 preset's input_activations (float4, group 32, dynamic, uint8 scales)
  edge, edge_fq          F32 [R, 32·G] hand-made groups of 32 (one per row section, listed in MANIFEST "edge"):
                                     all zeros, +inf / -inf / NaN elements, subnormal and tiny amax (scale
                                     exponent clamped to 0, i.e. the subnormal scale 2^-127), huge amax (scale
                                     rounding to inf), the round_to_power_2 threshold (mantissa 1.75 exactly and
                                     one ulp below), every E2M1 tie and its neighbours, saturation above 6 steps,
                                     signed zeros; then their fake quant by the same call
  edge_scale_exponent    U8  [R·G]   the E8M0 exponent compressed-tensors' observer derives per group
                                     (`compute_dynamic_scales_and_zp` before `maybe_convert_from_mx_exp`, i.e.
                                     log2(scale) + 127)
Run: tools/reference/.venv/bin/python tools/reference/fx_mxfp4_activations.py   (CPU, a few seconds)
"""
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import test_data_xz  # noqa: E402

OUT = os.path.join(ROOT, "tests", "data", "mxfp4-activations")
SRC = os.path.join(ROOT, "tests", "data", "ref", "llama-bf16")
MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.down_proj"]


def mxfp4_args():
    from compressed_tensors.quantization import preset_name_to_scheme
    return preset_name_to_scheme("MXFP4", ["Linear"]).input_activations


def observed_linear():
    # A Linear in the state compressed-tensors' forward leaves it during inference (no input_global_scale:
    # MXFP4 activations have none).
    from compressed_tensors.quantization import QuantizationStatus
    mod = torch.nn.Linear(1, 1)
    mod.quantization_status = QuantizationStatus.FROZEN
    return mod


def fake_quant(x, args):
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize
    return forward_quantize(observed_linear(), x.clone(), "input", args)


def scale_exponents(x, args):
    """The E8M0 byte per group: compressed-tensors' own scale, back to log2 + 127."""
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp
    scale, _ = compute_dynamic_scales_and_zp(value=x, args=args, module=observed_linear())
    s = scale.double().reshape(-1)
    e = torch.where(torch.isinf(s), torch.full_like(s, 128.0), torch.log2(s))
    return (e + 127).round().to(torch.uint8)


def f32(bits):
    return np.array([bits], dtype=np.uint32).view(np.float32)[0].item()


def edge_groups():
    """(name, 32 floats) per group; values chosen around every boundary of the reference's math."""
    rng = np.random.default_rng(20261201)
    groups = []

    def base(scale=1.0):
        return (rng.standard_normal(32) * scale).astype(np.float32)

    groups.append(("zeros", np.zeros(32, np.float32)))
    z = np.zeros(32, np.float32)
    z[1::2] = -0.0
    groups.append(("signed zeros", z))
    for name, bad in (("+inf", np.inf), ("-inf", -np.inf), ("nan", np.nan)):
        g = base()
        g[5] = bad
        groups.append((f"one {name} element", g))
    g = base()
    g[0], g[1] = np.inf, -np.inf
    groups.append(("+inf and -inf", g))
    # amax just under / at 1.75·2^127 (the power-of-two rounding overflows to inf at 1.75·2^127).
    for name, amax in (("amax 1.75*2^127 - ulp", f32(0x7F5FFFFF)), ("amax 1.75*2^127", f32(0x7F600000)),
                       ("amax max float", f32(0x7F7FFFFF)), ("amax 2^127", f32(0x7F000000))):
        g = base() * np.float32(amax / 8)
        g[3] = amax
        groups.append((name, g.astype(np.float32)))
    # Tiny groups: the exponent 127 + e − 2 clamps at 0 (scale 2^-127, an fp32 subnormal).
    for name, amax in (("amax subnormal 2^-140", f32(0x00000200)), ("amax subnormal 0x5fffff", f32(0x005FFFFF)),
                       ("amax subnormal 0x600000 (rounds to 2^-126)", f32(0x00600000)), ("amax 2^-126", f32(0x00800000)),
                       ("amax 2^-125", f32(0x01000000)), ("amax 2^-124", f32(0x01800000)),
                       ("amax 1.7*2^-123", np.float32(1.7 * 2.0 ** -123)), ("amax 2^-120", np.float32(2.0 ** -120))):
        g = (rng.uniform(-1, 1, 32) * amax).astype(np.float32)
        g[7] = np.float32(amax)
        groups.append((name, g))
    # The round_to_power_2 threshold: mantissa 1.75 rounds up, one ulp below stays.
    for name, amax in (("amax 1.75 (rounds up)", np.float32(1.75)),
                       ("amax 1.75 - ulp", np.nextafter(np.float32(1.75), np.float32(0))),
                       ("amax 1.5", np.float32(1.5)), ("amax 3.9", np.float32(3.9)), ("amax 1.0", np.float32(1.0))):
        g = (rng.uniform(-1, 1, 32) * amax).astype(np.float32)
        g[11] = -amax
        groups.append((name, g))
    # E2M1 ties and neighbours on a known scale: amax 4 → p2 = 4, e = 127, scale 1; amax 8 → scale 2.
    for scale in (1.0, 2.0, 0.03125):
        ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
        vals = []
        for t in ties:
            v = np.float32(t * scale)
            vals += [v, np.nextafter(v, np.float32(0)), np.nextafter(v, np.float32(np.inf)), -v]
        # amax 5·scale+ulp has mantissa 1.25, which round_to_power_2 keeps: the group's scale stays `scale`.
        vals += list(rng.uniform(-3.9, 3.9, 32 - len(vals)) * scale)
        g = np.array(vals, np.float32)
        groups.append((f"E2M1 ties, scale {scale}", g))
    # Saturation: amax mantissa 1.7 → x/s reaches 6.8, clamped to 6.
    g = base()
    g[:4] = [6.8, -6.8, 6.2, -6.0]
    groups.append(("saturation (x/s > 6)", (g * np.float32(1.0)).astype(np.float32)))
    for i in range(6):
        groups.append((f"normal, scale 10^{i - 3}", base(10.0 ** (i - 3))))
    return groups


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    import compressed_tensors
    import transformers

    torch.manual_seed(0)
    torch.set_num_threads(1)
    args = mxfp4_args()
    test_data_xz.inflate(os.path.join(SRC, "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(SRC, dtype=torch.bfloat16).float().eval()
    ids = json.load(open(os.path.join(SRC, "MANIFEST.json")))["prompts"][0]["ids"]
    recorded = {}
    hooks = [model.get_submodule(m).register_forward_pre_hook(
        lambda mod, inp, name=m: recorded.__setitem__(name, inp[0][0].detach().clone())) for m in MODULES]
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()

    tensors = {}
    for m in MODULES:
        x = recorded[m].float().contiguous()
        tensors[f"recorded.{m}"] = x
        tensors[f"recorded_fq.{m}"] = fake_quant(x, args).contiguous()

    groups = edge_groups()
    per_row = 4
    while len(groups) % per_row:
        groups.append((f"padding normal {len(groups)}", (np.random.default_rng(len(groups)).standard_normal(32))
                       .astype(np.float32)))
    edge = torch.from_numpy(np.concatenate([g for _, g in groups]).reshape(-1, 32 * per_row).copy())
    tensors["edge"] = edge
    tensors["edge_fq"] = fake_quant(edge, args).contiguous()
    tensors["edge_scale_exponent"] = scale_exponents(edge, args).contiguous()

    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "fq.safetensors")
    save_file(tensors, path)
    manifest = {
        "what": __doc__.strip().splitlines()[0],
        "made_by": "tools/reference/fx_mxfp4_activations.py",
        "tool_versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                          "compressed-tensors": compressed_tensors.__version__},
        "args": json.loads(args.model_dump_json()),
        "recorded_from": {"fixture": "tests/data/ref/llama-bf16", "prompt_ids": ids, "modules": MODULES,
                          "forward": "AutoModelForCausalLM bf16 weights, .float(), forward pre-hook input"},
        "edge": {"groups_per_row": per_row, "groups": [n for n, _ in groups]},
        "nan_groups": int(torch.isnan(tensors["edge_fq"]).reshape(-1, 32).any(dim=1).sum()),
        "files": {"fq.safetensors": {"bytes": os.path.getsize(path), "sha256": digest(path)}},
    }
    with open(os.path.join(OUT, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes, "
          f"{manifest['nan_groups']} NaN groups of {len(groups)} edge groups")


if __name__ == "__main__":
    main()
