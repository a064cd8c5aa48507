// Datasets: indexable collections of examples, each a set of named host arrays.
//
//   // Fake data shaped like Fashion-MNIST, deterministic per (seed, index):
//   auto fake = std::make_shared<loom::data::SyntheticDataset>(
//       60000, std::map<std::string, loom::data::FieldSpec>{
//                  {"input", {loom::data::HostDType::UInt8, {1, 28, 28}, 0, 256}},
//                  {"target", {loom::data::HostDType::Int64, {}, 0, 10}}});
//   loom::data::Example e = fake->get(7);          // e.at("input"): uint8 [1,28,28]
//
//   // Your own data: subclass Dataset (get() must be safe to call from several threads).
//   class Squares : public loom::data::Dataset {
//     int64_t size() const override { return 100; }
//     loom::data::Example get(int64_t i) const override {
//       loom::data::Example e;
//       e["input"] = loom::data::HostArray::from_vector<float>({float(i)}, {1});
//       e["target"] = loom::data::HostArray::from_vector<float>({float(i * i)}, {1});
//       return e;
//     }
//   };
//
// Examples live on the host and may hold uint8 (images as stored); loom tensors have no uint8,
// so a transform (to_float, cast) converts such fields before the DeviceLoader collates them.
#pragma once

#include <loom/dtype.h>
#include <loom/error.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::data {

// Element types of host arrays: loom's dtypes plus uint8.
enum class HostDType { UInt8, Int32, Int64, Float32, Float64, Bool };

const char* host_dtype_name(HostDType t);
std::size_t host_dtype_size(HostDType t);
bool is_floating(HostDType t);
// The loom dtype a host array becomes on the device; nullopt for uint8.
std::optional<DType> device_dtype(HostDType t);
HostDType host_dtype(DType t);

template <class T>
constexpr HostDType host_dtype_of();
template <> constexpr HostDType host_dtype_of<uint8_t>() { return HostDType::UInt8; }
template <> constexpr HostDType host_dtype_of<int32_t>() { return HostDType::Int32; }
template <> constexpr HostDType host_dtype_of<int64_t>() { return HostDType::Int64; }
template <> constexpr HostDType host_dtype_of<float>() { return HostDType::Float32; }
template <> constexpr HostDType host_dtype_of<double>() { return HostDType::Float64; }
template <> constexpr HostDType host_dtype_of<bool>() { return HostDType::Bool; }

// A contiguous row-major array in host memory.
struct HostArray {
  HostDType dtype = HostDType::Float32;
  Shape shape;
  std::vector<unsigned char> bytes;

  HostArray() = default;
  // Zero-filled.
  HostArray(HostDType dtype, Shape shape);

  template <class T>
  static HostArray from_vector(const std::vector<T>& values, Shape shape) {
    HostArray a(host_dtype_of<T>(), std::move(shape));
    if (static_cast<int64_t>(values.size()) != a.numel())
      throw Error("HostArray::from_vector: expected " + std::to_string(a.numel()) +
                  " values for shape " + shape_str(a.shape) + ", got " +
                  std::to_string(values.size()));
    if constexpr (std::is_same_v<T, bool>) {
      for (std::size_t i = 0; i < values.size(); ++i) a.bytes[i] = values[i] ? 1 : 0;
    } else if (!values.empty()) {
      std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
    }
    return a;
  }

  // Typed access; throws loom::Error when T does not match dtype.
  template <class T>
  T* data() {
    check_type(host_dtype_of<T>());
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* data() const {
    check_type(host_dtype_of<T>());
    return reinterpret_cast<const T*>(bytes.data());
  }
  // Element i converted to double.
  double at(int64_t i) const;
  int64_t numel() const { return shape_numel(shape); }
  std::size_t element_size() const { return host_dtype_size(dtype); }
  std::string str() const;  // "uint8[1,28,28]"

 private:
  void check_type(HostDType requested) const;
};

// The values an integer field may hold: [low, high), e.g. the classes of a label or the ids of
// a token. Declared where the data enters (HDF5DatasetOptions::ranges, TokenWindowOptions::
// range), it is checked there, before any training: a label 12 among 10 classes then fails
// naming the file, the sample and the value, not as an index error inside a training step.
struct ValueRange {
  int64_t low = 0;
  int64_t high = 0;
  std::string what = "a value";  // for messages: "sample 17 is 12, expected a class in [0, 10)"
};

// Throws loom::Error("<source>: sample 17 is 12, expected a class in [0, 10) (out of range: 1
// of 10000 samples)") for the first element of `values` outside `range`, and when `values` is
// not of an integer dtype or the range is empty. Row i of
// `values` is sample first_sample + i, `unit` names samples in the message ("sample", "token");
// rows of more than one element also name the element.
void check_values(const HostArray& values, const ValueRange& range, const std::string& source,
                  int64_t first_sample = 0, const std::string& unit = "sample");

// One sample: field name → array (e.g. "input", "target").
class Example {
 public:
  // Inserts an empty array when the field is missing (for building examples).
  HostArray& operator[](const std::string& name) { return fields_[name]; }
  // Throws loom::Error naming the missing field and the fields present.
  HostArray& at(const std::string& name);
  const HostArray& at(const std::string& name) const;
  bool contains(const std::string& name) const { return fields_.count(name) != 0; }
  void erase(const std::string& name) { fields_.erase(name); }
  std::vector<std::string> names() const;

