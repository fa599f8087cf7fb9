// SPDX-License-Identifier: Apache-2.0
#include "backends/cpu/prepare/weight_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/mapped_file.h"

namespace fp4serve::prepare {
namespace {

constexpr std::array<char, 8> kMagic{'F', 'P', '4', 'S', 'W', 'G', 'T', '1'};
constexpr uint64_t kHeaderBytes = 32;  // magic, index offset, index bytes, index checksum
constexpr uint64_t kAlign = 4096;      // every buffer starts at a page boundary (the kernels need 64 bytes)
// A layer of a huge page or more fills whole huge pages of the file (WeightCache::append).
constexpr uint64_t kHugeAlign = uint64_t{2} << 20;
constexpr uint64_t kSpaceMargin = uint64_t{1} << 30;

uint64_t fnv1a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string view_text(const core::TensorView& t) {
  return fmt::format("{}[{}]", core::dtype_name(t.dtype), fmt::join(t.shape, ","));
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1u << 30)); }

// The buffer sizes the repack makes for a layer of these fields (init_tiles' per-tile sizes in repack_*.cpp), or
// nullopt when the fields themselves are inconsistent.
struct BufferSizes {
  uint64_t codes = 0, scales = 0, offsets = 0;
};
std::optional<BufferSizes> buffer_sizes(const PreparedLinear& w) {
  const int64_t n = w.out_features, k = w.in_features;
  if (n <= 0 || k <= 0 || n > (int64_t{1} << 31) || k > (int64_t{1} << 31)) return std::nullopt;
  const bool paired = w.layout == WeightLayout::Fp4 || w.layout == WeightLayout::Int4;
  const int64_t multiple = paired ? kPairedTiles * kTileRows : kTileRows;
  if (w.padded_rows != (n + multiple - 1) / multiple * multiple) return std::nullopt;
  const auto tiles = static_cast<uint64_t>(w.tiles());
  const auto kk = static_cast<uint64_t>(k);
  const int64_t g = w.group_size;
  const auto groups = static_cast<uint64_t>(g > 0 ? (k + g - 1) / g : 0);
  BufferSizes s;
  switch (w.layout) {
    case WeightLayout::Fp4:
      if (g != quant::block_format_traits(w.block_format).group_size || k % g != 0 || k % 8 != 0) return std::nullopt;
      s.codes = tiles * kk / 2 * kTileRows;
      s.scales = tiles * groups * kTileRows;
      return s;
    case WeightLayout::Int4:
      if (g <= 0 || k % 8 != 0) return std::nullopt;
      s.codes = tiles * kk / 2 * kTileRows;
      s.scales = s.offsets = tiles * groups * kTileRows * sizeof(float);
      return s;
    case WeightLayout::Fp8:
      if (g <= 0) return std::nullopt;
      s.codes = tiles * kk * kTileRows;
      s.scales = tiles * groups * kTileRows * sizeof(float);
      return s;
    case WeightLayout::Int8:
      if (g != k) return std::nullopt;
      s.codes = tiles * kk * kTileRows;
      s.scales = tiles * kTileRows * sizeof(float);
      return s;
    case WeightLayout::Dense:
      s.codes = tiles * kk * kTileRows * (w.dense_storage == DenseStorage::Bf16 ? 2 : 4);
      return s;
  }
  return std::nullopt;
}

struct Blob {
  uint64_t offset = 0, bytes = 0;
};

// entry_to_json and entry_from_json write and read every field of PreparedLinear but activation_precision (chosen at
// load). A field added to PreparedLinear changes its size (232 bytes with 64-bit libstdc++): add it to both, then
// update this size.
static_assert(sizeof(PreparedLinear) == 232, "PreparedLinear changed: store the new field in the weight cache");

// One layer of the index: PreparedLinear's fields and where its buffers lie.
struct Entry {
  std::string fingerprint;
  PreparedLinear fields;  // no buffers
  Blob codes, scales, offsets, global_scale, bias, k_perm;
};

template <typename E>
E enum_at(const nlohmann::json& j, const char* name, int count) {
  const int v = j.at(name).get<int>();
  if (v < 0 || v >= count) throw std::out_of_range(fmt::format("{} {} is out of range 0 … {}", name, v, count - 1));
  return static_cast<E>(v);
}

