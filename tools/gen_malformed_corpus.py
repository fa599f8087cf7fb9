#!/usr/bin/env python3
"""Writes tests/data/malformed/: safetensors files and checkpoint folders that a strict reader must refuse, and
tests/data/valid/: edge cases it must accept. cases.json lists each malformed case with the message fragment
fp4serve must report (tests/checkpoint/malformed_test.cpp) and its kind ("file" or "folder").

Only the Python standard library is used, so each byte is written by hand and the corpus does not depend on
any safetensors writer. Usage: python3 tools/gen_malformed_corpus.py
"""
import json
import pathlib
import shutil
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data"
BAD = ROOT / "malformed"
GOOD = ROOT / "valid"


def st_bytes(header, data=b"", raw_header=None, pad=True):
    text = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad and raw_header is None:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def f32(n, start=1.0):
    return struct.pack(f"<{n}f", *[start + i for i in range(n)])


cases = []


def bad_file(name, content, expect):
    (BAD / f"{name}.safetensors").write_bytes(content)
    cases.append({"name": name, "kind": "file", "path": f"{name}.safetensors", "expect": expect})


def bad_folder(name, files, expect):
    d = BAD / name
    d.mkdir()
    for fname, content in files.items():
        (d / fname).write_bytes(content if isinstance(content, bytes) else content.encode())
    cases.append({"name": name, "kind": "folder", "path": name, "expect": expect})


def good_shard(tensors):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = entry(dtype, shape, len(data), len(data) + len(payload))
        data += payload
    return st_bytes(header, data)


