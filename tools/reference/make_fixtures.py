#!/usr/bin/env python3
"""Regenerate the Python reference fixtures under tests/data/ref/.

Usage (from the repo root, inside tools/reference/.venv):
  python tools/reference/make_fixtures.py                 # everything
  python tools/reference/make_fixtures.py --only llama-nvfp4 qwen2-nvfp4
  python tools/reference/make_fixtures.py --list

Each fixture is produced in its own subprocess (llm-compressor keeps global
session state), single-threaded, with fixed seeds.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "ref")
BUILD = os.environ.get("FX_BUILD", os.path.join(HERE, ".venv", "fixture-build"))  # scratch, git-ignored
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import test_data_xz  # noqa: E402

BASE_SEED = 20251129
W4A4_SEED = 4242
CALIB_SAMPLES, CALIB_LEN = 8, 64  # 512 calibration tokens

CT4 = ["nvfp4", "nvfp4a16"]
MOE_VARIANTS = ["bf16", "nvfp4", "nvfp4a16", "mxfp4a16"]
PLAN = {
    "llama": ["bf16", "nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "w4a16", "w4a16-asym",
              "fp8-dynamic", "fp8-block", "modelopt-nvfp4", "modelopt-w4a16-nvfp4",
              "quip-nvfp4a16", "quiprh-nvfp4a16", "spinquant-nvfp4a16", "quipuv-nvfp4a16",
              "spinquant-r3-nvfp4a16", "quip-mxfp4a16"],
    # llama-i352-nvfp4a16 and gptoss-bf16 were dropped to keep tests/data/ref < 40 MB
    "llama-i352": ["nvfp4", "mxfp4a16"],
    "qwen2": CT4,
    "qwen3": CT4,
    "granite": CT4,
    "mixtral": MOE_VARIANTS,
    "qwen3moe": MOE_VARIANTS,
    "granitemoe": MOE_VARIANTS,
    "gptoss": ["mxfp4-native"],
}
PACKAGES = ["torch", "transformers", "compressed-tensors", "llmcompressor", "safetensors",
            "numpy", "ml_dtypes", "tokenizers", "gguf", "nvidia-modelopt", "accelerate",
            "datasets"]


def all_fixtures():
    return [f"{m}-{v}" for m, vs in PLAN.items() for v in vs]


def split(fx):
    for m in sorted(PLAN, key=len, reverse=True):
        if fx.startswith(m + "-") and fx[len(m) + 1:] in PLAN[m]:
            return m, fx[len(m) + 1:]
    raise SystemExit(f"unknown fixture {fx}")


def versions():
    from importlib.metadata import version
    out = {"python": sys.version.split()[0]}
    for p in PACKAGES:
        try:
            out[p] = version(p)
        except Exception:
            out[p] = None
    return out


def setup_determinism():
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------------------
# shared pieces: tokenizer, prompts, source models

def tok_dir():
    return os.path.join(BUILD, "tokenizer")


def ensure_tokenizer():
    import fx_tokenizer
    from fx_models import VOCAB
    meta = os.path.join(tok_dir(), "tokenizer_meta.json")
    if not os.path.exists(meta):
        info = fx_tokenizer.build(tok_dir(), VOCAB)
        json.dump(info, open(meta, "w"), indent=2)
    return json.load(open(meta))


def prompts():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tok_dir())
    p0_text = "This License applies to any program or other work"
    p0 = tok(p0_text, add_special_tokens=False).input_ids[:16]
    msgs = [{"role": "user", "content": "Hi"}]
    p1 = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if isinstance(p1, dict) or hasattr(p1, "keys"):
        p1 = p1["input_ids"]
    p1 = list(p1)
    assert 8 <= len(p0) <= 16 and 8 <= len(p1) <= 16, (len(p0), len(p1))
    return [
        {"name": "prompt0", "text": p0_text, "ids": p0},
        {"name": "prompt1", "text": "chat template, user: 'Hi', add_generation_prompt=True",
         "ids": p1},
    ]


def copy_tokenizer(dst):
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir(), f), os.path.join(dst, f))
    for f in ("chat_template.jinja", "special_tokens_map.json"):
        p = os.path.join(dst, f)
        if os.path.exists(p):
            os.remove(p)


def src_dir(model):
    return os.path.join(BUILD, f"src-{model}")


def ensure_source(model):
    """Build the bf16 source model; search seeds until greedy is not degenerate."""
    import torch
    import fx_golden
    import fx_models
    d = src_dir(model)
    meta = os.path.join(d, "source_meta.json")
    if os.path.exists(meta):
        return json.load(open(meta))
    ps = prompts()
    for attempt in range(50):
        seed = BASE_SEED + 1000 * list(PLAN).index(model) + attempt
        m = fx_models.build_model(model, seed)
        mf = fx_models.build_model(model, seed).float()
        ok = True
        for p in ps:
            _, g, _ = fx_golden.logits_and_greedy(mf, p["ids"])
            if len(set(g.tolist())) < 3:
                ok = False
        if ok:
            break
    else:
        raise RuntimeError(f"no non-degenerate seed for {model}")
    if os.path.exists(d):
        shutil.rmtree(d)
    m.save_pretrained(d)
    copy_tokenizer(d)
    info = {"seed": seed, "attempts": attempt + 1,
            "init": fx_models.init_weights.__doc__.strip(),
            "arch": fx_models.MODELS[model]["cls"],
            "config": fx_models.MODELS[model]["kwargs"]}
    json.dump(info, open(meta, "w"), indent=2, default=str)
    # bf16 reference logits of the unquantized source (fp32 forward)
    ref = {}
    mload = fx_golden.load_ct_fp32(d)  # as loaded from disk (fresh fp32 rope buffers)
    for p in ps:
        lg, _, _ = fx_golden.logits_and_greedy(mload, p["ids"])
        ref[p["name"]] = lg
    torch.save(ref, os.path.join(d, "ref_logits.pt"))
    return info


# ---------------------------------------------------------------------------

def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def make_one(fx):
    import torch
    import fx_golden
    import fx_models
    import fx_quant
    import slim_goldens
    setup_determinism()
    model, variant = split(fx)
    tok_info = ensure_tokenizer()
    src_info = ensure_source(model)
    moe = fx_models.MODELS[model]["moe"]
    ps = prompts()
    out = os.path.join(OUT, fx)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    calib = fx_quant.calibration_dataset(tok_dir(), CALIB_SAMPLES, CALIB_LEN)
    manual = []
    golden, gdoc = {}, {}
    w4a4_module = None
    producer = None

    if variant == "bf16":
        for f in os.listdir(src_dir(model)):
            if f.endswith((".json", ".safetensors")) and f != "source_meta.json":
                shutil.copy(os.path.join(src_dir(model), f), out)
        recipe = {"tool": "transformers save_pretrained of the random-init source model "
                          "(no quantization)"}
        producer = "transformers"
        lmodel = fx_golden.load_ct_fp32(out)
    elif variant in fx_quant.CT_VARIANTS or variant in fx_quant.TRANSFORM_VARIANTS:
        transform = None
        if variant in fx_quant.TRANSFORM_VARIANTS:
            tclass, tkwargs, scheme = fx_quant.TRANSFORM_VARIANTS[variant]
            transform = (tclass, tkwargs)
        else:
            scheme = fx_quant.CT_VARIANTS[variant]
        recipe = fx_quant.run_llmcompressor(src_dir(model), out, scheme, moe, calib, transform)
        producer = "llm-compressor"
        deq, info = fx_golden.ct_dequant(out)
        for mod, w in deq.items():
            slim_goldens.add_slim(golden, gdoc, mod, w, dict(info[mod], what=(
                "compressed-tensors reference decompression (BaseCompressor registry "
                f"-> {info[mod]['compressor']}.decompress) of {mod}, native output dtype")))
        if moe:
            lmodel = fx_golden.load_moe_fp32(src_dir(model), out, model)
            manual.append(fx_golden.load_moe_fp32.__doc__.strip())
        else:
            lmodel = fx_golden.load_ct_fp32(out)
        if transform is not None:
            manual.append(" ".join(fx_golden.attach_online_transforms.__doc__.split()))
        if scheme in ("NVFP4", "MXFP4"):
            w4a4_module = "model.layers.0.self_attn.q_proj"
    elif variant.startswith("modelopt-"):
        import fx_modelopt
        recipe = fx_modelopt.run_modelopt(src_dir(model), out, variant, calib)
        producer = "nvidia-modelopt"
        algo = json.load(open(os.path.join(out, "hf_quant_config.json")))[
            "quantization"]["quant_algo"]
        recipe["quant_algo_written"] = algo
        deq, info = fx_golden.modelopt_dequant(out)
        for mod, w in deq.items():
            slim_goldens.add_slim(golden, gdoc, mod, w, dict(info[mod], what=(
                "nvidia-modelopt reference dequantization NVFP4QTensor.dequantize("
                "scale=weight_scale, double_scale=weight_scale_2, block 16) -> bf16")))
        ctdir = os.path.join(BUILD, f"ctconv-{fx}")
        if os.path.exists(ctdir):
            shutil.rmtree(ctdir)
        fx_modelopt.to_ct_folder(out, ctdir, algo)
        ctdeq, _ = fx_golden.ct_dequant(ctdir, keep=lambda n: True)
        lmodel = fx_golden.load_ct_fp32(ctdir)
        # use ModelOpt's own dequant for every quantized Linear of the model
        modeq, _ = fx_golden.modelopt_dequant(out, keep=lambda n: True)
        ndiff = 0
        with torch.no_grad():
            for mod, w in modeq.items():
                ndiff += int((ctdeq[mod].view(torch.int16) != w.view(torch.int16)).sum())
                lmodel.get_submodule(mod).weight.copy_(w.float())
        recipe["ct_vs_modelopt_dequant_mismatching_elements"] = ndiff
        manual.append(
            "logits/greedy: the ModelOpt folder was converted to compressed-tensors naming "
            "with compressed-tensors' ModelOptNvfp4Converter (scratch copy, not shipped), "
            "loaded with transformers from_pretrained, and every quantized Linear weight was "
            "then overwritten with nvidia-modelopt's NVFP4QTensor.dequantize output; "
            + ("activations are fake-quantized by compressed-tensors with "
               "input_global_scale = 1/input_scale." if algo == "NVFP4" else
               "no activation quantization (W4A16)."))
        manual.append(f"bf16 elements where CT dequant of the converted checkpoint differs "
                      f"from ModelOpt's dequant (whole model): {ndiff}")
        if algo == "NVFP4":
            w4a4_module = "model.layers.0.self_attn.q_proj"
    elif variant == "mxfp4-native":
        import fx_gptoss
        recipe = fx_gptoss.make_native(src_dir(model), out)
        producer = "this script (fx_gptoss.py) per FORMATS.md §5"
        manual.append(recipe["note"])
        deq, info = fx_gptoss.reference_dequant(out)
        for k, (w, what) in deq.items():
            slim_goldens.add_slim(golden, gdoc, k[len("dequant."):], w, dict(
                what=what, dtype=str(w.dtype).replace("torch.", ""), shape=list(w.shape)))
        lmodel = fx_gptoss.load_fp32(out)
    else:
        raise SystemExit(variant)

    copy_tokenizer(out)

    # (b)(c) logits + greedy
    ref = torch.load(os.path.join(src_dir(model), "ref_logits.pt"))
    quality = {}
    for p in ps:
        n = p["name"]
        lg, g, marg = fx_golden.logits_and_greedy(lmodel, p["ids"])
        golden[n] = torch.tensor(p["ids"], dtype=torch.long)
        golden[f"logits.{n}"] = lg
        golden[f"greedy.{n}"] = g
        golden[f"greedy_margin.{n}"] = marg.float()
        gdoc[n] = {"what": f"token ids of {n} ({p['text']})", "dtype": "int64",
                   "shape": [len(p["ids"])]}
        gdoc[f"logits.{n}"] = {"what": f"fp32 logits of transformers' forward over {n} "
                               "(all positions, no cache)", "dtype": "float32",
                               "shape": list(lg.shape)}
        gdoc[f"greedy.{n}"] = {"what": f"greedy continuation of {n}: {fx_golden.N_GREEDY} "
                               "argmax steps, full recompute each step, no EOS stop",
                               "dtype": "int64", "shape": [fx_golden.N_GREEDY]}
        gdoc[f"greedy_margin.{n}"] = {"what": "top1 - top2 logit at each greedy step "
                                      "(small = fragile)", "dtype": "float32",
                                      "shape": [fx_golden.N_GREEDY]}
        r = ref[n]
        quality[n] = {
            "top1_agreement_vs_bf16_source": float((r.argmax(-1) == lg.argmax(-1))
                                                   .float().mean()),
            "max_abs_logit_diff_vs_bf16_source": float((r - lg).abs().max()),
            "greedy": g.tolist(),
            "min_greedy_margin": float(marg.min()),
        }

    # (e) keys as the reference KV cache stores them, when an online `k_cache` transform rotates them
    tcfg = json.load(open(os.path.join(out, "config.json"))).get("quantization_config", {}).get(
        "transform_config") or {}
    if any(a["location"] == "k_cache" for g in tcfg.get("config_groups", {}).values() for a in g["apply"]):
        for p in ps:
            n = p["name"]
            kc = fx_golden.cached_keys(lmodel, p["ids"])
            golden[f"kcache.layer0.{n}"] = kc
            gdoc[f"kcache.layer0.{n}"] = {
                "what": f"layer 0 key states handed to the KV cache for {n} (post-RoPE, after the online "
                        "k_cache transform), captured by a forward pre-hook on compressed-tensors' "
                        "QuantizedKVCache registered after the transform hook",
                "dtype": "float32", "shape": list(kc.shape)}

    # (d) W4A4 emulation
    if w4a4_module is not None:
        x, x_fq, y, igs = fx_golden.w4a4_emulation(lmodel, w4a4_module, W4A4_SEED)
        golden["w4a4.x"], golden["w4a4.x_fq"], golden["w4a4.y"] = x, x_fq, y
        fmt = "NVFP4" if "nvfp4" in variant else "MXFP4"
        gdoc["w4a4.x"] = {"what": f"activation torch.randn(5, K, generator seed {W4A4_SEED}) "
                          f"fed to {w4a4_module}", "dtype": "float32",
                          "shape": list(x.shape)}
        gdoc["w4a4.x_fq"] = {"what": f"x after compressed-tensors forward_quantize(module, x, "
                             f"'input', scheme.input_activations): dynamic per-token "
                             f"{fmt} fake quant"
                             + (f" with input_global_scale={igs!r}" if igs else "")
                             + " (fp32)", "dtype": "float32", "shape": list(x.shape)}
        gdoc["w4a4.y"] = {"what": f"x_fq @ dequant({w4a4_module}).T in fp32 (+bias if any)",
                          "dtype": "float32", "shape": list(y.shape)}

    from safetensors.torch import save_file
    # one metadata key only: safetensors writes its metadata map in hash order
    meta = {"fixture": json.dumps({"fixture": fx, "w4a4.module": w4a4_module},
                                  sort_keys=True)}
    save_file({k: v.contiguous() for k, v in golden.items()},
              os.path.join(out, "golden.safetensors"), metadata=meta)

    files = {f: {"bytes": os.path.getsize(os.path.join(out, f)),
                 "sha256": sha256(os.path.join(out, f))}
             for f in sorted(os.listdir(out))}
    manifest = {
        "fixture": fx,
        "model": model,
        "variant": variant,
        "producer": producer,
        "architecture": src_info["arch"],
        "source_model": {"seed": src_info["seed"], "init": src_info["init"],
                         "config_kwargs": src_info["config"], "dtype": "bfloat16",
                         "built_by": "tools/reference/fx_models.py (random init)"},
        "tool_versions": versions(),
        "recipe": recipe,
        "tokenizer": tok_info,
        "prompts": ps,
        "golden_file": "golden.safetensors",
        "golden": gdoc,
        "golden_notes": [
            "logits/greedy: AutoModelForCausalLM.from_pretrained(<this folder>, "
            "dtype=bfloat16) (compressed-tensors folders with "
            "CompressedTensorsConfig(dequantize=True), i.e. compressed-tensors "
            "decompresses at load), then model.float(): the forward runs in fp32 on "
            "bf16-valued weights. Activation quantization of W4A4/FP8 schemes is "
            "fake-quantized by compressed-tensors inside that forward (NVFP4, MXFP4, "
            "FP8_DYNAMIC, FP8_BLOCK); weight-only schemes have none.",
            "bf16 source reference for 'quality': the unquantized source model, fp32 "
            "forward.",
        ],
        "w4a4_module": w4a4_module,
        "quality_vs_bf16_source": quality,
        "done_by_hand": manual,
        "determinism": {"torch_threads": 1, "use_deterministic_algorithms": True,
                        "calibration_shuffle": False},
        "files": files,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=2, default=str)
        f.write("\n")
    # tracked as model.safetensors.xz (the MANIFEST describes the plain file, which the build inflates)
    test_data_xz.compress(os.path.join(out, "model.safetensors"))
    print(f"{fx}: {sum(v['bytes'] for v in files.values())} bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    if a.list:
        print("\n".join(all_fixtures()))
        return
    if a.one:
        make_one(a.one)
        return
    todo = a.only or all_fixtures()
    # build shared pieces once (tokenizer, source models) before any parallelism
    setup_determinism()
    ensure_tokenizer()
    for m in dict.fromkeys(split(fx)[0] for fx in todo):
        ensure_source(m)
    procs, failed = [], []
    for fx in todo:
        while len(procs) >= a.jobs:
            p, name = procs.pop(0)
            if p.wait() != 0:
                failed.append(name)
        log = open(os.path.join(BUILD, f"log-{fx}.txt"), "w")
        procs.append((subprocess.Popen([sys.executable, __file__, "--one", fx],
                                       stdout=log, stderr=subprocess.STDOUT), fx))
    for p, name in procs:
        if p.wait() != 0:
            failed.append(name)
    if failed:
        print("FAILED:", " ".join(failed), f"(logs in {BUILD})")
        sys.exit(1)


if __name__ == "__main__":
    main()
