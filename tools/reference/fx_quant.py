"""Producers of the quantized fixture checkpoints.

* llm-compressor `oneshot` + `QuantizationModifier(scheme=PRESET)` and
  `save_pretrained(save_compressed=True)` for every compressed-tensors variant.
* ModelOpt NVFP4 / W4A16_NVFP4: nvidia-modelopt itself (see fx_modelopt.py).
* GPT-OSS native MXFP4: written by this script per FORMATS.md §5, with the MXFP4
  codes and E8M0 scales computed by compressed-tensors' own MXFP4 quantizer.
"""
import json
import os
import shutil

import torch

# variant name -> preset scheme of compressed-tensors
CT_VARIANTS = {
    "nvfp4": "NVFP4",
    "nvfp4a16": "NVFP4A16",
    "mxfp4": "MXFP4",
    "mxfp4a16": "MXFP4A16",
    "w4a16": "W4A16",
    "w4a16-asym": "W4A16_ASYM",
    "fp8-dynamic": "FP8_DYNAMIC",
    "fp8-block": "FP8_BLOCK",
}

# variant name -> (llm-compressor transform modifier + kwargs, preset scheme applied after it).
# QuIP "v": online `input` transform + the inverse fused into the weight (`weight_input`) on every Linear
# but lm_head. "quip" uses the deterministic Sylvester Hadamard in 128-wide blocks (the FWHT path at run
# time); "quiprh" a random Hadamard in 32-wide blocks (a dense block-diagonal rotation). Full-width
# matrices are stored in float64 and would make the fixture too large.
TRANSFORM_VARIANTS = {
    "quip-nvfp4a16": ("QuIPModifier", {"rotations": ["v"], "transform_type": "hadamard",
                                       "transform_block_size": 128}, "NVFP4A16"),
    "quiprh-nvfp4a16": ("QuIPModifier", {"rotations": ["v"], "transform_type": "random-hadamard",
                                         "transform_block_size": 32}, "NVFP4A16"),
    # SpinQuant R1 + R2 (fused into the weights) + R4 (online `input` Hadamard of down_proj, fused inverse in
    # its weight).
    "spinquant-nvfp4a16": ("SpinQuantModifier", {"rotations": ["R1", "R2", "R4"], "transform_type": "hadamard",
                                                 "transform_block_size": 32},
                           "NVFP4A16"),
    # QuIP "v" with MXFP4 weights (E8M0 scales per 32): the 32-wide Sylvester Hadamard matches the scale group.
    "quip-mxfp4a16": ("QuIPModifier", {"rotations": ["v"], "transform_type": "hadamard",
                                       "transform_block_size": 32}, "MXFP4A16"),
    # QuIP "v" + "u": "u" fuses U into the weight's output side (`weight_output`) and applies its inverse
    # online to the Linear's output (`output`, bias included); random Hadamard, 32-wide blocks.
    "quipuv-nvfp4a16": ("QuIPModifier", {"rotations": ["v", "u"], "transform_type": "random-hadamard",
                                         "transform_block_size": 32}, "NVFP4A16"),
    # SpinQuant R1–R4 with random Hadamards: R3 rotates the post-RoPE queries (`q_attn`) and keys before the
    # KV cache (`k_cache`) per head. With an unquantized cache the two cancel in q·kᵀ, so the golden also
    # holds layer 0's cached keys (kcache.layer0.<prompt>).
    "spinquant-r3-nvfp4a16": ("SpinQuantModifier", {"rotations": ["R1", "R2", "R3", "R4"],
                                                    "transform_type": "random-hadamard",
                                                    "transform_block_size": 32}, "NVFP4A16"),
}

# Ignore lists as real recipes write them (lm_head + MoE routers).
MOE_IGNORE = ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$",
              "re:.*router.*"]


