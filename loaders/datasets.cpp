// The in-memory, synthetic and token-window datasets, and Dataset's default batch read.
#include "random.h"

#include <loom/data/dataset.h>

#include <cmath>

namespace loom::data {

std::vector<Example> Dataset::get_batch(std::span<const int64_t> indices) const {
  std::vector<Example> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(get(i));
  return out;
}

namespace {

void check_index(const char* who, int64_t index, int64_t size) {
  if (index < 0 || index >= size)
    throw Error(std::string(who) + ": index " + std::to_string(index) + " out of range [0, " +
                std::to_string(size) + ")");
}

// Row `index` of a [N, ...] array as its own array of shape [...].
HostArray row_of(const HostArray& a, int64_t index) {
  HostArray r(a.dtype, Shape(a.shape.begin() + 1, a.shape.end()));
  if (!r.bytes.empty())
    std::memcpy(r.bytes.data(), a.bytes.data() + static_cast<std::size_t>(index) * r.bytes.size(),
                r.bytes.size());
  return r;
}

}  // namespace

InMemoryDataset::InMemoryDataset(std::map<std::string, HostArray> columns)
    : columns_(std::move(columns)) {
  if (columns_.empty()) throw Error("InMemoryDataset: expected at least one array, got none");
  bool first = true;
  for (const auto& [name, a] : columns_) {
    if (a.shape.empty())
      throw Error("InMemoryDataset: array '" + name + "' must have a sample dimension, got " +
                  a.str());
    if (a.bytes.size() != static_cast<std::size_t>(a.numel()) * a.element_size())
      throw Error("InMemoryDataset: array '" + name + "' holds " + std::to_string(a.bytes.size()) +
                  " bytes, expected " + std::to_string(a.numel() * a.element_size()) + " for " +
                  a.str());
    if (first) size_ = a.shape[0];
    else if (a.shape[0] != size_)
      throw Error("InMemoryDataset: arrays have different lengths: '" + columns_.begin()->first +
                  "' has " + std::to_string(size_) + ", '" + name + "' has " +
                  std::to_string(a.shape[0]));
    first = false;
  }
}

Example InMemoryDataset::get(int64_t index) const {
  check_index("InMemoryDataset", index, size_);
  Example e;
  for (const auto& [name, a] : columns_) e[name] = row_of(a, index);
  return e;
}

SyntheticDataset::SyntheticDataset(int64_t size, std::map<std::string, FieldSpec> fields,
                                   uint64_t seed)
    : size_(size), fields_(std::move(fields)), seed_(seed) {
  if (size_ < 0) throw Error("SyntheticDataset: expected a non-negative size, got " + std::to_string(size));
  for (const auto& [name, f] : fields_) {
    if (!(f.high > f.low))
      throw Error("SyntheticDataset: field '" + name + "' needs low < high, got [" +
                  std::to_string(f.low) + ", " + std::to_string(f.high) + ")");
    // Integer values are floor(low + u (high - low)), u in [0, 1): [low, high) must be the
    // dtype's to hold.
    double lo = 0, hi = 0;
    switch (f.dtype) {
      case HostDType::UInt8: lo = 0, hi = 0x1p8; break;
      case HostDType::Int32: lo = -0x1p31, hi = 0x1p31; break;
      case HostDType::Int64: lo = -0x1p63, hi = 0x1p63; break;
      default: continue;
    }
    if (f.low < lo || f.high > hi)
      throw Error("SyntheticDataset: field '" + name + "' is " + host_dtype_name(f.dtype) + ", which cannot hold [" +
                  std::to_string(f.low) + ", " + std::to_string(f.high) + ")");
  }
}

Example SyntheticDataset::get(int64_t index) const {
  check_index("SyntheticDataset", index, size_);
  Example e;
  uint64_t field_no = 0;
  for (const auto& [name, f] : fields_) {
    HostArray a(f.dtype, f.shape);
    detail::SplitMix64 rng(detail::hash_words({seed_, static_cast<uint64_t>(index), field_no++}));
    const int64_t n = a.numel();
    for (int64_t i = 0; i < n; ++i) {
      double u = static_cast<double>(rng.next() >> 11) * 0x1.0p-53;
      double v = f.low + u * (f.high - f.low);
      switch (a.dtype) {
        case HostDType::UInt8: a.data<uint8_t>()[i] = static_cast<uint8_t>(std::floor(v)); break;
        case HostDType::Int32: a.data<int32_t>()[i] = static_cast<int32_t>(std::floor(v)); break;
        case HostDType::Int64: a.data<int64_t>()[i] = static_cast<int64_t>(std::floor(v)); break;
        case HostDType::Float32: a.data<float>()[i] = static_cast<float>(v); break;
        case HostDType::Float64: a.data<double>()[i] = v; break;
        case HostDType::Bool: a.bytes[static_cast<std::size_t>(i)] = v >= 0.5 * (f.low + f.high); break;
      }
    }
    e[name] = std::move(a);
  }
  return e;
}

TokenWindowDataset::TokenWindowDataset(HostArray tokens, int64_t seq_len, TokenWindowOptions options,
                                       std::string source)
    : tokens_(std::move(tokens)), seq_len_(seq_len), options_(options), source_(std::move(source)) {
  const std::string who = "TokenWindowDataset ('" + source_ + "')";
  if (tokens_.shape.size() != 1)
    throw Error(who + ": expected a 1-D token array, got " + tokens_.str());
  if (is_floating(tokens_.dtype) || tokens_.dtype == HostDType::Bool)
    throw Error(who + ": expected integer tokens, got " + tokens_.str());
  if (seq_len_ < 1) throw Error(who + ": expected seq_len >= 1, got " + std::to_string(seq_len_));
  const int64_t n = tokens_.shape[0];
  if (n < seq_len_ + 1)
    throw Error(who + ": " + std::to_string(n) + " tokens cannot hold one window of seq_len + 1 = " +
                std::to_string(seq_len_ + 1));
  const int64_t tiles = (n - 1) / seq_len_;
  windows_ = options_.windows > 0 ? options_.windows : tiles;
  if (!options_.random && windows_ > tiles)
    throw Error(who + ": " + std::to_string(windows_) + " sequential windows of " +
                std::to_string(seq_len_) + " need more than the " + std::to_string(n) + " tokens");
  if (options_.range) check_values(tokens_, *options_.range, who, 0, "token");
}

int64_t TokenWindowDataset::window_start(int64_t index, int64_t epoch) const {
  if (!options_.random) return index * seq_len_;
  const auto starts = static_cast<uint64_t>(tokens_.shape[0] - seq_len_);  // valid starts
  uint64_t bits = detail::hash_words({options_.seed, static_cast<uint64_t>(epoch),
                                      static_cast<uint64_t>(index), 0x746f6b656e73ULL});
  return static_cast<int64_t>(detail::bounded(bits, starts));
}

Example TokenWindowDataset::get(int64_t index) const {
  check_index("TokenWindowDataset", index, windows_);
  const int64_t start = window_start(index, epoch_.load());
  HostArray input(HostDType::Int64, {seq_len_});
  HostArray target(HostDType::Int64, {seq_len_});
  int64_t* in = input.data<int64_t>();
  int64_t* out = target.data<int64_t>();
  auto read = [&](auto* p) {
    for (int64_t i = 0; i < seq_len_; ++i) {
      in[i] = static_cast<int64_t>(p[start + i]);
      out[i] = static_cast<int64_t>(p[start + i + 1]);
    }
  };
  switch (tokens_.dtype) {
    case HostDType::UInt8: read(tokens_.data<uint8_t>()); break;
    case HostDType::Int32: read(tokens_.data<int32_t>()); break;
    case HostDType::Int64: read(tokens_.data<int64_t>()); break;
    case HostDType::Float32:
    case HostDType::Float64:
    case HostDType::Bool: break;  // rejected by the constructor
  }
  Example e;
  e["input"] = std::move(input);
  e["target"] = std::move(target);
  return e;
}

}  // namespace loom::data
