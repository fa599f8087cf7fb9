#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Perplexity of a checkpoint by the reference tools, to cross-check `fp4serve perplexity` on real models.

transformers loads the folder (compressed-tensors integration, dequantize=True: weights decompressed by
compressed-tensors, W4A4 activations fake-quantized by it inside the forward), the checkpoint's online transforms
are re-attached with compressed-tensors (fx_golden.attach_online_transforms: transformers drops them at load),
and the forward runs in fp32 over the first --tokens tokens of the text as ONE window (labels = inputs shifted),
which is what `fp4serve perplexity --ctx N --stride N --max-tokens N` computes.

--perturb EPS reruns the reference after multiplying the (tied) embedding table by (1 + EPS·N(0,1)), seed 0: a
measure of how far fp32 rounding-level differences move the figure. W4A4 activation fake quant is discontinuous,
so on a deep small model such a perturbation can flip many FP4 roundings and move the perplexity by percents.

    tools/reference/.venv/bin/python tools/reference/ppl_crosscheck.py -m models/default-nvfp4-had16 \
        -f /usr/share/common-licenses/GFDL-1.3 --tokens 512
    build/release/fp4serve perplexity -m models/default-nvfp4-had16 --activation-quant emulate \
        -f /usr/share/common-licenses/GFDL-1.3 --ctx 512 --stride 512 --max-tokens 512
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fx_golden  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--perturb", type=float, nargs="*", default=[])
    a = ap.parse_args()
    torch.set_num_threads(1)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    ids = tok.encode(open(a.file, encoding="utf-8").read()).ids[:a.tokens]
    model = fx_golden.load_ct_fp32(a.model)

    def perplexity():
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0].float()
        nll = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="sum").item()
        return math.exp(nll / (len(ids) - 1))

    print(f"{a.model}: reference perplexity {perplexity():.4f} over {len(ids) - 1} scored tokens")
    table = model.model.embed_tokens.weight
    original = table.data.clone()
    for eps in a.perturb:
        g = torch.Generator().manual_seed(0)
        table.data = original * (1 + eps * torch.randn(original.shape, generator=g))
        print(f"  embeddings perturbed by {eps:g} (relative): perplexity {perplexity():.4f}")
    table.data = original


if __name__ == "__main__":
    main()
