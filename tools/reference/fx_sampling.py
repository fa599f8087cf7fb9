"""Reference fixtures for src/runtime: the sampler's distribution and sliding-window perplexity / KLD.

Writes tests/data/sampling/sampling.json (read by tests/runtime/sampler_test.cpp) and
tests/data/sampling/perplexity.json (read by tests/runtime/perplexity_test.cpp).
Run from the repository root with the reference venv (tools/reference/setup.sh):

    OMP_NUM_THREADS=1 tools/reference/.venv/bin/python tools/reference/fx_sampling.py

Deterministic: every random draw comes from numpy.random.default_rng(SEED); torch runs fp32 on CPU with one
thread, so a rerun rewrites byte-identical files.

Sampling (sampling.json). Each case names a logits row, the previous tokens (prompt and output) and the
parameters; `probs` is the distribution the next token is drawn from, computed by:
  1. repetition_penalty: transformers' own RepetitionPenaltyLogitsProcessor over prompt + output ids;
  2. presence/frequency penalties: OpenAI's formula (API reference, "Parameter details" /
     "Frequency and presence penalties"): mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty,
     c[j] = how often j occurs in the output so far (not the prompt, as vLLM does), written here in numpy;
  3. transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, in the order
     GenerationMixin._get_logits_processor applies them (min_tokens_to_keep = 1);
  4. softmax in float64 of the float32 scores (filtered entries are -inf, so they get probability 0).
temperature 0 is greedy: `probs` is one-hot at the lowest id among the maximal penalized logits (torch.argmax).
A case is kept only when its result cannot depend on how ties or float rounding fall at a filter boundary: the
distribution is recomputed on the row with the vocabulary reversed (ties ordered the other way), and every
top-p cumulative sum must stay 1e-5 away from top_p; otherwise top_p is nudged down and the check repeated.
-inf logits are stored as indices in `neg_inf` (JSON has no infinity).

Perplexity (perplexity.json). A fixed seeded token list scored by transformers on tests/data/ref/llama-bf16
(bf16 checkpoint upcast to fp32) with the sliding-window recipe of the transformers guide "Perplexity of
fixed-length models": windows begin at 0, stride, 2*stride, ...; input_ids = tokens[begin:end], end =
min(begin + ctx, n); labels = input_ids with the first (end - prev_end) kept and the rest masked with -100;
model(input_ids, labels=labels).loss is the mean over the labels that survive the internal one-token shift.
total_nll = sum over windows of loss * (number of shifted labels != -100) -- the guide's own weight
(num_valid_tokens - batch_size) is one too small for every window after the first, whose label 0 is already
masked, so it is not used. The same NLL is recomputed per token from the logits in float64 as a check.
The base model is also scored with (ctx 64, stride 64) and (ctx 40, stride 24) in `base_layouts`.
KLD: the same windows through llama-nvfp4a16 (decompressed by transformers' compressed-tensors integration,
fx_golden.load_ct_fp32) and llama-bf16 (the base); per scored token KL(base || model) =
sum_v p_base(v) * (log p_base(v) - log p_model(v)) in float64, averaged; top-1 agreement = fraction of
scored tokens where both argmaxes are equal; `fragile` counts scored tokens where either model's top-2 logit
margin is below 1e-3 (where another fp32 implementation may legitimately pick the other argmax).
"""
import json
import math
import os
import sys

import numpy as np
import torch
from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                     TemperatureLogitsWarper, TopKLogitsWarper,
                                                     TopPLogitsWarper)

SEED = 20261129
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "sampling")
REF = os.path.join(ROOT, "tests", "data", "ref")


def f32(x):
    """Shortest text that reads back as the same float32."""
    x = float(np.float32(x))
    if x == 0.0:
        return 0
    for digits in range(6, 10):
        s = float(f"{x:.{digits}g}")
        if np.float32(s) == np.float32(x):
            return s
    return x


def f64(x):
    return float(f"{x:.12g}") if x != 0.0 else 0


# ---------------------------------------------------------------------------
# sampling

