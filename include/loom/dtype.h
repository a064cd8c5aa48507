// Element types, shapes and devices.
//
//   loom::Shape s{2, 3};
//   loom::dtype_name(loom::DType::Float64);   // "float64"
//   loom::shape_str(s);                       // "[2,3]"
//   loom::Device d = loom::parse_device("cpu:0");
//   loom::device_str(d);                      // "cpu:0"
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace loom {

// BFloat16: the upper half of a float32 (8 exponent bits, 7 mantissa bits), rounded to
// nearest even; see <loom/bfloat16.h>. Mixed precision (<loom/autocast.h>) computes in it.
enum class DType { Float32, Float64, Int64, Int32, Bool, BFloat16 };
inline constexpr int kDTypeCount = 6;

using Shape = std::vector<int64_t>;

// The dtype whose elements are T (float, double, int64_t, int32_t or bool).
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  else if constexpr (std::is_same_v<T, double>) return DType::Float64;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::Int64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::Int32;
  else {
    static_assert(std::is_same_v<T, bool>, "loom tensors hold float, double, int64_t, int32_t or bool");
    return DType::Bool;
  }
}

const char* dtype_name(DType t);
std::size_t dtype_size(DType t);
bool is_floating(DType t);  // float32, float64, bfloat16
// "float32", "bfloat16", ... back to the dtype; throws naming the accepted names.
DType parse_dtype(std::string_view name);
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// A kind of device. The CPU is built in; every other kind is registered by its backend
// under a name ("cuda", or the test suite's "guarded") and numbered in registration order,
// so this enum names only the CPU.
enum class DeviceType : uint8_t { CPU = 0 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
};

// "cpu:0", "guarded:1".
std::string device_str(Device d);
// "cpu", "cpu:0", "guarded:1" (no index: 0). Throws naming the registered kinds when the
// kind is unknown; throws too when the text is not "kind" or "kind:index".
Device parse_device(std::string_view text);
// The name a kind was registered under ("cpu" for the CPU).
std::string device_type_name(DeviceType type);
// How many devices of a kind this process can use: 0 for a kind built in without devices
// here (CUDA on a machine without a GPU or driver).
int device_count(DeviceType type);

}  // namespace loom
