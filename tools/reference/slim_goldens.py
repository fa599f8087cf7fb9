#!/usr/bin/env python3
"""Store each reference dequantization as a SHA-256 digest plus a few sampled rows.

A full `dequant.<module>` golden (the reference tool's dequantization of a whole
Linear, BF16) costs ~1.1 MB per llama fixture, which kept tests/data too large to
ship to a GPU machine. The C++ parity tests only ever compare bit for bit, so a
digest of the exact bytes is as strong a check as the tensor itself; the sampled
rows are kept so that a mismatch still shows which values differ.

`slim_entries()` is the single definition of the stored form, used by the fixture
generator (make_fixtures.py), by tools/quantize_roundtrip.py and by this script.
For each module it writes

  dequant_sha256.<module>     U8  [32]     SHA-256 of the reference tensor's bytes
                                           (row-major, little-endian, its own dtype)
  dequant_shape.<module>      I64 [ndim]   the reference tensor's shape
  dequant_row_index.<module>  I64 [r]      sorted row indices into the tensor seen as
                                           [prod(shape[:-1]), shape[-1]]: first, last
                                           and 6 seeded-random rows (all rows if <= 8)
  dequant_rows.<module>       dtype [r, K] those rows, same dtype as the reference

Usage (converts goldens written in the old form in place, fixing MANIFEST.json):
  tools/reference/.venv/bin/python tools/reference/slim_goldens.py            # every fixture
  tools/reference/.venv/bin/python tools/reference/slim_goldens.py llama-nvfp4
  tools/reference/.venv/bin/python tools/reference/slim_goldens.py --file \
      tests/data/quantized-by-fp4serve/nvfp4a16/reference_dequant.safetensors
The result is byte-identical to regenerating the fixture with make_fixtures.py.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REF = os.path.join(ROOT, "tests", "data", "ref")

OLD_PREFIX = "dequant."
N_RANDOM_ROWS = 6


def tensor_bytes(t):
    """Row-major little-endian bytes of a CPU tensor in its own dtype (x86/ARM are little-endian)."""
    assert sys.byteorder == "little"
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


def sample_rows(module, n_rows):
    """First, last and N_RANDOM_ROWS distinct rows drawn with a seed derived from the module name."""
    if n_rows <= N_RANDOM_ROWS + 2:
        return list(range(n_rows))
    seed = int.from_bytes(hashlib.sha256(module.encode()).digest()[:8], "little")
    middle = np.random.default_rng(seed).choice(np.arange(1, n_rows - 1), N_RANDOM_ROWS, replace=False)
    return sorted({0, n_rows - 1, *(int(i) for i in middle)})


def slim_entries(module, w, doc):
    """[(name, tensor, doc)] that replace the full golden `dequant.<module>` = w, described by `doc`."""
    shape = list(w.shape)
    flat = w.detach().contiguous().reshape(-1, shape[-1])
    rows = sample_rows(module, flat.shape[0])
    dtype = str(w.dtype).replace("torch.", "")
    return [
        (f"dequant_sha256.{module}",
         torch.tensor(list(hashlib.sha256(tensor_bytes(w)).digest()), dtype=torch.uint8),
         {"what": "SHA-256 of the bytes (row-major, little-endian, " + dtype + ") of the reference "
                  "tensor described in 'reference'", "dtype": "uint8", "shape": [32],
          "reference": doc}),
        (f"dequant_shape.{module}", torch.tensor(shape, dtype=torch.int64),
         {"what": f"shape of the reference tensor of {module}", "dtype": "int64",
          "shape": [len(shape)]}),
        (f"dequant_row_index.{module}", torch.tensor(rows, dtype=torch.int64),
         {"what": f"rows sampled from the reference tensor of {module} viewed as [{flat.shape[0]}, "
                  f"{shape[-1]}]: first, last and {N_RANDOM_ROWS} drawn by numpy default_rng(seed = "
                  "first 8 bytes of sha256(module name), little-endian)", "dtype": "int64",
          "shape": [len(rows)]}),
        (f"dequant_rows.{module}", flat[rows].clone(),
         {"what": f"those rows of the reference tensor of {module}, exact", "dtype": dtype,
          "shape": [len(rows), shape[-1]]}),
    ]


def add_slim(golden, gdoc, module, w, doc):
    """Append the slim entries of one module to the golden dict (and its MANIFEST description)."""
    for name, t, d in slim_entries(module, w, doc):
        golden[name] = t
        if gdoc is not None:
            gdoc[name] = d


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def slim_file(path, gdoc=None):
    """Rewrite one safetensors file in place; returns the number of tensors slimmed (0: already slim)."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    old = [k for k in tensors if k.startswith(OLD_PREFIX)]
    if not old:
        return 0
    out = {}
    for k, t in tensors.items():
        if not k.startswith(OLD_PREFIX):
            out[k] = t
    for k in old:
        module = k[len(OLD_PREFIX):]
        doc = gdoc.get(k) if gdoc is not None else None
        add_slim(out, None, module, tensors[k], doc)
    save_file({k: v.contiguous() for k, v in out.items()}, path, metadata=meta)
    return len(old)


def slim_manifest_golden(gdoc, golden_tensors):
    """The MANIFEST 'golden' dict with each dequant.<module> entry replaced in place by its slim entries."""
    out = {}
    for k, d in gdoc.items():
        if k.startswith(OLD_PREFIX):
            for name, _, nd in slim_entries(k[len(OLD_PREFIX):], golden_tensors[k], d):
                out[name] = nd
        else:
            out[k] = d
    return out


def slim_fixture(folder):
    from safetensors import safe_open
    path = os.path.join(folder, "golden.safetensors")
    mpath = os.path.join(folder, "MANIFEST.json")
    manifest = json.load(open(mpath))
    with safe_open(path, framework="pt") as f:
        olds = {k: f.get_tensor(k) for k in f.keys() if k.startswith(OLD_PREFIX)}
    if not olds:
        return 0
    manifest["golden"] = slim_manifest_golden(manifest["golden"], olds)
    n = slim_file(path)
    manifest["files"]["golden.safetensors"] = {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=2, default=str)
        f.write("\n")
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixtures", nargs="*", help="folder names under tests/data/ref (default: all)")
    ap.add_argument("--file", action="append", default=[], help="a safetensors file without MANIFEST")
    a = ap.parse_args()
    for path in a.file:
        before = os.path.getsize(path)
        n = slim_file(path)
        print(f"{path}: {n} tensors slimmed, {before} -> {os.path.getsize(path)} bytes")
    if a.file and not a.fixtures:
        return
    names = a.fixtures or sorted(d for d in os.listdir(REF) if os.path.isdir(os.path.join(REF, d)))
    for fx in names:
        folder = os.path.join(REF, fx)
        before = os.path.getsize(os.path.join(folder, "golden.safetensors"))
        n = slim_fixture(folder)
        print(f"{fx}: {n} tensors slimmed, {before} -> "
              f"{os.path.getsize(os.path.join(folder, 'golden.safetensors'))} bytes")


if __name__ == "__main__":
    main()