def make_rows(rng):
    """Logits rows: (name, float32 array with -inf entries)."""
    rows = []
    # vocab 7: two ties at the top, one tie lower down.
    r = np.array([1.5, 2.25, 2.25, -0.5, 0.75, -0.5, 2.0], dtype=np.float32)
    rows.append(("v7_ties", r))
    r = rng.normal(0, 2, 7).astype(np.float32)
    r[[1, 4]] = -np.inf
    rows.append(("v7_neg_inf", r))
    r = rng.normal(0, 2.5, 50).astype(np.float32)
    rows.append(("v50", r))
    r = rng.normal(0, 1.5, 50).astype(np.float32)
    r[[3, 17, 29]] = r[8]  # ties with a mid-ranked value
    r[rng.choice(50, 6, replace=False)] = -np.inf
    rows.append(("v50_ties_neg_inf", r))
    r = (rng.normal(0, 3, 1000)).astype(np.float32)
    rows.append(("v1000", r))
    r = np.round(rng.normal(0, 2, 1000) * 4).astype(np.float32) / 4  # quarter steps: many ties
    r[rng.choice(1000, 40, replace=False)] = -np.inf
    rows.append(("v1000_ties_neg_inf", r))
    return rows


def reference_probs(logits, prompt, output, p):
    """float64 probability vector of the next token (see the module docstring)."""
    scores = torch.from_numpy(logits.copy()).unsqueeze(0)  # [1, V] float32
    history = torch.tensor([list(prompt) + list(output)], dtype=torch.long)
    if p["repetition_penalty"] != 1.0 and history.numel() > 0:
        scores = RepetitionPenaltyLogitsProcessor(penalty=p["repetition_penalty"])(history, scores.clone())
    if p["presence_penalty"] != 0.0 or p["frequency_penalty"] != 0.0:
        mu = scores.numpy().astype(np.float64)
        counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=mu.shape[1])
        mu[0] -= counts * p["frequency_penalty"] + (counts > 0) * p["presence_penalty"]
        scores = torch.from_numpy(mu.astype(np.float32))
    if p["temperature"] == 0.0:
        onehot = np.zeros(scores.shape[1])
        onehot[int(torch.argmax(scores[0]))] = 1.0
        return onehot
    scores = TemperatureLogitsWarper(p["temperature"])(history, scores)
    if p["top_k"] > 0:
        scores = TopKLogitsWarper(top_k=p["top_k"], min_tokens_to_keep=1)(history, scores)
    if p["top_p"] < 1.0:
        scores = TopPLogitsWarper(top_p=p["top_p"], min_tokens_to_keep=1)(history, scores)
    if p["min_p"] > 0.0:
        scores = MinPLogitsWarper(min_p=p["min_p"], min_tokens_to_keep=1)(history, scores)
    s = scores[0].numpy().astype(np.float64)
    e = np.exp(s - s.max())
    return e / e.sum()


def top_p_margin(logits, prompt, output, p):
    """Smallest |cumulative - top_p| over the sorted distribution that top-p filters (inf when top-p is off)."""
    if p["top_p"] >= 1.0 or p["temperature"] == 0.0:
        return math.inf
    # top-p sees the distribution after penalties, temperature and top-k
    q = dict(p, top_p=1.0, min_p=0.0)
    probs = np.sort(reference_probs(logits, prompt, output, q))[::-1]
    return float(np.min(np.abs(np.cumsum(probs) - p["top_p"])))


def unambiguous_probs(logits, prompt, output, p):
    """Reference probs, nudging top_p until neither tie order nor rounding can change the kept set."""
    vocab = logits.shape[0]
    flip = lambda ids: [vocab - 1 - t for t in ids]
    if p["temperature"] == 0.0:  # greedy's tie rule (lowest id) is part of the contract
        return reference_probs(logits, prompt, output, p), p
    for _ in range(200):
        a = reference_probs(logits, prompt, output, p)
        b = reference_probs(logits[::-1].copy(), flip(prompt), flip(output), p)[::-1]
        if np.array_equal(a > 0, b > 0) and np.max(np.abs(a - b)) < 1e-7 and \
                top_p_margin(logits, prompt, output, p) > 1e-5:
            return a, p
        if p["top_p"] >= 1.0:
            raise RuntimeError(f"ambiguous case without top-p: {p}")
        p = dict(p, top_p=round(p["top_p"] - 0.005, 6))
    raise RuntimeError(f"no unambiguous top_p for {p}")


