#!/usr/bin/env python3
"""Check that the golden dequant tensors agree bit for bit with
(1) a fresh run of the reference decompression (compressed-tensors / ModelOpt /
    transformers mxfp4), and
(2) a float64 numpy re-implementation of docs FORMATS.md §2/§3/§5 that reads the
    raw safetensors bytes (ml_dtypes for BF16 / F8_E4M3 decoding).

Prints one line per fixture and a final count; exits 1 on any mismatch.
"""
import json
import os
import struct
import sys

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "data", "ref")
sys.path.insert(0, HERE)

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float64)
BF16 = ml_dtypes.bfloat16
NP_DT = {"BF16": BF16, "F32": np.float32, "F16": np.float16, "U8": np.uint8,
         "I8": np.int8, "I32": np.int32, "I64": np.int64, "F64": np.float64,
         "F8_E4M3": ml_dtypes.float8_e4m3fn}


def read_st(path):
    """Minimal safetensors reader (FORMATS.md §6) -> {name: np.ndarray}."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        buf = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(buf[a:b], dtype=NP_DT[v["dtype"]]).reshape(v["shape"])
    return out


def unpack_fp4(packed):
    """[N, K/2] U8 -> [N, K] float64 (low nibble = even element)."""
    lo = packed & 0x0F
    hi = packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)
    return E2M1[codes]


def to_bf16_via_f32(x64):
    return x64.astype(np.float32).astype(BF16)


def nvfp4_ct(t, p):
    q = unpack_fp4(t[p + ".weight_packed"])
    s = t[p + ".weight_scale"].astype(np.float32)          # exact
    gs = t[p + ".weight_global_scale"].astype(np.float32).reshape(())
    tt = (s / gs).astype(np.float32)                        # IEEE fp32 division
    tt = np.repeat(tt.astype(np.float64), 16, axis=1)
    return to_bf16_via_f32(q * tt)                          # FP32(q*t) then BF16


def nvfp4_modelopt(t, p):
    q = unpack_fp4(t[p + ".weight"])
    s = t[p + ".weight_scale"].astype(np.float32)
    ws2 = t[p + ".weight_scale_2"].astype(np.float32).reshape(())
    pb = (s * ws2).astype(np.float32)                       # fp32 multiply
    pb = np.repeat(pb.astype(np.float64), 16, axis=1)
    return to_bf16_via_f32(q * pb)


def mxfp4(packed, e8m0):
    q = unpack_fp4(packed)
    sc = np.ldexp(1.0, e8m0.astype(np.int64) - 127)
    return (q * np.repeat(sc, 32, axis=-1)).astype(BF16)


def int_pack(t, p, args):
    packed = t[p + ".weight_packed"].view(np.uint32)
    n, k = (int(x) for x in t[p + ".weight_shape"])
    nib = np.stack([(packed >> (4 * i)) & 0xF for i in range(8)], axis=-1).reshape(n, -1)[:, :k]
    q = nib.astype(np.float64) - 8
    scale = t[p + ".weight_scale"]
    g = args["group_size"]
    if p + ".weight_zero_point" in t:
        zp = t[p + ".weight_zero_point"].view(np.uint32)      # packed along rows
        zt = zp.T                                             # [K/G, ceil(N/8)]
        zn = np.stack([(zt >> (4 * i)) & 0xF for i in range(8)], axis=-1)
        zn = zn.reshape(zt.shape[0], -1)[:, :n].T             # [N, K/G]
        z = zn.astype(np.float64) - 8
    else:
        z = np.zeros(scale.shape)
    zz = np.repeat(z, g, axis=1)
    ss = np.repeat(scale.astype(np.float64), g, axis=1)
    return ((q - zz) * ss).astype(scale.dtype)


def fp8(t, p, args):
    w = t[p + ".weight"].astype(np.float64)
    s = t[p + ".weight_scale"]
    if args["strategy"] == "block":
        bh, bw = args["block_structure"]
        ss = np.repeat(np.repeat(s.astype(np.float64), bh, axis=0), bw, axis=1)
        ss = ss[: w.shape[0], : w.shape[1]]
    else:
        ss = s.astype(np.float64)
    return (w * ss).astype(s.dtype)


def numpy_dequant(folder, t, mod, cfg):
    qc = cfg.get("quantization_config", {})
    qm = qc.get("quant_method")
    if qm == "modelopt" or os.path.exists(os.path.join(folder, "hf_quant_config.json")):
        return nvfp4_modelopt(t, mod), "modelopt nvfp4"
    if qm == "mxfp4":
        e, n_, g, b = t[mod + "_blocks"].shape
        w = mxfp4(t[mod + "_blocks"].reshape(e * n_, g * b), t[mod + "_scales"].reshape(e * n_, g))
        return w.reshape(e, n_, g * b * 2), "gpt-oss mxfp4"
    grp = next(iter(qc["config_groups"].values()))
    fmt = grp.get("format") or qc["format"]
    w = grp["weights"]
    if fmt == "nvfp4-pack-quantized":
        return nvfp4_ct(t, mod), fmt
    if fmt == "mxfp4-pack-quantized":
        return mxfp4(t[mod + ".weight_packed"], t[mod + ".weight_scale"]), fmt
    if fmt == "pack-quantized":
        return int_pack(t, mod, w), fmt
    if fmt in ("float-quantized", "naive-quantized"):
        return fp8(t, mod, w), fmt
    raise ValueError(f"no numpy path for {fmt}")


def fresh_reference(folder, cfg):
    import fx_golden
    qm = cfg.get("quantization_config", {}).get("quant_method")
    if qm == "compressed-tensors":
        return fx_golden.ct_dequant(folder)[0]
    if qm == "modelopt":
        return fx_golden.modelopt_dequant(folder)[0]
    if qm == "mxfp4":
        import fx_gptoss
        return {k[len("dequant."):]: v[0] for k, v in fx_gptoss.reference_dequant(folder)[0].items()}
    return {}


def bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


def main():
    import torch  # noqa: F401  (for fresh_reference)
    fixtures = sys.argv[1:] or sorted(d for d in os.listdir(REF)
                                      if os.path.isdir(os.path.join(REF, d)))
    compared = mismatched = zero_sign = fresh_cmp = fresh_bad = 0
    for fx in fixtures:
        folder = os.path.join(REF, fx)
        cfg = json.load(open(os.path.join(folder, "config.json")))
        golden = read_st(os.path.join(folder, "golden.safetensors"))
        deq = {k[len("dequant."):]: v for k, v in golden.items() if k.startswith("dequant.")}
        if not deq:
            print(f"{fx}: no dequant goldens")
            continue
        t = read_st(os.path.join(folder, "model.safetensors"))
        fresh = fresh_reference(folder, cfg)
        lines = []
        for mod, g in sorted(deq.items()):
            mine, how = numpy_dequant(folder, t, mod, cfg)
            compared += 1
            same = (mine.shape == g.shape and mine.dtype == g.dtype
                    and np.array_equal(bits(mine), bits(g)))
            if not same and mine.shape == g.shape and np.array_equal(
                    mine.astype(np.float64), g.astype(np.float64)):
                # identical values, only the sign of some zeros differs
                zero_sign += 1
                nz = int((bits(mine) != bits(g)).sum())
                lines.append(f"  ZERO-SIGN {mod} ({how}): {nz} elements are -0.0 in the "
                             f"numpy (FORMATS.md) decode and +0.0 in the reference")
            elif not same:
                mismatched += 1
                nbad = (int((bits(mine) != bits(g)).sum()) if mine.shape == g.shape else -1)
                lines.append(f"  MISMATCH {mod} ({how}): {nbad} elements differ, "
                             f"numpy {mine.dtype}{list(mine.shape)} vs golden {g.dtype}{list(g.shape)}")
            if mod in fresh:
                fresh_cmp += 1
                f = fresh[mod].contiguous().view(torch.int16).numpy().view(np.uint16)
                if not np.array_equal(f, bits(g)):
                    fresh_bad += 1
                    lines.append(f"  FRESH-REFERENCE MISMATCH {mod}")
        bad = any(not ln.startswith("  ZERO-SIGN") for ln in lines)
        print(f"{fx}: {len(deq)} tensors, "
              f"{'FAIL' if bad else ('OK (zero sign differs)' if lines else 'OK')}")
        for ln in lines:
            print(ln)
    print(f"compared {compared} golden dequant tensors with the numpy float64 "
          f"implementation: {compared - mismatched - zero_sign} bit-exact, "
          f"{zero_sign} equal except the sign of zero, {mismatched} mismatched")
    print(f"compared {fresh_cmp} with a fresh run of the reference decompression: "
          f"{fresh_cmp - fresh_bad} bit-exact, {fresh_bad} mismatched")
    sys.exit(1 if (mismatched or fresh_bad) else 0)


if __name__ == "__main__":
    main()
