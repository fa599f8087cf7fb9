#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The default model quantized as an llm-compressor user would with QuIP: QuIPModifier with every default
(rotations ["v"], transform_type "random-hadamard", transform_block_size None = the full input width: 576 for
q/k/v/o/gate/up, 1536 for down_proj; precision float64), then NVFP4A16 on every Linear but lm_head.
For the prefill / perplexity speed figures of the online transforms (docs/performance.md "Online transforms: speed").

Run: tools/reference/.venv/bin/python tools/reference/quip_default_model.py [SRC] [OUT]
     (defaults models/default-src → models/default-quip-nvfp4a16; CPU, about a minute)
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "default-src")
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "models", "default-quip-nvfp4a16")
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform import QuIPModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(src)
    recipe = [QuIPModifier(targets="Linear", ignore=["lm_head"]),
              QuantizationModifier(targets="Linear", scheme="NVFP4A16", ignore=["lm_head"])]
    model = oneshot(model=model, recipe=recipe)
    tmp = out + ".tmp"
    model.save_pretrained(tmp, save_compressed=True)
    tok.save_pretrained(tmp)
    os.replace(tmp, out)
    print(out)


if __name__ == "__main__":
    main()
