#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""CPU time of transformers' fp32 forward for `fp4serve perplexity`'s sliding windows (the issue-17 comparison).

Runs the Hugging Face folder in fp32 (PyTorch, --threads threads) over the first --tokens tokens of the text in
windows of --ctx tokens every --stride tokens, scoring each token once as `fp4serve perplexity --ctx C --stride S
--max-tokens N` does (the first window all of its tokens, later windows their last `stride`), and prints the
perplexity and the process CPU time of the forwards (model load excluded). A bf16 source and its NVFP4 / MXFP4
checkpoints decompressed to fp32 cost transformers the same FLOPs, so the source stands for both.

    tools/reference/.venv/bin/python tools/reference/ppl_cpu_time.py -m models/default-src \
        -f /usr/share/common-licenses/GFDL-1.3
    /usr/bin/time -f '%U s user' build/release/fp4serve perplexity -m models/default-nvfp4 \
        -f /usr/share/common-licenses/GFDL-1.3 --ctx 512 --stride 256 --max-tokens 2048 --threads 1
"""
import argparse
import math
import os
import time

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    with open(a.file, encoding="utf-8") as f:
        ids = tok.encode(f.read()).ids[:a.tokens]
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).eval()
    cpu0 = time.process_time()
    nll, scored, start = 0.0, 0, 0
    with torch.no_grad():
        while True:
            window = torch.tensor([ids[start:start + a.ctx]])
            logits = model(window, use_cache=False).logits[0]
            # Predictions of tokens not scored by an earlier window: all of the first, the last `stride` after.
            first = 0 if start == 0 else window.shape[1] - a.stride - 1
            nll += torch.nn.functional.cross_entropy(logits[first:-1], window[0, first + 1:], reduction="sum").item()
            scored += window.shape[1] - 1 - first
            if start + a.ctx >= len(ids):
                break
            start += a.stride
    cpu = time.process_time() - cpu0
    print(f"{a.model}: transformers fp32 perplexity {math.exp(nll / scored):.4f} over {scored} scored tokens; "
          f"forward CPU time {cpu:.2f} s ({a.threads} thread(s))")


if __name__ == "__main__":
    main()
