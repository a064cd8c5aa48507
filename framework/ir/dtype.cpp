#include <loom/dtype.h>

#include "ir/device_type.h"

#include <loom/error.h>

#include <cassert>
#include <charconv>
#include <mutex>

namespace loom {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::Bool: return "bool";
    case DType::BFloat16: return "bfloat16";
  }
  assert(false && "unknown dtype");
  return "?";
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::Int32: return 4;
    case DType::Bool: return 1;
    case DType::BFloat16: return 2;
  }
  assert(false && "unknown dtype");
  return 0;
}

bool is_floating(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::BFloat16;
}

DType parse_dtype(std::string_view name) {
  std::string known;
  for (int i = 0; i < kDTypeCount; ++i) {
    const auto t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
    known += std::string(known.empty() ? "" : ", ") + dtype_name(t);
  }
  throw Error("unknown dtype '" + std::string(name) + "' (known: " + known + ")");
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s)
    if (__builtin_mul_overflow(n, d, &n))
      throw Error("shape " + shape_str(s) + " has more elements than an int64 counts");
  return n;
}

namespace {

struct DeviceTypes {
  std::mutex mutex;
  std::vector<std::string> names{"cpu"};
};

DeviceTypes& device_types() {
  static auto* t = new DeviceTypes;  // leaked: named in messages until the very end
  return *t;
}

}  // namespace

namespace ir {

DeviceType register_device_type(std::string_view name) {
  auto& t = device_types();
  std::lock_guard lock(t.mutex);
  for (std::size_t i = 0; i < t.names.size(); ++i)
    if (t.names[i] == name) return static_cast<DeviceType>(i);
  if (t.names.size() > 255) throw Error("register_device_type: too many device kinds");
  t.names.emplace_back(name);
  return static_cast<DeviceType>(t.names.size() - 1);
}

std::vector<std::string> device_type_names() {
  auto& t = device_types();
  std::lock_guard lock(t.mutex);
  return t.names;
}

}  // namespace ir

std::string device_type_name(DeviceType type) {
  auto& t = device_types();
  std::lock_guard lock(t.mutex);
  auto i = static_cast<std::size_t>(type);
  return i < t.names.size() ? t.names[i] : "device" + std::to_string(i);
}

std::string device_str(Device d) { return device_type_name(d.type) + ":" + std::to_string(d.index); }

}  // namespace loom
