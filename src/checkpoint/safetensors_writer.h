// SPDX-License-Identifier: Apache-2.0
// Writing safetensors shards and the shard index the way the Hugging Face tools do, so files we produce are
// byte-for-byte laid out like theirs (docs/FORMATS.md §6): header layout and tensor order from the Rust
// writer (huggingface/safetensors `serialize`), shard split and index from huggingface_hub
// `split_state_dict_into_shards_factory` + transformers `save_pretrained`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace fp4serve::checkpoint {

/// llm-compressor's `save_pretrained` default `max_shard_size` ("20GB" = 20·10^9 bytes,
/// `compressed_tensors_utils.py: save_pretrained_wrapper`), which is what our quantizer imitates.
inline constexpr uint64_t kDefaultMaxShardBytes = 20'000'000'000ULL;

/// One tensor to write: row-major little-endian bytes, exactly ceil(numel · dtype_bits / 8) of them.
struct TensorRecord {
  std::string name;
  core::DType dtype = core::DType::U8;
  std::vector<int64_t> shape;   ///< empty for a 0-d scalar
  std::vector<std::byte> bytes;
};

/// Bytes a tensor of `dtype` and `shape` occupies (ceil(numel · bits / 8)). Throws UsageError on a negative
/// dimension or a size that overflows 64 bits.
uint64_t tensor_bytes(core::DType dtype, const std::vector<int64_t>& shape);

/// The complete file contents of one safetensors file holding `tensors`:
/// 8-byte little-endian header length N, compact JSON header, data. The header lists `__metadata__` first, then
/// the tensors in data order, which is the Rust writer's: dtype descending in safetensors' own dtype order
/// (U64, I64, F64, C64, F32, U32, I32, BF16, F16, U16, I16, the FP8 tags, I8, U8, F6, F4, BOOL — that order puts
/// wider dtypes first so every tensor is naturally aligned) then name ascending. Each entry is
/// {"dtype","shape","data_offsets"} in that key order; N is padded with spaces to a multiple of 8.
/// `metadata` is written as `__metadata__` when not empty (transformers writes {"format": "pt"}).
/// Throws UsageError when two tensors share a name, a name is empty or "__metadata__", or a record's byte
/// count differs from tensor_bytes(dtype, shape) (the message names the tensor, expected and found bytes).
std::vector<std::byte> serialize_safetensors(std::span<const TensorRecord> tensors,
                                             const std::map<std::string, std::string>& metadata);

/// serialize_safetensors written to `path` (created or truncated). Throws IoError naming the path when it
/// cannot be written, UsageError as serialize_safetensors.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorRecord> tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// Splits tensors of the given byte sizes (in write order) into shards the way huggingface_hub does: walk in
/// order, start a new shard when adding the next tensor would exceed `max_shard_bytes`, and give a tensor
/// larger than the limit a shard of its own (placed where it occurs, without closing the current shard).
/// Returns, per shard, the indices into `sizes`. Throws UsageError when `max_shard_bytes` is 0.
std::vector<std::vector<size_t>> plan_shards(std::span<const uint64_t> sizes, uint64_t max_shard_bytes);

/// "model.safetensors" when `count` is 1, else "model-%05d-of-%05d.safetensors" with a 1-based `index`.
std::string shard_file_name(size_t index, size_t count);

/// Writes `model.safetensors.index.json` into `dir` as transformers does (JSON, indent 2, sorted keys, final
/// newline): {"metadata": {"total_size": total_bytes}, "weight_map": {tensor: shard file}}.
/// Throws IoError naming the path when it cannot be written.
void write_safetensors_index(const std::filesystem::path& dir, const std::map<std::string, std::string>& weight_map,
                             uint64_t total_bytes);

}  // namespace fp4serve::checkpoint