Blob blob_at(const nlohmann::json& j, const char* name, uint64_t data_end) {
  const auto pair = j.at(name).get<std::array<uint64_t, 2>>();
  const Blob b{pair[0], pair[1]};
  if (b.bytes > 0 && (b.offset % 64 != 0 || b.offset < kHeaderBytes || b.offset > data_end || b.bytes > data_end - b.offset)) {
    throw std::out_of_range(fmt::format("{} [{}, {}) lies outside the data [{}, {})", name, b.offset,
                                        b.offset + b.bytes, kHeaderBytes, data_end));
  }
  return b;
}

Entry entry_from_json(const nlohmann::json& j, uint64_t data_end) {
  Entry e;
  e.fingerprint = j.at("fingerprint").get<std::string>();
  PreparedLinear& w = e.fields;
  // The enums' sizes: their last value + 1 (a value added to an enum must be added here).
  w.layout = enum_at<WeightLayout>(j, "layout", static_cast<int>(WeightLayout::Dense) + 1);
  w.block_format = enum_at<quant::BlockFormat>(j, "block_format", static_cast<int>(quant::BlockFormat::Mxfp4) + 1);
  w.convention = enum_at<GlobalScaleConvention>(j, "convention", static_cast<int>(GlobalScaleConvention::Multiplier) + 1);
  w.dense_storage = enum_at<DenseStorage>(j, "dense_storage", static_cast<int>(DenseStorage::F32) + 1);
  w.out_features = j.at("out_features").get<int64_t>();
  w.in_features = j.at("in_features").get<int64_t>();
  w.padded_rows = j.at("padded_rows").get<int64_t>();
  w.group_size = j.at("group_size").get<int64_t>();
  w.input_global_scale = std::bit_cast<float>(j.at("input_global_scale_bits").get<uint32_t>());
  e.codes = blob_at(j, "codes", data_end);
  e.scales = blob_at(j, "scales", data_end);
  e.offsets = blob_at(j, "offsets", data_end);
  e.global_scale = blob_at(j, "global_scale", data_end);
  e.bias = blob_at(j, "bias", data_end);
  e.k_perm = blob_at(j, "k_perm", data_end);
  const std::optional<BufferSizes> sizes = buffer_sizes(w);
  if (!sizes) {
    throw std::out_of_range(fmt::format("the fields of {} do not make a layout (layout {}, N {}, K {}, padded rows {}, "
                                        "group size {})", e.fingerprint, static_cast<int>(w.layout), w.out_features,
                                        w.in_features, w.padded_rows, w.group_size));
  }
  if (sizes->codes != e.codes.bytes || sizes->scales != e.scales.bytes || sizes->offsets != e.offsets.bytes) {
    throw std::out_of_range(fmt::format("the buffers of {} do not match its layout: codes / scales / offsets of {} / "
                                        "{} / {} bytes, expected {} / {} / {}", e.fingerprint, e.codes.bytes,
                                        e.scales.bytes, e.offsets.bytes, sizes->codes, sizes->scales, sizes->offsets));
  }
  const auto floats = [](int64_t n) { return static_cast<uint64_t>(n) * sizeof(float); };
  if ((e.global_scale.bytes != 0 && e.global_scale.bytes != floats(w.padded_rows)) ||
      (e.bias.bytes != 0 && e.bias.bytes != floats(w.out_features)) ||
      (e.k_perm.bytes != 0 && e.k_perm.bytes != floats(w.in_features))) {
    throw std::out_of_range(fmt::format("the scales, bias or permutation of {} do not match its shape", e.fingerprint));
  }
  return e;
}

nlohmann::json entry_to_json(const std::string& fingerprint, const PreparedLinear& w,
                             const std::array<Blob, 6>& blobs) {
  const auto pair = [](const Blob& b) { return std::array<uint64_t, 2>{b.offset, b.bytes}; };
  return {{"fingerprint", fingerprint},
          {"layout", static_cast<int>(w.layout)},
          {"block_format", static_cast<int>(w.block_format)},
          {"convention", static_cast<int>(w.convention)},
          {"dense_storage", static_cast<int>(w.dense_storage)},
          {"out_features", w.out_features},
          {"in_features", w.in_features},
          {"padded_rows", w.padded_rows},
          {"group_size", w.group_size},
          {"input_global_scale_bits", std::bit_cast<uint32_t>(w.input_global_scale)},
          {"codes", pair(blobs[0])},
          {"scales", pair(blobs[1])},
          {"offsets", pair(blobs[2])},
          {"global_scale", pair(blobs[3])},
          {"bias", pair(blobs[4])},
          {"k_perm", pair(blobs[5])}};
}