def main():
    for d in (BAD, GOOD):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)

    ok_header = {"a": entry("F32", [2], 0, 8)}
    bad_file("empty_file", b"", "shorter than the 8-byte header length prefix")
    bad_file("truncated_length_prefix", b"\x10\x00\x00\x00\x00", "shorter than the 8-byte header length prefix")
    bad_file("header_over_limit", struct.pack("<Q", 100_000_001) + b"{}", "exceeds the limit of 100000000 bytes")
    bad_file("header_longer_than_file", struct.pack("<Q", 4096) + b'{"a":1}', "runs past the end of the file")
    bad_file("header_length_huge", struct.pack("<Q", 2**64 - 1) + b"{}", "exceeds the limit")
    bad_file("invalid_utf8", st_bytes(None, raw_header=b'{"\xff\xfe":{}}'), "not valid UTF-8")
    bad_file("overlong_utf8", st_bytes(None, raw_header=b'{"\xc0\xaf":{}}'), "not valid UTF-8")
    bad_file("header_not_brace", st_bytes(None, raw_header=b' {"a":1}'), "does not start with '{'")
    bad_file("non_object_header", st_bytes(None, raw_header=b"[1, 2, 3]"), "does not start with '{'")
    bad_file("invalid_json", st_bytes(None, raw_header=b'{"a": {"dtype": "F32",'), "not valid JSON")
    bad_file("trailing_garbage_json", st_bytes(None, raw_header=b'{} {}'), "not valid JSON")
    bad_file("number_beyond_double", st_bytes(None, raw_header=b'{"a":{"dtype":"U8","shape":[4.2e330237],'
                                                              b'"data_offsets":[0,1]}}') + b"x", "not valid JSON")
    bad_file("unknown_dtype", st_bytes({"a": entry("F7", [2], 0, 8)}, f32(2)), "unknown dtype 'F7'")
    bad_file("dtype_not_string", st_bytes({"a": {"dtype": 5, "shape": [2], "data_offsets": [0, 8]}}, f32(2)),
             "dtype is 5, expected a string")
    bad_file("missing_dtype", st_bytes({"a": {"shape": [2], "data_offsets": [0, 8]}}, f32(2)), "entry has no 'dtype'")
    bad_file("missing_offsets", st_bytes({"a": {"dtype": "F32", "shape": [2]}}, f32(2)), "entry has no 'data_offsets'")
    bad_file("entry_not_object", st_bytes({"a": 5}), "entry is number, expected an object")
    bad_file("negative_shape", st_bytes({"a": entry("F32", [-1], 0, 8)}, f32(2)),
             "shape[0] is -1, expected a non-negative integer")
    bad_file("float_shape", st_bytes({"a": entry("F32", [2.5], 0, 8)}, f32(2)),
             "shape[0] is 2.5, expected a non-negative integer")
    bad_file("shape_not_list", st_bytes({"a": entry("F32", 2, 0, 8)}, f32(2)), "shape is 2, expected a list")
    bad_file("shape_numel_overflow", st_bytes({"a": entry("U8", [2**40, 2**40], 0, 8)}, f32(2)),
             "more elements than fit in 64 bits")
    bad_file("shape_bytes_overflow", st_bytes({"a": entry("F64", [2**62], 0, 8)}, f32(2)),
             "needs more bytes than fit in 64 bits")
    bad_file("shape_dim_over_int64", st_bytes({"a": entry("U8", [2**63], 0, 8)}, f32(2)), "overflows a 64-bit size")
    bad_file("byte_count_mismatch", st_bytes({"a": entry("F32", [4], 0, 12)}, f32(3)),
             "span 12 bytes, but F32 [4] needs 16 bytes")
    bad_file("subbyte_not_whole", st_bytes({"a": entry("F4", [3], 0, 2)}, b"\x00\x00"), "do not fill whole bytes")
    bad_file("offsets_reversed", st_bytes({"a": entry("F32", [0], 8, 4)}, f32(2)), "end before they begin")
    bad_file("offsets_not_pair", st_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, f32(2)),
             "expected [begin, end]")
    bad_file("offsets_negative", st_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}, f32(2)),
             "expected [begin, end]")
    bad_file("offsets_out_of_range", st_bytes({"a": entry("U8", [1000], 0, 1000)}, f32(4)),
             "tensors cover 1000 bytes of the data buffer, but the file holds 16 bytes")
    bad_file("overlapping_regions", st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, f32(3)),
             "overlaps tensor 'a'")
    bad_file("gap_between_regions", st_bytes({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, f32(5)),
             "leaving a gap after byte 8")
    bad_file("gap_at_start", st_bytes({"a": entry("F32", [2], 4, 12)}, f32(3)), "leaving a gap after byte 0")
    bad_file("trailing_bytes", st_bytes(ok_header, f32(3)),
             "tensors cover 8 bytes of the data buffer, but the file holds 12 bytes")
    bad_file("metadata_not_map", st_bytes({"__metadata__": [1], **ok_header}, f32(2)),
             "__metadata__ is array, expected a map of strings")
    bad_file("metadata_value_not_string", st_bytes({"__metadata__": {"format": 1}, **ok_header}, f32(2)),
             "__metadata__['format'] is 1, expected a string")
    bad_file("duplicate_tensor_key", st_bytes(None, raw_header=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                                               b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')
             + f32(2), "repeats the key 'a'")

    shard_a = good_shard({"x": ("F32", [2], f32(2))})
    shard_b = good_shard({"y": ("F32", [3], f32(3))})
    index = lambda wm: json.dumps({"metadata": {"total_size": 20}, "weight_map": wm})
    bad_folder("index_invalid_json", {"model.safetensors.index.json": '{"weight_map": {', "config.json": "{}"},
               "not valid JSON")
    bad_folder("index_without_weight_map", {"model.safetensors.index.json": '{"metadata": {}}'},
               "expected an object 'weight_map'")
    bad_folder("index_shard_not_string", {"model.safetensors.index.json": index({"x": 3})},
               "weight_map['x'] is 3, expected a shard file name")
    bad_folder("index_path_traversal", {"model.safetensors.index.json": index({"x": "../evil.safetensors"})},
               "must be a plain file name")
    bad_folder("index_absolute_path", {"model.safetensors.index.json": index({"x": "/etc/passwd"})},
               "must be a plain file name")
    bad_folder("index_subfolder", {"model.safetensors.index.json": index({"x": "sub/model.safetensors"})},
               "must be a plain file name")
    bad_folder("index_missing_shard", {"model.safetensors.index.json": index({"x": "s1.safetensors", "y": "s2.safetensors"}),
                                       "s1.safetensors": shard_a}, "shard 's2.safetensors' listed in the index does not exist")
    bad_folder("index_tensor_absent_from_shard",
               {"model.safetensors.index.json": index({"x": "s1.safetensors", "z": "s1.safetensors"}),
                "s1.safetensors": shard_a}, "the index lists tensor 'z' in this shard, but the shard does not hold it")
    bad_folder("shard_tensor_not_in_index",
               {"model.safetensors.index.json": index({"x": "s1.safetensors"}),
                "s1.safetensors": good_shard({"x": ("F32", [2], f32(2)), "w": ("F32", [1], f32(1))})},
               "holds tensor 'w', which the index does not list")
    bad_folder("duplicate_tensor_across_shards",
               {"model.safetensors.index.json": index({"x": "s1.safetensors", "y": "s2.safetensors"}),
                "s1.safetensors": shard_a, "s2.safetensors": good_shard({"y": ("F32", [3], f32(3)), "x": ("F32", [2], f32(2))})},
               "tensor 'x' appears in two shards")
    bad_folder("index_empty_weight_map", {"model.safetensors.index.json": index({})}, "weight_map is empty")
    bad_folder("no_weights", {"config.json": "{}"}, "no model.safetensors and no model.safetensors.index.json")
    bad_folder("single_and_index", {"model.safetensors": shard_a,
                                    "model.safetensors.index.json": index({"x": "model.safetensors"})}, "holds both")
    bad_folder("config_not_object", {"model.safetensors": shard_a, "config.json": "[1]"}, "expected a JSON object")
    bad_folder("config_invalid_json", {"model.safetensors": shard_a, "config.json": "{'a': 1}"}, "not valid JSON")
    bad_folder("bad_shard_inside_folder", {"model.safetensors": st_bytes({"a": entry("F7", [2], 0, 8)}, f32(2))},
               "unknown dtype 'F7'")

    (BAD / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")

    # Accepted edge cases.
    (GOOD / "scalar_and_empty.safetensors").write_bytes(good_shard({
        "scalar": ("F32", [], f32(1, 3.5)), "empty": ("BF16", [0, 4], b""), "empty2": ("F16", [3, 0], b""),
        "fp4": ("F4", [2, 4], b"\x21\x43\x65\x87"), "codes": ("U8", [3], b"\x01\x02\x03")}))
    (GOOD / "null_metadata.safetensors").write_bytes(st_bytes({"__metadata__": None, "a": entry("F32", [2], 0, 8)}, f32(2)))
    (GOOD / "no_tensors.safetensors").write_bytes(st_bytes({"__metadata__": {"format": "pt"}}))
    (GOOD / "unpadded_header.safetensors").write_bytes(st_bytes(ok_header, f32(2), pad=False))
    print(f"{len(cases)} malformed cases written to {BAD}")


if __name__ == "__main__":
    main()