PARAMS = [  # (row, params); unspecified fields are off
    ("v7_ties", dict(temperature=0.0)),
    ("v7_ties", dict(temperature=1.0)),
    ("v7_ties", dict(temperature=0.7, top_k=2)),   # the top-2 tie
    ("v7_ties", dict(temperature=1.3, top_k=4)),
    ("v7_ties", dict(temperature=1.0, top_k=6)),   # the 6th value is tied with the 7th: both kept
    ("v7_ties", dict(temperature=1.0, top_p=0.6)),
    ("v7_ties", dict(temperature=1.0, min_p=0.5)),
    ("v7_ties", dict(temperature=0.0, repetition_penalty=1.3), [1], []),  # penalized tie → the other
    ("v7_neg_inf", dict(temperature=0.0)),
    ("v7_neg_inf", dict(temperature=0.8)),
    ("v7_neg_inf", dict(temperature=1.0, top_k=6)),  # k beyond the finite entries
    ("v7_neg_inf", dict(temperature=1.5, top_p=0.9, min_p=0.05)),
    ("v50", dict(temperature=1.0)),
    ("v50", dict(temperature=0.5, top_k=10)),
    ("v50", dict(temperature=1.2, top_p=0.8)),
    ("v50", dict(temperature=1.0, min_p=0.1)),
    ("v50", dict(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02)),
    ("v50", dict(temperature=1.0, repetition_penalty=1.5), "rand", "rand"),
    ("v50", dict(temperature=1.0, repetition_penalty=0.8), "rand", "rand"),
    ("v50", dict(temperature=1.0, presence_penalty=0.7, frequency_penalty=0.4), "rand", "rand"),
    ("v50", dict(temperature=0.8, presence_penalty=-0.5, frequency_penalty=1.2), "rand", "rand"),
    ("v50", dict(temperature=0.7, top_k=15, top_p=0.95, repetition_penalty=1.2, presence_penalty=0.3,
                 frequency_penalty=0.25), "rand", "rand"),
    ("v50", dict(temperature=0.0, repetition_penalty=1.4, frequency_penalty=0.5), "rand", "rand"),
    ("v50_ties_neg_inf", dict(temperature=1.0)),
    ("v50_ties_neg_inf", dict(temperature=0.0)),
    ("v50_ties_neg_inf", dict(temperature=1.0, top_k=12)),
    ("v50_ties_neg_inf", dict(temperature=0.6, top_p=0.7)),
    ("v50_ties_neg_inf", dict(temperature=1.0, min_p=0.3, repetition_penalty=1.25), "rand", "rand"),
    ("v1000", dict(temperature=1.0, top_k=40)),
    ("v1000", dict(temperature=0.8, top_p=0.9)),
    ("v1000", dict(temperature=1.1, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.5), "rand", "rand"),
    ("v1000", dict(temperature=1.0)),
    ("v1000_ties_neg_inf", dict(temperature=0.0)),
    ("v1000_ties_neg_inf", dict(temperature=1.0, top_k=30)),
    ("v1000_ties_neg_inf", dict(temperature=0.9, top_k=100, top_p=0.85, min_p=0.01, repetition_penalty=1.1),
     "rand", "rand"),
]
DEFAULTS = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                presence_penalty=0.0, frequency_penalty=0.0)


def sampling_fixture(rng):
    rows = make_rows(rng)
    by_name = {n: r for n, r in rows}
    cases = []
    for entry in PARAMS:
        row, params = entry[0], dict(DEFAULTS, **entry[1])
        logits = by_name[row]
        vocab = logits.shape[0]
        prompt = entry[2] if len(entry) > 2 else []
        output = entry[3] if len(entry) > 3 else []
        if prompt == "rand":
            prompt = [int(t) for t in rng.integers(0, vocab, 6)]
        if output == "rand":  # repeats, so frequency counts above 1 occur
            base = [int(t) for t in rng.integers(0, vocab, 5)]
            output = base + [base[0], base[0], base[2]]
        probs, params = unambiguous_probs(logits, prompt, output, params)
        cases.append({"row": row, "params": params, "prompt": prompt, "output": output,
                      "probs": [f64(x) for x in probs]})
    return {
        "generator": "tools/reference/fx_sampling.py",
        "seed": SEED,
        "rows": {n: {"logits": [0 if not np.isfinite(x) else f32(x) for x in r],
                     "neg_inf": [int(i) for i in np.flatnonzero(np.isneginf(r))]} for n, r in rows},
        "cases": cases,
    }


# ---------------------------------------------------------------------------
# perplexity and KLD

def windows(n, ctx, stride):
    prev_end = 0
    for begin in range(0, n, stride):
        end = min(begin + ctx, n)
        yield begin, end, prev_end
        prev_end = end
        if end == n:
            break


