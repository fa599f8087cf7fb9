"""GPT-OSS native MXFP4 checkpoint (quant_method "mxfp4"), written by this script.

No public tool writes this layout from a transformers model (OpenAI's checkpoints
were converted by transformers' convert_gpt_oss_weights_to_hf.py from the
original release), so the layout of FORMATS.md §5 is produced here by hand; the
FP4 codes and E8M0 scales themselves come from compressed-tensors' MXFP4
quantizer (fx_quant.mxfp4_quantize_ct). Reference dequant and logits come from
transformers' own mxfp4 integration (Mxfp4Config(dequantize=True)).
"""
import json
import os
import shutil

import torch

import fx_quant

NOT_CONVERT = ["model.layers.*.self_attn", "model.layers.*.mlp.router",
               "model.embed_tokens", "lm_head"]


def _blocks(w_out_in):
    """[E, N, K] float -> (blocks U8 [E, N, K/32, 16], scales U8 [E, N, K/32])."""
    e, n, k = w_out_in.shape
    codes, sc = fx_quant.mxfp4_quantize_ct(w_out_in.reshape(e * n, k))
    return codes.reshape(e, n, k // 32, 16).contiguous(), sc.reshape(e, n, k // 32).contiguous()


def make_native(src_dir, out):
    from safetensors.torch import load_file, save_file
    t = load_file(os.path.join(src_dir, "model.safetensors"))
    o = {}
    for name, v in t.items():
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            # transformers keeps x @ W layout [E, in, out]; on disk it is [E, out, in]
            b, s = _blocks(v.transpose(1, 2).float())
            o[name + "_blocks"] = b
            o[name + "_scales"] = s
        else:
            o[name] = v
    save_file(o, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    cfg["quantization_config"] = {"quant_method": "mxfp4",
                                  "modules_to_not_convert": NOT_CONVERT}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    p = os.path.join(src_dir, "generation_config.json")
    if os.path.exists(p):
        shutil.copy(p, out)
    return {
        "tool": "this script (tools/reference/fx_gptoss.py)",
        "layout": "FORMATS.md §5: experts.{gate_up,down}_proj_{blocks,scales} U8, "
                  "biases bf16, gate/up interleaved (rows 2i = gate, 2i+1 = up, as in "
                  "transformers' GptOssExperts), everything else bf16 from the source",
        "codes_and_scales": "compressed-tensors MXFP4A16 weight args: "
                            "calculate_qparams + quantize + pack_fp4_to_uint8",
        "quantization_config": cfg["quantization_config"],
        "note": "GPT-OSS native MXFP4 layout written by hand (no tool writes it from a "
                "transformers model); codes/scales computed by compressed-tensors.",
    }


def reference_dequant(folder):
    """transformers' own MXFP4 dequant (integrations.mxfp4.convert_moe_packed_tensors)
    of layer-0 experts, returned in on-disk orientation [E, out, in], bf16."""
    from safetensors.torch import load_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    t = load_file(os.path.join(folder, "model.safetensors"))
    out, info = {}, {}
    for proj in ("gate_up_proj", "down_proj"):
        base = f"model.layers.0.mlp.experts.{proj}"
        w = convert_moe_packed_tensors(t[base + "_blocks"], t[base + "_scales"],
                                       dtype=torch.bfloat16)
        # convert_moe_packed_tensors returns the transformers orientation [E, in, out]
        w = w.transpose(1, 2).contiguous()
        out[f"dequant.{base}"] = (w, "transformers.integrations.mxfp4."
                                  "convert_moe_packed_tensors(blocks, scales, bf16), "
                                  "transposed back to the on-disk [E, out, in] orientation")
    return out, info


def load_fp32(folder):
    from transformers import AutoModelForCausalLM, Mxfp4Config
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16,
                                             quantization_config=Mxfp4Config(dequantize=True))
    return m.float().eval()