bool pread_all(int fd, void* out, size_t bytes, uint64_t offset) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    bytes -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

// "line 3 differs: 'file model.safetensors 2373877776 bytes …' is now '…'": what changed between two keys.
std::string key_difference(const std::string& stored, const std::string& now) {
  std::istringstream a(stored), b(now);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ha = static_cast<bool>(std::getline(a, la)), hb = static_cast<bool>(std::getline(b, lb));
    if (!ha && !hb) return "the keys differ";
    if (!ha || !hb || la != lb) {
      return fmt::format("written for another build or checkpoint state: '{}' is now '{}'", ha ? la : "",
                         hb ? lb : "");
    }
  }
}

}  // namespace

std::string weight_fingerprint(const quant::LinearWeights& w) {
  std::string out = fmt::format("enc {} fmt {} conv {} K {} g {} fp8 {}x{} requant {} igs {:08x}",
                                static_cast<int>(w.encoding), static_cast<int>(w.block_format),
                                static_cast<int>(w.convention), w.in_features, w.group_size, w.fp8_block[0],
                                w.fp8_block[1], static_cast<int>(w.requant), std::bit_cast<uint32_t>(w.input_global_scale));
  for (const quant::WeightRows& r : w.rows) {
    out += fmt::format(" | {} w {} s {} gs {:08x}", r.name, view_text(r.weight), view_text(r.weight_scale),
                       std::bit_cast<uint32_t>(r.global_scale));
    if (r.has_zero_point) out += " zp " + view_text(r.zero_point);
    if (r.has_g_idx) out += " g_idx " + view_text(r.g_idx);
    if (r.has_bias) out += " bias " + view_text(r.bias);
  }
  return out;
}

std::filesystem::path weight_cache_file(const std::filesystem::path& dir, const std::string& identity,
                                        const std::string& label) {
  std::string name;
  for (const char c : label) {
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                       c == '_' || c == '-';
    if (plain && name.size() < 64) name += c;
  }
  return dir / fmt::format("{}{}{:016x}.fp4w", name, name.empty() ? "" : "-", fnv1a(identity.data(), identity.size()));
}

struct WeightCache::Mapped {
  core::MappedFile file;
  std::vector<Entry> entries;
  std::unordered_map<std::string, std::vector<size_t>> by_fingerprint;  // entries of a name, in file order
  std::unordered_map<std::string, size_t> next;                         // how many of them find() handed out

  Mapped(int fd, const std::filesystem::path& path) : file(fd, path, core::MappedFile::Pages::Populate) {}

  // Entry `index` as a layer: buffers viewing the mapping (kept alive by `self`), the small vectors copied.
  PreparedLinear layer(size_t index, const std::shared_ptr<const Mapped>& self) const {
    const Entry& e = entries[index];
    const std::byte* base = file.bytes().data();
    PreparedLinear w = e.fields.clone();
    w.codes = AlignedBuffer::view(self, base + e.codes.offset, e.codes.bytes);
    w.scales = AlignedBuffer::view(self, base + e.scales.offset, e.scales.bytes);
    w.offsets = AlignedBuffer::view(self, base + e.offsets.offset, e.offsets.bytes);
    const auto copy = [base]<typename T>(const Blob& b, std::vector<T>& out) {
      out.resize(b.bytes / sizeof(T));
      if (b.bytes > 0) std::memcpy(out.data(), base + b.offset, b.bytes);
    };
    copy(e.global_scale, w.global_scale);
    copy(e.bias, w.bias);
    copy(e.k_perm, w.k_perm);
    return w;
  }
};

struct WeightCache::Writer {
  std::filesystem::path temporary;
  int fd = -1;
  uint64_t end = kAlign;  // the next buffer's offset
  nlohmann::json layers = nlohmann::json::array();
  double seconds = 0.0;
};

