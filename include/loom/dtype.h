// Element types, shapes and devices.
//
//   loom::Shape s{2, 3};
//   loom::dtype_name(loom::DType::Float64);   // "float64"
//   loom::shape_str(s);                       // "[2,3]"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {

enum class DType { Float32, Float64, Int64, Int32, Bool };
inline constexpr int kDTypeCount = 5;

using Shape = std::vector<int64_t>;

const char* dtype_name(DType t);
std::size_t dtype_size(DType t);
bool is_floating(DType t);
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

enum class DeviceType { CPU };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
};

std::string device_str(Device d);

}  // namespace loom
