#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Transform matrices built by compressed-tensors 0.19's own Hadamard builders, for
tests/model/kronecker_transform_test.cpp (the structure detector must recognize the real construction).

Writes tests/data/transforms/ct-hadamard.safetensors (+ .xz) and MANIFEST.json:
  random-hadamard.<n>.<dtype>  [n, n]  compressed_tensors.transform.utils.hadamard.random_hadamard_matrix(n, dtype,
                                        gen=torch.Generator().manual_seed(SEED + n)), exactly what RandomHadamardFactory
                                        stores as `P.<group>_<location>.weight` (before the 1/sqrt(n) of forward):
                                        n = 576 (CT picks its known H_144 (x) H_4), 1536 (H_192 (x) H_8), 64, 48
  hadamard.<n>.<dtype>         [n, n]  deterministic_hadamard_matrix(n, dtype) (HadamardFactory), n = 64
  perm.<n>                     [n] I64 torch.randperm(n, generator=...) (HadamardFactory._create_permutation, randomize)
for dtype in bf16, f32 (the scheme's `precision` for online transforms) and f64 for n = 576.
Run: tools/reference/.venv/bin/python tools/reference/fx_hadamard.py   (CPU, seconds; needs only torch,
compressed-tensors and safetensors from requirements.txt)
"""
import hashlib
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "data", "transforms")
SEED = 20261201
DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}


def main():
    import compressed_tensors
    from compressed_tensors.transform.utils.hadamard import deterministic_hadamard_matrix, random_hadamard_matrix
    from safetensors.torch import save_file

    tensors = {}
    for n, dtypes in ((576, ("bf16", "f32", "f64")), (1536, ("bf16", "f32")), (64, ("bf16",)), (48, ("f32",))):
        for name in dtypes:
            gen = torch.Generator().manual_seed(SEED + n)
            tensors[f"random-hadamard.{n}.{name}"] = random_hadamard_matrix(n, DTYPES[name], torch.device("cpu"), gen)
    tensors["hadamard.64.bf16"] = deterministic_hadamard_matrix(64, torch.bfloat16, torch.device("cpu"))
    for n in (64, 576, 1536):
        tensors[f"perm.{n}"] = torch.randperm(n, generator=torch.Generator().manual_seed(SEED + 7 * n))
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "ct-hadamard.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)
    sys.path.insert(0, ROOT)
    from tools.test_data_xz import compress  # noqa: E402
    plain, packed = compress(path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    manifest = {
        "made_by": "tools/reference/fx_hadamard.py",
        "compressed-tensors": compressed_tensors.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "sha256": digest,
        "bytes": plain,
        "tensors": {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in sorted(tensors.items())},
    }
    with open(os.path.join(OUT, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{path}: {plain} bytes, {packed} compressed")


if __name__ == "__main__":
    main()
