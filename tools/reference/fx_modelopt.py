"""ModelOpt-format fixtures produced by nvidia-modelopt itself (CPU works):
mtq.quantize(model, <CFG>, forward_loop) + export_hf_checkpoint."""
import json
import os

import torch

MO_VARIANTS = {
    "modelopt-nvfp4": ("NVFP4_DEFAULT_CFG", "NVFP4"),
    "modelopt-w4a16-nvfp4": ("W4A16_NVFP4_CFG", "W4A16_NVFP4"),
}


def run_modelopt(src_dir, out_dir, variant, calib):
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoModelForCausalLM
    cfg_name, algo = MO_VARIANTS[variant]
    model = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.bfloat16).eval()
    rows = [torch.tensor([r["input_ids"]], dtype=torch.long) for r in calib]

    @torch.no_grad()
    def loop(m):
        for r in rows:
            m(r)

    mtq.quantize(model, getattr(mtq, cfg_name), forward_loop=loop)
    export_hf_checkpoint(model, export_dir=out_dir)
    return {
        "tool": "nvidia-modelopt: modelopt.torch.quantization.quantize + "
                "modelopt.torch.export.export_hf_checkpoint (on CPU)",
        "config": f"mtq.{cfg_name}",
        "expected_quant_algo": algo,
        "num_calibration_samples": len(rows),
        "calibration_seq_len": len(calib[0]["input_ids"]),
        "calibration_text": "/usr/share/common-licenses/GPL-3, first tokens, consecutive chunks",
    }


def to_ct_folder(mo_dir, ct_dir, algo):
    """Convert a ModelOpt NVFP4 folder to compressed-tensors naming with
    compressed-tensors' own ModelOptNvfp4Converter (1/weight_scale_2 ->
    weight_global_scale, 1/input_scale -> input_global_scale, weight ->
    weight_packed), so that transformers can load it for the logits golden."""
    import compressed_tensors
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import (
        ModelOptNvfp4Converter)
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme,
                                                 QuantizationStatus)
    from compressed_tensors.quantization.quant_scheme import NVFP4, NVFP4A16
    from safetensors.torch import load_file, save_file
    os.makedirs(ct_dir, exist_ok=True)
    cfg = json.load(open(os.path.join(mo_dir, "config.json")))
    ignore = list(cfg["quantization_config"].get("ignore", []))
    conv = ModelOptNvfp4Converter(ignore=ignore, targets=["Linear"])
    t = conv.process(load_file(os.path.join(mo_dir, "model.safetensors")))
    t = {k: (v.reshape(1) if v.dim() == 0 else v) for k, v in t.items()}
    save_file(t, os.path.join(ct_dir, "model.safetensors"), metadata={"format": "pt"})
    preset = NVFP4 if algo == "NVFP4" else NVFP4A16
    qc = QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(
            **preset, targets=["Linear"],
            format=CompressionFormat.nvfp4_pack_quantized.value)},
        ignore=ignore, format=CompressionFormat.nvfp4_pack_quantized.value,
        quantization_status=QuantizationStatus.COMPRESSED.value)
    q = qc.model_dump(exclude=["quant_method"])
    q.update({"quant_method": "compressed-tensors",
              "version": compressed_tensors.__version__,
              "sparsity_config": {}, "transform_config": {}})
    cfg["quantization_config"] = q
    json.dump(cfg, open(os.path.join(ct_dir, "config.json"), "w"), indent=2)
    for f in os.listdir(mo_dir):
        if f.startswith("tokenizer") or f == "generation_config.json":
            import shutil
            shutil.copy(os.path.join(mo_dir, f), ct_dir)
