#!/usr/bin/env python3
"""Write tests/data/ref/README.md from the fixtures' MANIFEST.json files."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "data", "ref")

HEAD = """# Python reference fixtures

Tiny random-weight checkpoints quantized by the real producers (llm-compressor /
compressed-tensors, nvidia-modelopt) on CPU, with golden outputs of the reference
implementations. Regenerate everything with `tools/reference/make-fixtures.sh`
(creates `tools/reference/.venv` from `tools/reference/requirements.txt`).
Every folder has `MANIFEST.json` (tool versions, seed, recipe, prompt token ids,
every golden tensor described, quality vs the bf16 source, anything done by hand)
and `golden.safetensors`. All folders share the same tokenizer (`tokenizer.json`,
`tokenizer_config.json` with a ChatML template, vocab 512, ids 0/1/2 =
`<|endoftext|>`/`<|im_start|>`/`<|im_end|>`).

## Golden tensor names (golden.safetensors)

| name | dtype | shape | what |
|---|---|---|---|
| `prompt0`, `prompt1` | I64 | `[T]` (T = 14 and 16) | prompt token ids |
| `logits.promptN` | F32 | `[T, 512]` | transformers forward (fp32 on the reference-dequantized weights, activation fake-quant included for W4A4/FP8 schemes), all positions |
| `greedy.promptN` | I64 | `[8]` | 8 greedy tokens after the prompt (argmax, full recompute, no EOS stop) |
| `greedy_margin.promptN` | F32 | `[8]` | top-1 minus top-2 logit at each greedy step (how fragile the step is) |
| `dequant_sha256.<module>` | U8 | `[32]` | SHA-256 of the bytes (row-major, little-endian, BF16) of the reference dequantization of each quantized Linear of layer 0 (MoE: every expert of layer 0); compressed-tensors decompress for CT folders, ModelOpt `NVFP4QTensor.dequantize` for ModelOpt folders, transformers `convert_moe_packed_tensors` for GPT-OSS (`model.layers.0.mlp.experts.{gate_up_proj,down_proj}`, `[E, out, in]`, on-disk orientation) |
| `dequant_shape.<module>` | I64 | `[ndim]` | shape of that reference tensor (`[N, K]`, GPT-OSS `[E, out, in]`) |
| `dequant_row_index.<module>` | I64 | `[8]` | rows of the tensor viewed as `[prod(shape[:-1]), K]`: first, last, 6 drawn with numpy `default_rng(seed = first 8 bytes of sha256(module name), little-endian)`, sorted |
| `dequant_rows.<module>` | BF16 | `[8, K]` | those rows, exact (they show which values differ when the digest does not match) |
| `w4a4.x` | F32 | `[5, K]` | seeded activation for `model.layers.0.self_attn.q_proj` (W4A4 folders only) |
| `w4a4.x_fq` | F32 | `[5, K]` | `x` after compressed-tensors' activation fake quant (`forward_quantize`) |
| `w4a4.y` | F32 | `[5, N]` | `x_fq @ dequant(q_proj).T` |

The reference dequantizations used to be stored whole (`dequant.<module>`, BF16, 17 MiB over
all folders); since the tests only ever compare them bit for bit, a SHA-256 of the bytes is as
strict a check. `tools/reference/slim_goldens.py` defines the stored form, and converts
goldens written in the old form in place (byte-identical to regenerating the fixture).

Each `model.safetensors` is tracked as `model.safetensors.xz` and inflated next to it by
the build (target `fp4serve_test_data`, or `python3 tools/test_data_xz.py inflate`; see
`tests/data/README.md`); MANIFEST.json describes the plain file, the sizes below count the
compressed one.

## Fixtures

| fixture | arch | variant | producer | size | golden |
|---|---|---|---|---|---|
"""


def main():
    rows = []
    total = 0
    for fx in sorted(os.listdir(REF)):
        mp = os.path.join(REF, fx, "MANIFEST.json")
        if not os.path.exists(mp):
            continue
        m = json.load(open(mp))
        files = os.listdir(os.path.join(REF, fx))
        # a file stored xz-compressed (X.xz tracked, X inflated by the build) counts once, compressed
        size = sum(os.path.getsize(os.path.join(REF, fx, f)) for f in files if f + ".xz" not in files)
        total += size
        g = m["golden"]
        nd = sum(1 for k in g if k.startswith("dequant_sha256."))
        parts = []
        if nd:
            parts.append(f"dequant ×{nd}")
        parts.append("logits, greedy")
        if "w4a4.y" in g:
            parts.append("w4a4")
        rows.append(f"| `{fx}` | {m['architecture']} | {m['variant']} | {m['producer']} "
                    f"| {size / 1024:.0f} KiB | {', '.join(parts)} |")
    body = HEAD + "\n".join(rows) + f"\n\nTotal: {total / 1024 / 1024:.1f} MiB in {len(rows)} fixtures.\n"
    body += NOTES
    with open(os.path.join(REF, "README.md"), "w") as f:
        f.write(body)
    print(f"README: {len(rows)} fixtures, {total} bytes")


NOTES = """
## Notes

* Tool-written files are kept as written (`recipe.yaml` is llm-compressor's).
* MoE (llm-compressor 0.14.0.1 + transformers 5.17): experts are linearized by
  llm-compressor and saved per expert as `…experts.<e>.{gate_proj,up_proj,down_proj}`,
  also for Mixtral (not `w1/w3/w2`) and GraniteMoE (not fused `input_linear/output_linear`),
  while the module prefix and the `ignore` list use checkpoint naming
  (`block_sparse_moe.gate`, `block_sparse_moe.router`). transformers 5.17 cannot
  load these per-expert quantized files, so MoE logits were computed with the
  libraries' pieces by hand (see each MANIFEST's `done_by_hand`).
* ModelOpt folders come from nvidia-modelopt itself (`mtq.quantize` +
  `export_hf_checkpoint`, on CPU) from the same bf16 source as `llama-bf16`.
* GPT-OSS native MXFP4 is written by `tools/reference/fx_gptoss.py` (layout of
  FORMATS.md §5; codes and scales computed by compressed-tensors).
* `tools/reference/check_fixtures.py` re-derives every dequant digest from the raw
  safetensors bytes with a float64 numpy implementation of docs FORMATS.md and with a
  fresh run of the reference code. Result (2026-11-29, 37 folders): 307 tensors, 293
  bit-exact, 14 (the ModelOpt folders) equal except that ModelOpt decodes FP4 code
  0x8 as +0.0 where FORMATS.md §0.1 (and compressed-tensors) give -0.0; the fresh
  reference run matches all 307 digests.
* ModelOpt vs compressed-tensors op order: converting ModelOpt's `weight_scale_2` to
  CT's `weight_global_scale = 1/weight_scale_2` and dequantizing the CT way (s / gs)
  gives different bf16 values from ModelOpt's own s * weight_scale_2 for 8736
  elements of llama-modelopt-nvfp4 (whole model); see MANIFEST `recipe`.
* All models use untied `lm_head` (tied tiny random models only repeat the last token).
"""

if __name__ == "__main__":
    main()
