#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes an unquantized (bf16) Llama-family checkpoint as a compressed-tensors FP8 weight-only checkpoint, the
layout llm-compressor's FP8 W8A16 preset writes: every `*_proj.weight` of the decoder layers becomes an E4M3 tensor
(`float-quantized`) with a per-output-channel `weight_scale` [N, 1] in bf16, s = bf16(amax_row / 448), and
weight = E4M3(clamp(w / s, ±448)) (round to nearest even); everything else (embeddings, norms, the lm_head, which
the config ignores) is copied as it is. For measuring FP8 layers on the CPU at a real model's shapes
(docs/performance.md "FP8 layers on bf16 dot products"); the checkpoint runs wherever fp4serve runs FP8.

Needs torch and safetensors (e.g. the peer benchmark's venv, build/peer/venv). Single-file checkpoints only
(model.safetensors). The output folder is written to a temporary sibling and renamed at the end.

    build/peer/venv/bin/python tools/make_fp8_checkpoint.py models/default-src /tmp/default-fp8
"""
import argparse
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file

E4M3_MAX = 448.0


def quantize(weight):
    """(E4M3 codes, bf16 scale [N, 1]) of a [N, K] weight, per output channel."""
    w = weight.float()
    scale = (w.abs().amax(dim=1, keepdim=True) / E4M3_MAX).to(torch.bfloat16)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # an all-zero row keeps scale 1
    codes = (w / scale.float()).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="folder of the bf16 checkpoint (config.json, model.safetensors, tokenizer)")
    parser.add_argument("out", help="folder to write (must not exist)")
    args = parser.parse_args()
    if os.path.exists(args.out):
        sys.exit(f"{args.out} exists: refusing to overwrite it")
    weights_file = os.path.join(args.src, "model.safetensors")
    if not os.path.exists(weights_file):
        sys.exit(f"{weights_file} not found (only single-file checkpoints are supported)")
    config = json.load(open(os.path.join(args.src, "config.json")))
    if "quantization_config" in config:
        sys.exit(f"{args.src}/config.json already has a quantization_config: give an unquantized checkpoint")

    tmp = args.out.rstrip("/") + f".tmp{os.getpid()}"
    os.makedirs(tmp)
    try:
        for name in os.listdir(args.src):
            if name not in ("model.safetensors", "config.json") and os.path.isfile(os.path.join(args.src, name)):
                shutil.copy(os.path.join(args.src, name), tmp)
        tensors = load_file(weights_file)
        out = {}
        quantized = 0
        for name, tensor in tensors.items():
            if name.startswith("model.layers.") and name.endswith("_proj.weight") and tensor.dim() == 2:
                codes, scale = quantize(tensor)
                out[name] = codes
                out[name[: -len("weight")] + "weight_scale"] = scale
                quantized += 1
            else:
                out[name] = tensor
        if quantized == 0:
            sys.exit(f"no model.layers.*_proj.weight tensors in {weights_file}")
        save_file(out, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        weights = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False,
                   "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                   "observer_kwargs": {}}
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "version": "0.19.0",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": "float-quantized"}}}
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        os.rename(tmp, args.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"{args.out}: {quantized} FP8 layers")


if __name__ == "__main__":
    main()