@torch.no_grad()
def hf_sliding_window(model, tokens, ctx, stride):
    """The guide's loop; returns total NLL, scored count and the per-window logits."""
    ids = torch.tensor([tokens], dtype=torch.long)
    total, count, per_window = 0.0, 0, []
    for begin, end, prev_end in windows(len(tokens), ctx, stride):
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        labels = input_ids.clone()
        labels[:, :-trg_len] = -100
        out = model(input_ids, labels=labels, use_cache=False)
        valid = int((labels[:, 1:] != -100).sum())
        total += float(out.loss) * valid
        count += valid
        per_window.append((begin, end, prev_end, out.logits[0].double().numpy()))
    return total, count, per_window


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def scored_rows(per_window, tokens):
    """(log-probs row, target) for every scored token, in order."""
    for begin, end, prev_end, logits in per_window:
        lp = log_softmax(logits)
        for i in range(max(prev_end, begin + 1), end):
            yield lp[i - 1 - begin], logits[i - 1 - begin], tokens[i]


def perplexity_fixture(rng):
    sys.path.insert(0, os.path.dirname(__file__))
    from fx_golden import load_ct_fp32
    ctx, stride, n = 64, 32, 150  # windows [0,64) [32,96) [64,128) [96,150): the last one is short
    vocab = 512
    tokens = [int(t) for t in rng.integers(3, vocab, n)]  # no special tokens
    bf16 = load_ct_fp32(os.path.join(REF, "llama-bf16"))
    nvfp4 = load_ct_fp32(os.path.join(REF, "llama-nvfp4a16"))
    total, count, base_windows = hf_sliding_window(bf16, tokens, ctx, stride)
    m_total, m_count, model_windows = hf_sliding_window(nvfp4, tokens, ctx, stride)
    # Independent check of the loss bookkeeping: per-token NLL from the logits.
    manual = -sum(lp[t] for lp, _, t in scored_rows(base_windows, tokens))
    assert abs(manual - total) < 1e-3 * abs(total), (manual, total)
    assert count == n - 1
    kld, agree, fragile, scored = 0.0, 0, 0, 0
    for (lp, lb, _), (lq, lm, _) in zip(scored_rows(base_windows, tokens), scored_rows(model_windows, tokens)):
        kld += float(np.sum(np.exp(lp) * (lp - lq)))
        agree += int(np.argmax(lp) == np.argmax(lq))
        margin = lambda x: float(np.diff(np.sort(x)[-2:])[0])
        fragile += int(min(margin(lb), margin(lm)) < 1e-3)
        scored += 1
    assert scored == count
    # More window layouts on the base model: non-overlapping windows (each window's first token unscored) and a
    # stride that does not divide the context.
    layouts = [{"context": ctx, "stride": stride, "total_nll": f64(total), "tokens_scored": count}]
    for c, s in ((64, 64), (40, 24)):
        t, k, _ = hf_sliding_window(bf16, tokens, c, s)
        layouts.append({"context": c, "stride": s, "total_nll": f64(t), "tokens_scored": k})
    return {
        "generator": "tools/reference/fx_sampling.py",
        "seed": SEED,
        "recipe": "transformers guide 'Perplexity of fixed-length models' (sliding window, labels of the "
                  "already-scored prefix masked with -100); total_nll = sum(loss * shifted valid labels)",
        "context": ctx,
        "stride": stride,
        "tokens": tokens,
        "base": {"fixture": "llama-bf16", "total_nll": f64(total), "tokens_scored": count,
                 "perplexity": f64(math.exp(total / count))},
        "model": {"fixture": "llama-nvfp4a16", "total_nll": f64(m_total), "tokens_scored": m_count,
                  "perplexity": f64(math.exp(m_total / m_count))},
        "base_layouts": layouts,
        "kld_vs_base": {"mean_kld": f64(kld / scored), "top1_agreement": f64(agree / scored),
                        "fragile_tokens": fragile},
    }


def main():
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(SEED)
    sampling = sampling_fixture(rng)
    with open(os.path.join(OUT, "sampling.json"), "w") as f:
        json.dump(sampling, f, separators=(",", ":"))
        f.write("\n")
    ppl = perplexity_fixture(rng)
    with open(os.path.join(OUT, "perplexity.json"), "w") as f:
        json.dump(ppl, f, indent=1)
        f.write("\n")
    for name in ("sampling.json", "perplexity.json"):
        print(name, os.path.getsize(os.path.join(OUT, name)), "bytes")
    print("base ppl", ppl["base"]["perplexity"], "model ppl", ppl["model"]["perplexity"], ppl["kld_vs_base"])


if __name__ == "__main__":
    main()