WeightCache::WeightCache(std::filesystem::path file, std::string key, uint64_t expected_bytes)
    : file_(std::move(file)), key_(std::move(key)), expected_bytes_(expected_bytes) {
  report_.file = file_;
  const int fd = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    report_.not_used = errno == ENOENT ? "no file yet" : fmt::format("cannot open it: {}", std::strerror(errno));
    return;
  }
  std::string why;
  nlohmann::json index;
  uint64_t index_offset = 0;
  {
    struct stat st {};
    std::array<char, kHeaderBytes> header{};
    uint64_t index_bytes = 0, checksum = 0;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
        !pread_all(fd, header.data(), header.size(), 0) || std::memcmp(header.data(), kMagic.data(), kMagic.size()) != 0) {
      why = "not a weight cache file of this version (header)";
    } else {
      std::memcpy(&index_offset, header.data() + 8, 8);
      std::memcpy(&index_bytes, header.data() + 16, 8);
      std::memcpy(&checksum, header.data() + 24, 8);
      const auto size = static_cast<uint64_t>(st.st_size);
      std::string text;
      if (index_offset < kHeaderBytes || index_offset > size || index_bytes != size - index_offset ||
          index_bytes > (uint64_t{1} << 30)) {
        why = fmt::format("truncated or malformed: index at {} of {} bytes, file of {}", index_offset, index_bytes, size);
      } else if (text.resize(index_bytes); !pread_all(fd, text.data(), text.size(), index_offset)) {
        why = fmt::format("cannot read its index: {}", std::strerror(errno));
      } else if (fnv1a(text.data(), text.size()) != checksum) {
        why = "its index fails the checksum";
      } else {
        index = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (!index.is_object()) why = "its index is not a JSON object";
      }
    }
  }
  if (why.empty()) {
    try {
      const std::string stored = index.at("key").get<std::string>();
      if (stored != key_) {
        why = key_difference(stored, key_);
      } else {
        std::vector<Entry> entries;
        for (const nlohmann::json& j : index.at("layers")) entries.push_back(entry_from_json(j, index_offset));
        // The descriptor whose index was read: a file renamed over this one meanwhile is not mapped under it.
        auto mapped = std::make_shared<Mapped>(fd, file_);
        if (mapped->file.bytes().size() < index_offset) throw std::out_of_range("the file shrank while being opened");
        mapped->entries = std::move(entries);
        for (size_t i = 0; i < mapped->entries.size(); ++i) {
          mapped->by_fingerprint[mapped->entries[i].fingerprint].push_back(i);
        }
        mapped_ = std::move(mapped);
      }
    } catch (const std::exception& e) {  // nlohmann's type / out-of-range errors, ours, IoError from the mapping
      why = fmt::format("malformed: {}", e.what());
    }
  }
  ::close(fd);
  if (!why.empty()) report_.not_used = why;
}

WeightCache::~WeightCache() {
  if (writer_ != nullptr) {
    ::close(writer_->fd);
    std::error_code ec;
    std::filesystem::remove(writer_->temporary, ec);
  }
}

std::optional<PreparedLinear> WeightCache::find(const std::string& fingerprint) {
  if (mapped_ == nullptr || finished_) return std::nullopt;
  const auto it = mapped_->by_fingerprint.find(fingerprint);
  if (it == mapped_->by_fingerprint.end()) return std::nullopt;
  size_t& next = mapped_->next[fingerprint];
  if (next >= it->second.size()) return std::nullopt;
  const size_t index = it->second[next];
  PreparedLinear w = mapped_->layer(index, mapped_);
  for (const int32_t column : w.k_perm) {
    if (column < 0 || column >= w.in_features) return std::nullopt;  // the kernels gather x through it
  }
  ++next;
  found_.push_back(index);
  report_.layers_mapped += 1;
  report_.bytes_mapped += weight_bytes(w);
  if (writer_ != nullptr) append(fingerprint, w);
  return w;
}

namespace {

// Whether a cached layer has the shape and layout the repack of `w` makes: a file that lies about them never
// reaches a kernel (which would read x and write y by the cached N and K).
bool fits(const PreparedLinear& c, const quant::LinearWeights& w) {
  if (c.out_features != w.out_features() || c.in_features != w.in_features) return false;
  switch (w.encoding) {
    case quant::WeightEncoding::Fp4:
      return c.layout == WeightLayout::Fp4 && c.block_format == w.block_format &&
             c.group_size == quant::block_format_traits(w.block_format).group_size;
    case quant::WeightEncoding::Int4: return c.layout == WeightLayout::Int4;
    case quant::WeightEncoding::Fp8: return c.layout == WeightLayout::Fp8;
    case quant::WeightEncoding::Dense:
      switch (w.requant) {
        case quant::DenseRequant::None: return c.layout == WeightLayout::Dense;
        case quant::DenseRequant::Fp8Rows: return c.layout == WeightLayout::Fp8;
        case quant::DenseRequant::Int8Rows: return c.layout == WeightLayout::Int8;
      }
      return false;
  }
  return false;
}

}  // namespace

