// Random ops: rand and randn (seeded; the seed is a 0-d input, so a new seed never
// recompiles), and uniform and normal over them.
#include "lazy/ops_util.h"

namespace loom {

namespace {
Tensor random(ir::Op op, const char* name, const Shape& shape, uint64_t seed, DType dtype, Device device) {
  if (!is_floating(dtype))
    throw Error(std::string(name) + ": expected a floating-point dtype, got " + dtype_name(dtype));
  auto s = static_cast<int64_t>(seed);
  auto seed_tensor = from_host(&s, DType::Int64, {}, device);
  return lazy::apply(op, {seed_tensor}, ir::RandomAttr{shape, dtype});
}
}  // namespace

Tensor rand(const Shape& shape, const Tensor& seed, DType dtype) {
  if (!is_floating(dtype)) throw Error(std::string("rand: expected a floating-point dtype, got ") + dtype_name(dtype));
  if (!seed.defined() || seed.dtype() != DType::Int64 || seed.dim() != 0)
    throw Error("rand: expected a 0-d int64 seed tensor, got " +
                (seed.defined() ? std::string(dtype_name(seed.dtype())) + shape_str(seed.shape()) : std::string("none")));
  return lazy::apply(ir::Op::RandUniform, {seed}, ir::RandomAttr{shape, dtype});
}

Tensor rand(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  return random(ir::Op::RandUniform, "rand", shape, seed, dtype, device);
}

Tensor randn(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  return random(ir::Op::RandNormal, "randn", shape, seed, dtype, device);
}

Tensor uniform(const Shape& shape, double low, double high, uint64_t seed, DType dtype, Device device) {
  if (!(high > low)) throw Error("uniform: expected low < high, got " + std::to_string(low) +
                                 " and " + std::to_string(high));
  return rand(shape, seed, dtype, device) * (high - low) + low;
}

Tensor normal(const Shape& shape, double mean, double stddev, uint64_t seed, DType dtype, Device device) {
  if (!(stddev >= 0)) throw Error("normal: expected stddev >= 0, got " + std::to_string(stddev));
  return randn(shape, seed, dtype, device) * stddev + mean;
}

}  // namespace loom
