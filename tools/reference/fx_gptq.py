#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""GPTQ of one small layer by llm-compressor 0.14's own GPTQModifier code, for tests/quant/gptq_test.cpp.

Writes tests/data/gptq/{layer.safetensors,MANIFEST.json}:
  weight      BF16 [N, K]   the layer (seeded, N(0, (0.5/√K)²), a few outlier columns)
  x           BF16 [S·T, K] calibration inputs, S samples of T tokens (correlated channels with unequal scales, so
                            the Hessian is far from diagonal and activation order matters); GPTQ ran on the Hessian
                            LLMC accumulate_hessian built from them (float32), divided by S (prepare_batch)
  <scheme>.dq BF16 [N, K]   GPTQ's quantized-dequantized weight (LLMC quantize_weight, actorder "static", block 128,
                            dampening 0.01: the GPTQModifier defaults), as LLMC writes it back before compression
  <scheme>.scale, <scheme>.global_scale   the observer qparams GPTQ used (weight_observer.get_qparams())
  <scheme>.loss F32 [1]     LLMC's logged GPTQ loss
for scheme in nvfp4a16 (NVFP4A16 preset), mxfp4a16 (MXFP4A16), w4a16 (W4A16, group 128) and w4a16_g64
(W4A16 with group_size 64).
Run: tools/reference/.venv/bin/python tools/reference/fx_gptq.py   (CPU, seconds)
"""
import copy
import hashlib
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "gptq")
N, K, S, T = 48, 256, 4, 24
SEED = 20261202


def schemes():
    from compressed_tensors.quantization import preset_name_to_scheme
    out = {}
    for name, preset in (("nvfp4a16", "NVFP4A16"), ("mxfp4a16", "MXFP4A16"), ("w4a16", "W4A16")):
        out[name] = preset_name_to_scheme(preset, ["Linear"]).weights
    g64 = copy.deepcopy(out["w4a16"])
    g64.group_size = 64
    out["w4a16_g64"] = g64
    for args in out.values():
        args.actorder = "static"  # GPTQModifier's default (resolve_quantization_config)
    return out


def main():
    from llmcompressor.modifiers.gptq.gptq_quantize import quantize_weight
    from llmcompressor.modifiers.gptq.helpers import accumulate_hessian, make_empty_hessian
    from llmcompressor.observers import Observer
    from safetensors.torch import save_file
    import compressed_tensors
    import llmcompressor

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)
    weight = (torch.randn(N, K, generator=g) * (0.5 / K ** 0.5))
    weight[:, :: 37] *= 6.0  # outlier input channels
    weight = weight.to(torch.bfloat16)
    mix = torch.randn(K, K, generator=g) / K ** 0.5 + torch.eye(K)
    chan = torch.exp(torch.randn(K, generator=g))  # log-normal channel scales
    x = ((torch.randn(S * T, K, generator=g) @ mix) * chan).to(torch.bfloat16).float()  # bf16 values: half the bytes
    layer = torch.nn.Linear(K, N, bias=False)
    layer.weight.data = weight.clone()

    hessian = make_empty_hessian(layer, device=torch.device("cpu"))
    samples = torch.zeros(())
    for s in range(S):
        hessian, samples = accumulate_hessian(x[s * T:(s + 1) * T].unsqueeze(0), layer, hessian, samples)
    h = hessian / samples

    tensors = {"weight": weight.contiguous(), "x": x.to(torch.bfloat16).contiguous()}
    for name, args in schemes().items():
        obs = Observer.load_from_registry(args.observer or "memoryless_minmax", base_name="weight", args=args)
        obs(layer.weight)
        qp = obs.get_qparams()
        gs = qp["global_scale"]
        dq, losses, fallback = quantize_weight(
            weights=layer.weight.detach().unsqueeze(0), hessians=h.clone().unsqueeze(0),
            scale=qp["scale"].unsqueeze(0), zero_point=qp["zero_point"].unsqueeze(0),
            global_scale=gs.reshape(-1)[:1] if gs is not None else None,
            quant_args=args, blocksize=128, percdamp=0.01)
        assert not bool(fallback[0]), name
        # quantize_weight returns W.to(final_dtype) = BF16; what LLMC writes back is that BF16 tensor.
        tensors[f"{name}.dq"] = dq[0].contiguous()
        tensors[f"{name}.scale"] = qp["scale"].float().contiguous()
        if gs is not None:
            tensors[f"{name}.global_scale"] = gs.float().reshape(1).contiguous()
        tensors[f"{name}.loss"] = losses.float().reshape(1)

    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "layer.safetensors")
    save_file(tensors, path)
    manifest = {
        "what": "GPTQ of one layer by llm-compressor's quantize_weight with the GPTQModifier defaults",
        "made_by": "tools/reference/fx_gptq.py",
        "tool_versions": {"torch": torch.__version__, "llmcompressor": llmcompressor.__version__,
                          "compressed-tensors": compressed_tensors.__version__},
        "shape": {"N": N, "K": K, "samples": S, "tokens_per_sample": T}, "seed": SEED,
        "settings": {"block_size": 128, "dampening_frac": 0.01, "actorder": "static"},
        "schemes": {k: json.loads(v.model_dump_json()) for k, v in schemes().items()},
        "files": {"layer.safetensors": {"bytes": os.path.getsize(path),
                                        "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}},
    }
    with open(os.path.join(OUT, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