std::optional<PreparedLinear> WeightCache::find(const quant::LinearWeights& weights) {
  const std::string fingerprint = weight_fingerprint(weights);
  if (mapped_ == nullptr || finished_) return std::nullopt;
  const auto it = mapped_->by_fingerprint.find(fingerprint);
  if (it == mapped_->by_fingerprint.end()) return std::nullopt;
  const size_t next = mapped_->next[fingerprint];
  if (next >= it->second.size() || !fits(mapped_->entries[it->second[next]].fields, weights)) return std::nullopt;
  return find(fingerprint);
}

void WeightCache::store(const quant::LinearWeights& weights, const PreparedLinear& w) {
  store(weight_fingerprint(weights), w);
}

void WeightCache::store(const std::string& fingerprint, const PreparedLinear& w) {
  if (finished_) return;
  report_.layers_prepared += 1;
  if (writer_ == nullptr && report_.not_written.empty()) start_writer();
  if (writer_ != nullptr) append(fingerprint, w);
}

void WeightCache::start_writer() {
  const auto t0 = std::chrono::steady_clock::now();
  const std::filesystem::path dir = file_.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    report_.not_written = fmt::format("cannot create {}: {}", dir.string(), ec.message());
    return;
  }
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    const uint64_t free = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (free < expected_bytes_ + kSpaceMargin) {
      report_.not_written = fmt::format("{} free on {}, and the weights need about {} (+ 1 GiB kept free)", gib(free),
                                        dir.string(), gib(expected_bytes_));
      return;
    }
  }
  remove_stale_temporaries();
  auto writer = std::make_unique<Writer>();
  // A name no other writer has (mkstemp: O_EXCL), beside the final file so that the rename stays on its file system.
  std::string name = file_.string() + ".tmp.XXXXXX";
  writer->fd = ::mkostemp(name.data(), O_CLOEXEC);
  writer->temporary = name;
  if (writer->fd < 0) {
    report_.not_written = fmt::format("cannot create {}: {}", name, std::strerror(errno));
    return;
  }
  (void)::fchmod(writer->fd, 0644);
  writer_ = std::move(writer);
  writer_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // A rewrite keeps the layers this load already took from the old file (still mapped: they are copied from it).
  for (const size_t index : std::vector<size_t>(found_)) {
    if (writer_ == nullptr) break;
    PreparedLinear w = mapped_->layer(index, mapped_);
    append(mapped_->entries[index].fingerprint, w);
  }
}

