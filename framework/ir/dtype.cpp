#include <loom/dtype.h>

#include <cassert>

namespace loom {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Int64: return "int64";
    case DType::Int32: return "int32";
    case DType::Bool: return "bool";
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
  }
  assert(false && "unknown dtype");
  return 0;
}

bool is_floating(DType t) { return t == DType::Float32 || t == DType::Float64; }

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
  for (auto d : s) n *= d;
  return n;
}

std::string device_str(Device d) {
  switch (d.type) {
    case DeviceType::CPU: return "cpu:" + std::to_string(d.index);
  }
  return "?";
}

}  // namespace loom
