#!/usr/bin/env python3
"""Writes tests/data/formats/format_tables.safetensors: decode tables and encode expectations for the numeric
formats of src/quant/formats.h, computed independently with numpy and ml_dtypes (never with fp4serve code).

Decode: every code of E2M1 (16), E4M3fn, E5M2, E8M0 (256 each) and IEEE half (65536), as float32.
E8M0 follows the reference decoders (HF `ldexp`, compressed-tensors `2 ** (b - 127)`): code 255 -> +inf,
whereas ml_dtypes' float8_e8m0fnu calls it NaN; codes 0..254 are checked against ml_dtypes here.
Encode: a seeded set of inputs (random log-uniform magnitudes, exact midpoints between neighbours of every
format to pin ties-to-even, subnormals, saturation edges, signed zeros, inf, NaN) with the codes ml_dtypes/numpy
produce: E2M1 after clamping to +-6 (the compressed-tensors rule), E4M3 after clamping to +-448, E5M2/BF16/F16
without clamping (torch/ml_dtypes casts).

Usage: python3 tools/gen_format_tables.py [--out tests/data/formats/format_tables.safetensors]
Needs: numpy, ml_dtypes, safetensors (PyPI).
"""
import argparse
import json
import pathlib
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

SEED = 20261129


def e2m1_decode():
    # float4_e2m1fn occupies one byte per element in ml_dtypes; the low 4 bits are the code.
    codes = np.arange(16, dtype=np.uint8)
    return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)


def e8m0_decode():
    codes = np.arange(256, dtype=np.int32)
    with np.errstate(over="ignore"):
        ref = np.ldexp(np.float32(1.0), codes - 127).astype(np.float32)  # 255 -> inf, as the references decode
    via_ml = np.arange(255, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(ref[:255], via_ml), "E8M0 decode disagrees with ml_dtypes"
    return ref


def midpoints(values):
    v = np.unique(np.abs(values[np.isfinite(values)]).astype(np.float64))
    mids = (v[:-1] + v[1:]) / 2.0
    mids = mids[mids.astype(np.float32).astype(np.float64) == mids]  # keep midpoints that float32 holds exactly
    return mids.astype(np.float32)


def encode_inputs(decode_tables):
    rng = np.random.default_rng(SEED)
    parts = []
    for lo, hi in [(-12, 3), (-9, 10), (-20, 17), (-30, 40), (-130, 127)]:
        mags = np.exp2(rng.uniform(lo, hi, size=4000)).astype(np.float32)
        signs = np.where(rng.random(4000) < 0.5, -1.0, 1.0).astype(np.float32)
        parts.append(mags * signs)
    for table in decode_tables:
        m = midpoints(table)
        parts += [m, -m]
        # one ulp either side of each midpoint
        parts += [np.nextafter(m, np.float32(np.inf)), np.nextafter(m, np.float32(0))]
    edges = np.array([0.0, -0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 100.0, 448.0, 449.0, 463.9, 464.0,
                      465.0, 1e6, 57344.0, 61439.0, 61440.0, 65504.0, 65519.0, 65520.0, 2.0 ** -9, 2.0 ** -10,
                      2.0 ** -6 * 0.5, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 2.0 ** -16, 2.0 ** -17, 1e-45, 3.4e38,
                      np.inf, -np.inf], dtype=np.float32)
    parts += [edges, -edges]
    x = np.concatenate(parts).astype(np.float32)
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/data/formats/format_tables.safetensors")
    args = ap.parse_args()

    e2m1 = e2m1_decode()
    e4m3 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    e5m2 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2).astype(np.float32)
    e8m0 = e8m0_decode()
    f16 = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)

    x = encode_inputs([e2m1, e4m3, e5m2, f16])
    finite = np.isfinite(x)
    x_nan = np.array([np.nan, -np.nan], dtype=np.float32)
    x_nan[1] = np.copysign(np.float32(np.nan), np.float32(-1.0))

    with np.errstate(invalid="ignore", over="ignore"):
        e2m1_codes = np.clip(x, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
        e4m3_codes = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        e5m2_codes = x.astype(ml_dtypes.float8_e5m2).view(np.uint8)
        bf16_codes = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        f16_codes = x.astype(np.float16).view(np.uint16)
        nan_e4m3 = x_nan.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        nan_e5m2 = x_nan.astype(ml_dtypes.float8_e5m2).view(np.uint8)
        nan_bf16 = x_nan.astype(ml_dtypes.bfloat16).view(np.uint16)
        nan_f16 = x_nan.astype(np.float16).view(np.uint16)

    tensors = {
        "e2m1.decode": e2m1, "e4m3.decode": e4m3, "e5m2.decode": e5m2, "e8m0.decode": e8m0, "f16.decode": f16,
        "encode.inputs": x, "e2m1.encode": e2m1_codes.astype(np.uint8), "e4m3.encode": e4m3_codes,
        "e5m2.encode": e5m2_codes, "bf16.encode": bf16_codes, "f16.encode": f16_codes,
        "nan.inputs": x_nan, "nan.e4m3": nan_e4m3, "nan.e5m2": nan_e5m2, "nan.bf16": nan_bf16, "nan.f16": nan_f16,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"generator": "tools/gen_format_tables.py", "numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__,
            "seed": str(SEED), "inputs": str(len(x)), "finite_inputs": str(int(finite.sum()))}
    save_file(tensors, str(out), metadata=meta)
    print(json.dumps(meta))
    # tracked compressed (7x smaller); the build inflates it back (tools/test_data_xz.py)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import test_data_xz
    test_data_xz.compress(str(out))


if __name__ == "__main__":
    main()