void WeightCache::remove_stale_temporaries() const {
  // A writer that was killed leaves its temporary behind. A live one writes its file at least once per layer, so a
  // temporary of this cache file untouched for an hour has no writer any more.
  std::error_code ec;
  const std::string prefix = file_.filename().string() + ".tmp.";
  const auto now = std::filesystem::file_time_type::clock::now();
  for (std::filesystem::directory_iterator it(file_.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    std::error_code time_ec;
    const auto modified = std::filesystem::last_write_time(it->path(), time_ec);
    if (!time_ec && now - modified > std::chrono::hours(1)) std::filesystem::remove(it->path(), time_ec);
  }
}

void WeightCache::append(const std::string& fingerprint, const PreparedLinear& w) {
  const auto t0 = std::chrono::steady_clock::now();
  Writer& out = *writer_;
  const std::array<std::pair<const void*, size_t>, 6> buffers{{
      {w.codes.data(), w.codes.size()},
      {w.scales.data(), w.scales.size()},
      {w.offsets.data(), w.offsets.size()},
      {w.global_scale.data(), w.global_scale.size() * sizeof(float)},
      {w.bias.data(), w.bias.size() * sizeof(float)},
      {w.k_perm.data(), w.k_perm.size() * sizeof(int32_t)},
  }};
  // The layer is one region: each buffer at a page boundary, zeros between them. A region of a huge page or more
  // starts and ends at a huge-page boundary and goes out in one write, so that the page cache holds it in 2 MiB
  // folios (a write's folios are as large as its length and its offset's alignment allow), which the reader maps as
  // huge pages (core::MappedFile::Pages::Populate); the scales then do not sit on 4 KiB pages between two layers.
  static const std::vector<char> zeros(kHugeAlign, 0);
  uint64_t size = 0;
  std::array<Blob, 6> blobs{};
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].second == 0) continue;
    size = (size + kAlign - 1) / kAlign * kAlign;
    blobs[i] = {size, buffers[i].second};
    size += buffers[i].second;
  }
  const uint64_t unit = size >= kHugeAlign ? kHugeAlign : kAlign;
  const uint64_t start = (out.end + unit - 1) / unit * unit;
  const uint64_t region = (size + unit - 1) / unit * unit;
  std::vector<iovec> pieces;
  uint64_t filled = 0;
  const auto pad_to = [&](uint64_t offset) {
    if (offset > filled) pieces.push_back({const_cast<char*>(zeros.data()), static_cast<size_t>(offset - filled)});
    filled = offset;
  };
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].second == 0) continue;
    pad_to(blobs[i].offset);
    pieces.push_back({const_cast<void*>(buffers[i].first), buffers[i].second});
    filled += buffers[i].second;
    blobs[i].offset += start;
  }
  pad_to(region);
  uint64_t at = start;
  size_t first = 0;  // pieces before it are written
  while (first < pieces.size()) {
    const ssize_t put = ::pwritev(out.fd, pieces.data() + first, static_cast<int>(std::min<size_t>(pieces.size() - first, 512)),
                                  static_cast<off_t>(at));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      abandon(fmt::format("writing {} failed: {}", out.temporary.string(),
                          put < 0 ? std::strerror(errno) : "the file system took no bytes"));
      return;
    }
    at += static_cast<uint64_t>(put);
    for (auto left = static_cast<size_t>(put); left > 0;) {  // skip what was written, maybe part of a piece
      const size_t take = std::min(left, pieces[first].iov_len);
      pieces[first].iov_base = static_cast<char*>(pieces[first].iov_base) + take;
      pieces[first].iov_len -= take;
      left -= take;
      if (pieces[first].iov_len == 0) ++first;
    }
    while (first < pieces.size() && pieces[first].iov_len == 0) ++first;
  }
  out.end = start + region;
  // Start the region's writeback now, while the next layers are repacked: finish()'s flush then waits for less.
  (void)::sync_file_range(out.fd, static_cast<off_t>(start), static_cast<off_t>(region), SYNC_FILE_RANGE_WRITE);
  out.layers.push_back(entry_to_json(fingerprint, w, blobs));
  out.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void WeightCache::abandon(const std::string& why) {
  ::close(writer_->fd);
  std::error_code ec;
  std::filesystem::remove(writer_->temporary, ec);
  writer_.reset();
  report_.not_written = why;
}

WeightCacheReport WeightCache::finish() {
  if (finished_) return report_;
  finished_ = true;
  if (writer_ == nullptr) return report_;
  const auto t0 = std::chrono::steady_clock::now();
  Writer& out = *writer_;
  const std::string index = nlohmann::json{{"key", key_}, {"layers", out.layers}}.dump();
  std::array<char, kHeaderBytes> header{};
  std::memcpy(header.data(), kMagic.data(), kMagic.size());
  const uint64_t index_offset = out.end, index_bytes = index.size(), checksum = fnv1a(index.data(), index.size());
  std::memcpy(header.data() + 8, &index_offset, 8);
  std::memcpy(header.data() + 16, &index_bytes, 8);
  std::memcpy(header.data() + 24, &checksum, 8);
  const auto write_at = [&](const char* p, size_t n, uint64_t at) {
    while (n > 0) {
      const ssize_t put = ::pwrite(out.fd, p, n, static_cast<off_t>(at));
      if (put < 0 && errno == EINTR) continue;
      if (put == 0) errno = ENOSPC;  // no progress: what a full file system does
      if (put <= 0) return false;
      p += put;
      n -= static_cast<size_t>(put);
      at += static_cast<uint64_t>(put);
    }
    return true;
  };
  // The data reaches the disk before the rename makes the file visible: a crash leaves the old file or none.
  if (!write_at(index.data(), index.size(), index_offset) || !write_at(header.data(), header.size(), 0) ||
      ::fdatasync(out.fd) != 0) {
    abandon(fmt::format("writing {} failed: {}", out.temporary.string(), std::strerror(errno)));
    return report_;
  }
  std::error_code ec;
  std::filesystem::rename(out.temporary, file_, ec);
  if (ec) {
    abandon(fmt::format("renaming {} to {} failed: {}", out.temporary.string(), file_.string(), ec.message()));
    return report_;
  }
  ::close(out.fd);
  report_.written = true;
  report_.bytes_written = index_offset + index_bytes;
  report_.write_seconds = out.seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  writer_.reset();
  return report_;
}

}  // namespace fp4serve::prepare