  auto begin() { return fields_.begin(); }
  auto end() { return fields_.end(); }
  auto begin() const { return fields_.begin(); }
  auto end() const { return fields_.end(); }
  std::size_t size() const { return fields_.size(); }

 private:
  std::map<std::string, HostArray> fields_;
};

// Stacks examples along a new leading dimension: every example must have the same fields,
// each with one dtype and shape (loom::Error naming the sample and field otherwise).
Example collate(const std::vector<Example>& examples);

// The interface every dataset implements. get() and get_batch() are called concurrently from
// the DeviceLoader's worker threads: they must be thread-safe (const and stateless, or locked).
class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // The examples at `indices`, in that order (indices may repeat). The default calls get()
  // for each; datasets that can read many samples at once (HDF5) override it.
  virtual std::vector<Example> get_batch(std::span<const int64_t> indices) const;
  // Where the data comes from, for error messages: a file and what in it
  // ("data/fortunes.h5 val/tokens"), or "<memory>".
  virtual std::string source() const { return "<memory>"; }
  // Called before each epoch, before any get() of that epoch; for datasets whose samples
  // depend on the epoch (random token windows).
  virtual void set_epoch(int64_t /*epoch*/) {}
};

// Holds whole arrays in memory; sample i is row i of every array.
class InMemoryDataset : public Dataset {
 public:
  // Every array needs at least one dimension, and all the same first dimension.
  explicit InMemoryDataset(std::map<std::string, HostArray> columns);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  const std::map<std::string, HostArray>& columns() const { return columns_; }

 private:
  std::map<std::string, HostArray> columns_;
  int64_t size_ = 0;
};

// One field of a SyntheticDataset: values uniform in [low, high) (integers: floor).
struct FieldSpec {
  HostDType dtype = HostDType::Float32;
  Shape shape;  // per sample
  double low = 0;
  double high = 1;
};

// Fake data of given shapes and dtypes, like the fake data used to benchmark training loops.
// Sample i depends only on (seed, i).
class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(int64_t size, std::map<std::string, FieldSpec> fields, uint64_t seed = 0);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;

 private:
  int64_t size_;
  std::map<std::string, FieldSpec> fields_;
  uint64_t seed_;
};

struct TokenWindowOptions {
  // Windows per epoch; 0 = (tokens - 1) / seq_len, about one pass over the tokens.
  int64_t windows = 0;
  // true: window i of epoch e starts at a random offset drawn from (seed, e, i);
  // false: window i starts at i * seq_len (tiles the tokens; windows must fit).
  bool random = true;
  uint64_t seed = 0;
  // The token ids, e.g. {0, vocab, "a token (--vocab)"}; every token is checked by the
  // constructor. Unset: not checked.
  std::optional<ValueRange> range = std::nullopt;
};

// Next-token prediction windows over a 1-D token array (any integer dtype; uint8 for byte
// level text): sample i holds "input" = tokens[s, s+seq_len) and "target" =
// tokens[s+1, s+seq_len+1), both int64 [seq_len]. `source` names the tokens in messages:
// the file and the HDF5 dataset ("data/fortunes.h5 val/tokens") for tokens read from HDF5.
class TokenWindowDataset : public Dataset {
 public:
  TokenWindowDataset(HostArray tokens, int64_t seq_len, TokenWindowOptions options = {},
                     std::string source = "<memory>");
  int64_t size() const override { return windows_; }
  Example get(int64_t index) const override;
  std::string source() const override { return source_; }
  void set_epoch(int64_t epoch) override { epoch_ = epoch; }
  int64_t seq_len() const { return seq_len_; }
  // The first token of window `index` in `epoch`.
  int64_t window_start(int64_t index, int64_t epoch) const;

 private:
  HostArray tokens_;
  int64_t seq_len_;
  TokenWindowOptions options_;
  std::string source_;
  int64_t windows_ = 0;
  std::atomic<int64_t> epoch_ = 0;
};

}  // namespace loom::data
