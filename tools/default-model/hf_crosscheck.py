#!/usr/bin/env python3
"""Optional cross-check of models/default-src with torch + transformers.

Not run by scripts/get-default-model.sh: torch from PyPI is several GB.  To run it:

  python3 -m venv /tmp/hf-venv
  /tmp/hf-venv/bin/pip install torch transformers jinja2
  /tmp/hf-venv/bin/python tools/default-model/hf_crosscheck.py models/default-src

It loads the folder with AutoModelForCausalLM / AutoTokenizer, compares the logits
with the numpy reference (numpy_generate.py), compares tokenization with
tokenizer.json, and greedy-decodes a plain and a chat-template prompt.
"""

import sys
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import numpy_generate  # noqa: E402


def main() -> int:
    model_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "models/default-src")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ok = True

    enc = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        hf_logits = model(**enc).logits[0].numpy()
        out = model.generate(**enc, max_new_tokens=16, do_sample=False)
    text = tok.decode(out[0][enc.input_ids.shape[1] :])
    print(f"greedy: {text!r}")
    ok &= "Paris" in text

    ref = numpy_generate.Llama(model_dir)
    ref.reset()
    diff = float(np.abs(ref.forward(enc.input_ids[0].tolist()) - hf_logits).max())
    print(f"max |logit diff| numpy vs transformers: {diff:.2e}")
    ok &= diff < 1e-3

    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=40, do_sample=False)
    answer = tok.decode(out[0][enc.input_ids.shape[1] :], skip_special_tokens=False)
    print(f"chat answer: {answer!r}")
    ok &= "Paris" in answer

    text = (HERE / "roundtrip.txt").read_text(encoding="utf-8")
    same = tok(text).input_ids == Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text).ids
    print(f"AutoTokenizer ids == tokenizer.json ids: {same}")
    ok &= same

    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
