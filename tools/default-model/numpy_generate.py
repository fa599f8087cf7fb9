#!/usr/bin/env python3
"""Reference float32 forward pass of a Hugging Face LlamaForCausalLM checkpoint
in plain numpy, with greedy decoding.

It reads the folder written by gguf_to_hf.py (config.json, tokenizer.json,
model.safetensors with BF16/F16/F32 tensors) and follows the HF Llama
conventions exactly:

  * RMSNorm:  x / sqrt(mean(x^2) + eps) * w        (computed in float32)
  * RoPE:     NeoX / HF "rotate_half" layout: dimension i pairs with i + d/2,
              inv_freq[i] = theta^(-2i/d), applied to q and k of every head
  * attention: causal, grouped-query (query head h uses kv head h // (H/Hkv)),
              scale 1/sqrt(head_dim), softmax in float32
  * MLP:      down( silu(gate(x)) * up(x) )
  * logits:   final RMSNorm, then lm_head (or the embedding matrix when tied)

Examples:
  numpy_generate.py models/default-src --prompt "The capital of France is" --expect Paris
  numpy_generate.py models/default-src --ppl-text tools/default-model/roundtrip.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

SAFETENSORS_DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}


def load_safetensors_f32(path: Path) -> dict[str, np.ndarray]:
    """Read a .safetensors file into float32 arrays.

    Format: u64 little-endian header length N, N bytes of JSON
    {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
    then the data section; offsets are relative to the data section.
    """
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    n = int(raw[:8].view("<u8")[0])
    header = json.loads(bytes(raw[8 : 8 + n]).decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: unsupported dtype {dtype}")
        begin, end = info["data_offsets"]
        a = raw[base + begin : base + end].view(SAFETENSORS_DTYPES[dtype]).reshape(info["shape"])
        if dtype == "BF16":
            a = (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        out[name] = np.ascontiguousarray(a, dtype=np.float32)
    return out


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T for x of shape (T, in) and an HF weight w of shape (out, in).

    A single row goes through matrix-vector (gemv): OpenBLAS' threaded gemm on a
    1-row input is dominated by thread start-up cost on small machines.
    """
    if x.shape[0] == 1:
        return (w @ x[0])[None, :]
    return x @ w.T


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


class Llama:
    def __init__(self, model_dir: Path):
        cfg = json.loads((model_dir / "config.json").read_text())
        self.cfg = cfg
        self.n_layers = cfg["num_hidden_layers"]
        self.n_head = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // self.n_head
        self.eps = cfg["rms_norm_eps"]
        if cfg.get("rope_scaling"):
            raise ValueError("rope_scaling is not implemented in this reference")
        self.w = load_safetensors_f32(model_dir / "model.safetensors")
        self.embed = self.w["model.embed_tokens.weight"]
        self.lm_head = self.w.get("lm_head.weight")
        if self.lm_head is None:
            if not cfg.get("tie_word_embeddings", False):
                raise ValueError("lm_head.weight missing and embeddings are not tied")
            self.lm_head = self.embed
        half = self.head_dim // 2
        self.inv_freq = 1.0 / (cfg["rope_theta"] ** (np.arange(half, dtype=np.float64) * 2.0 / self.head_dim))
        self.cache: list[tuple[np.ndarray, np.ndarray]] = []

    def reset(self) -> None:
        self.cache = [
            (np.zeros((self.n_kv, 0, self.head_dim), np.float32), np.zeros((self.n_kv, 0, self.head_dim), np.float32))
            for _ in range(self.n_layers)
        ]

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x: (heads, T, d); HF rotate_half convention."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # (T, d/2)
        cos = np.cos(np.concatenate([ang, ang], axis=-1)).astype(np.float32)
        sin = np.sin(np.concatenate([ang, ang], axis=-1)).astype(np.float32)
        half = self.head_dim // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def forward(self, ids: list[int]) -> np.ndarray:
        """Run new tokens `ids` after what is in the KV cache; returns logits (T, vocab)."""
        t_new = len(ids)
        start = self.cache[0][0].shape[1]
        pos = np.arange(start, start + t_new)
        x = self.embed[np.asarray(ids)]  # (T, hidden)
        group = self.n_head // self.n_kv
        scale = 1.0 / np.sqrt(self.head_dim)
        # causal mask for the new block against cache + new tokens
        total = start + t_new
        mask = np.where(np.arange(total)[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)

        for layer in range(self.n_layers):
            p = f"model.layers.{layer}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
            q = linear(h, self.w[p + "self_attn.q_proj.weight"]).reshape(t_new, self.n_head, self.head_dim).transpose(1, 0, 2)
            k = linear(h, self.w[p + "self_attn.k_proj.weight"]).reshape(t_new, self.n_kv, self.head_dim).transpose(1, 0, 2)
            v = linear(h, self.w[p + "self_attn.v_proj.weight"]).reshape(t_new, self.n_kv, self.head_dim).transpose(1, 0, 2)
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            k_all = np.concatenate([self.cache[layer][0], k], axis=1)
            v_all = np.concatenate([self.cache[layer][1], v], axis=1)
            self.cache[layer] = (k_all, v_all)
            k_rep = np.repeat(k_all, group, axis=0)  # (H, total, d)
            v_rep = np.repeat(v_all, group, axis=0)
            att = softmax(q @ k_rep.transpose(0, 2, 1) * scale + mask)  # (H, T, total)
            o = (att @ v_rep).transpose(1, 0, 2).reshape(t_new, self.n_head * self.head_dim)
            x = x + linear(o, self.w[p + "self_attn.o_proj.weight"])

            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
            gate = linear(h, self.w[p + "mlp.gate_proj.weight"])
            up = linear(h, self.w[p + "mlp.up_proj.weight"])
            x = x + linear(silu(gate) * up, self.w[p + "mlp.down_proj.weight"])

        x = rms_norm(x, self.w["model.norm.weight"], self.eps)
        return linear(x, self.lm_head)

    def generate(self, ids: list[int], max_new: int, stop_ids: set[int]) -> list[int]:
        self.reset()
        logits = self.forward(ids)
        out: list[int] = []
        for _ in range(max_new):
            nxt = int(np.argmax(logits[-1]))
            if nxt in stop_ids:
                break
            out.append(nxt)
            logits = self.forward([nxt])
        return out

    def perplexity(self, ids: list[int]) -> float:
        self.reset()
        logits = self.forward(ids).astype(np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        nll = -logp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
        return float(np.exp(nll.mean()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="numpy reference forward pass + greedy decoding")
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--expect", help="exit 1 unless the continuation contains this string")
    ap.add_argument("--ppl-text", type=Path, help="also report perplexity on this text file")
    ap.add_argument("--ppl-max-tokens", type=int, default=256)
    args = ap.parse_args(argv)

    t0 = time.time()
    model = Llama(args.model_dir)
    tok = Tokenizer.from_file(str(args.model_dir / "tokenizer.json"))
    print(f"loaded {len(model.w)} tensors in {time.time() - t0:.1f}s")

    ids = tok.encode(args.prompt, add_special_tokens=False).ids
    stop = {model.cfg["eos_token_id"]} if isinstance(model.cfg["eos_token_id"], int) else set(model.cfg["eos_token_id"])
    t0 = time.time()
    new = model.generate(ids, args.max_new_tokens, stop)
    dt = time.time() - t0
    text = tok.decode(new, skip_special_tokens=False)
    print(f"prompt ids: {ids}")
    print(f"generated ids: {new}")
    print(f"prompt: {args.prompt!r}")
    print(f"continuation: {text!r}")
    print(f"{len(new)} tokens in {dt:.2f}s")

    if args.ppl_text:
        pids = tok.encode(args.ppl_text.read_text(encoding="utf-8"), add_special_tokens=False).ids[: args.ppl_max_tokens]
        print(f"perplexity on first {len(pids)} tokens of {args.ppl_text.name}: {model.perplexity(pids):.3f}")

    if args.expect is not None and args.expect not in text:
        print(f"FAIL: continuation does not contain {args.expect!r}", file=sys.stderr)
        return 1
    if args.expect is not None:
        print(f"OK: continuation contains {args.expect!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