def calibration_dataset(tok_dir, n_samples, seq_len):
    """Token-id calibration set: consecutive chunks of GPL-3's text."""
    from datasets import Dataset
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    text = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()
    ids = tok.encode(text).ids
    need = n_samples * seq_len
    assert len(ids) >= need
    rows = [ids[i * seq_len:(i + 1) * seq_len] for i in range(n_samples)]
    return Dataset.from_dict({"input_ids": rows,
                              "attention_mask": [[1] * seq_len] * n_samples})


def load_for_calibration(src_dir, moe):
    from transformers import AutoModelForCausalLM
    if moe:
        from llmcompressor.modeling.moe.linearize import load_quantizable_moe
        with load_quantizable_moe(AutoModelForCausalLM):
            model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.bfloat16)
    model.eval()
    return model


def run_llmcompressor(src_dir, out_dir, scheme, moe, calib, transform=None):
    """oneshot + save_compressed. `transform` = (modifier class name, kwargs) of an
    llm-compressor transform modifier run before quantization. Returns the recipe
    text for the manifest."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoTokenizer

    ignore = MOE_IGNORE if moe else ["lm_head"]
    recipe = QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    if transform is not None:
        import llmcompressor.modifiers.transform as lt
        recipe = [getattr(lt, transform[0])(**transform[1]), recipe]
    model = load_for_calibration(src_dir, moe)
    tok = AutoTokenizer.from_pretrained(src_dir)
    model = oneshot(
        model=model, tokenizer=tok, dataset=calib, recipe=recipe,
        num_calibration_samples=len(calib), max_seq_length=len(calib[0]["input_ids"]),
        shuffle_calibration_samples=False, batch_size=1,
    )
    model.save_pretrained(out_dir, save_compressed=True)
    tok.save_pretrained(out_dir)
    return {
        "tool": "llmcompressor.oneshot",
        "modifier": "QuantizationModifier",
        "targets": "Linear",
        "scheme": scheme,
        "ignore": ignore,
        "num_calibration_samples": len(calib),
        "calibration_seq_len": len(calib[0]["input_ids"]),
        "calibration_tokens": len(calib) * len(calib[0]["input_ids"]),
        "calibration_text": "/usr/share/common-licenses/GPL-3, first tokens, consecutive chunks",
        "save": "model.save_pretrained(out, save_compressed=True)",
        "moe_loading": ("llmcompressor.modeling.moe.linearize.load_quantizable_moe"
                        if moe else None),
        "transform_modifier": ({"class": transform[0], "kwargs": transform[1]}
                               if transform else None),
    }


# ---------------------------------------------------------------------------
# GPT-OSS native MXFP4 (FORMATS.md §5)

def mxfp4_quantize_ct(w):
    """MXFP4-quantize a [rows, K] float tensor with compressed-tensors' own code.

    Returns (codes U8 [rows, K/2] packed low-nibble-first, e8m0 U8 [rows, K/32]).
    """
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8
    from compressed_tensors.quantization import QuantizationArgs, quantize
    from compressed_tensors.quantization.quant_scheme import MXFP4A16
    from compressed_tensors.quantization.utils import calculate_qparams
    args = QuantizationArgs.model_validate(MXFP4A16["weights"])
    w = w.to(torch.bfloat16)
    rows, k = w.shape
    g = w.reshape(rows, k // 32, 32)
    mn = torch.clamp(g.amin(dim=-1), max=0).float()
    mx = torch.clamp(g.amax(dim=-1), min=0).float()
    scale, _ = calculate_qparams(mn, mx, args)
    q = quantize(w, scale, None, args)  # FP4 values on the E2M1 grid
    codes = pack_fp4_to_uint8(q.float())
    e8m0 = scale.to(torch.uint8) if scale.dtype == torch.uint8 else _to_e8m0(scale)
    return codes, e8m0


def _to_e8m0(scale):
    # scale is a power of two (any float dtype) -> biased exponent byte
    e = torch.log2(scale.float()).round().to(torch.int32) + 127
    return e.clamp(0, 254).to(torch.uint8)
