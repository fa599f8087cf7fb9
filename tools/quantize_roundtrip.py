#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Round trip of `fp4serve quantize` through the reference tools.

For each scheme (nvfp4a16, w4a16) this script
  1. runs `fp4serve quantize` on the unquantized fixture tests/data/ref/llama-bf16 into a scratch folder and
     checks that model.safetensors and config.json are byte-identical to llm-compressor's
     tests/data/ref/llama-<scheme> (which is why the checkpoint itself is not committed a second time);
  2. (a) decompresses every quantized Linear of that output with compressed-tensors' own compressor
     (BaseCompressor.decompress, the code vLLM/transformers use) and writes the results to
     tests/data/quantized-by-fp4serve/<scheme>/reference_dequant.safetensors as SHA-256 digests plus sampled
     rows (tools/reference/slim_goldens.py: `dequant_sha256.<module>`, `dequant_rows.<module>`, ...). The C++
     test QuantizedByFp4serve.ReferenceDequantMatchesCompressedTensorsBitForBit checks that fp4serve's
     reference dequantizer (src/quant/dequant.h) reproduces them bit for bit, so CI needs no Python;
  3. (b) loads the output with transformers (compressed-tensors integration, dequantize=True), generates greedy
     tokens for the fixture prompts, and compares them with transformers running the bf16 source model whose
     Linear weights were replaced by the reference_dequant tensors. Both token lists are written to
     reference_outputs.json; the fp4serve side of (b) is added when the runtime lands.

Needs the reference venv (torch, transformers, compressed-tensors, safetensors):
    tools/reference/.venv/bin/python tools/quantize_roundtrip.py --fp4serve build/release/fp4serve
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
SCHEMES = ("nvfp4a16", "w4a16")
N_GREEDY = 16


def quantize(fp4serve, source, out, scheme):
    if os.path.exists(out):
        shutil.rmtree(out)
    subprocess.run([fp4serve, "quantize", "-m", source, "-o", out, "--scheme", scheme], check=True,
                   stderr=subprocess.DEVNULL)


def ct_decompress(folder):
    """{module: BF16/F16 tensor} from compressed-tensors' compressor of each config group."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    qc = QuantizationConfig.model_validate(json.load(open(os.path.join(folder, "config.json")))["quantization_config"])
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for scheme in qc.config_groups.values():
        comp = BaseCompressor.get_value_from_registry(CompressionFormat(scheme.format).value)
        names = comp.compression_param_names(scheme)
        modules = sorted(n[: -len(".weight_packed")] for n in tensors if n.endswith(".weight_packed"))
        for mod in modules:
            sd = {p: tensors[f"{mod}.{p}"] for p in names if f"{mod}.{p}" in tensors}
            out[mod] = comp.decompress(sd, scheme)["weight"].contiguous()
    return out


@torch.no_grad()
def greedy(model, prompt):
    seq = list(prompt)
    for _ in range(N_GREEDY):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        seq.append(int(torch.argmax(logits)))
    return seq[len(prompt):]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp4serve", default=os.path.join(ROOT, "build/release/fp4serve"))
    ap.add_argument("--source", default=os.path.join(ROOT, "tests/data/ref/llama-bf16"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/quantized-by-fp4serve"))
    args = ap.parse_args()

    import compressed_tensors
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    prompts = [p["ids"] for p in json.load(open(os.path.join(args.source, "MANIFEST.json")))["prompts"]]
    source_model = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.bfloat16).eval()
    source_tokens = [greedy(source_model, p) for p in prompts]
    import slim_goldens
    from test_data_xz import inflate  # the ref checkpoints are tracked as model.safetensors.xz
    for folder in [args.source] + [os.path.join(ROOT, "tests/data/ref", f"llama-{s}") for s in SCHEMES]:
        inflate(os.path.join(folder, "model.safetensors"))
    ok = True
    scratch = tempfile.mkdtemp(prefix="quantize_roundtrip-")
    for scheme in SCHEMES:
        out = os.path.join(args.out, scheme)
        os.makedirs(out, exist_ok=True)
        ckpt = os.path.join(scratch, scheme)
        quantize(args.fp4serve, args.source, ckpt, scheme)
        same_as_ref = all(filecmp.cmp(os.path.join(ckpt, f), os.path.join(ROOT, "tests/data/ref", f"llama-{scheme}", f),
                                      shallow=False) for f in ("model.safetensors", "config.json"))
        ok = ok and same_as_ref
        print(f"{scheme}: fp4serve's checkpoint byte-identical to tests/data/ref/llama-{scheme}: {same_as_ref}")
        deq = ct_decompress(ckpt)
        golden = {}
        for m, w in deq.items():
            slim_goldens.add_slim(golden, None, m, w, None)
        save_file(golden, os.path.join(out, "reference_dequant.safetensors"),
                  metadata={"generator": "tools/quantize_roundtrip.py",
                            "function": "compressed_tensors BaseCompressor.decompress",
                            "compressed-tensors": compressed_tensors.__version__})

        # (b) transformers loading our folder vs transformers running the source with our dequantized weights.
        loaded = AutoModelForCausalLM.from_pretrained(
            ckpt, dtype=torch.bfloat16, quantization_config=CompressedTensorsConfig(dequantize=True)).eval()
        dense = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.bfloat16).eval()
        params = dict(dense.named_parameters())
        for mod, w in deq.items():
            params[f"{mod}.weight"].data.copy_(w.to(torch.bfloat16))
        loaded_tokens = [greedy(loaded, p) for p in prompts]
        dense_tokens = [greedy(dense, p) for p in prompts]
        same = loaded_tokens == dense_tokens
        ok = ok and same
        agree = sum(a == b for x, y in zip(loaded_tokens, source_tokens) for a, b in zip(x, y))
        print(f"{scheme}: {len(deq)} linears decompressed; transformers(load our folder) == transformers(source + "
              f"our dequantized weights): {same}; agreement with the bf16 source: {agree}/{N_GREEDY * len(prompts)}")
        json.dump({"generator": "tools/quantize_roundtrip.py", "scheme": scheme,
                   "tool_versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                     "compressed-tensors": compressed_tensors.__version__},
                   "greedy_new_tokens": N_GREEDY,
                   "prompts": prompts,
                   "transformers_loaded_greedy": loaded_tokens,
                   "transformers_dense_with_reference_dequant_greedy": dense_tokens,
                   "bf16_source_greedy": source_tokens},
                  open(os.path.join(out, "reference_outputs.json"), "w"), indent=1)
        sizes = {f: os.path.getsize(os.path.join(out, f)) for f in sorted(os.listdir(out))}
        print(f"  {out}: " + ", ".join(f"{f} {s}" for f, s in sizes.items()))
    shutil.rmtree(scratch)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
