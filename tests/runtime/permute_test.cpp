// The permute kernel against the definition out[i] = x[perm applied to i], bit for bit, for
// float32 and bfloat16 tensors large enough for oneDNN's reorder (kernels_movement.cpp's
// onednn_transposes) and for loom's own tiles: every permutation of a rank-4 tensor, ResNet
// activation shapes both ways between NCHW and NHWC (the float32 32-channel pattern kept on the
// tiles among them), a rank-3 transpose, and every bit pattern, NaNs with payloads (signalling
// ones too) and subnormals included: a permute moves bits, it converts nothing.
#include "ir/attr.h"
#include "ir/op.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

// x's bits permuted by definition: out's multi-index i reads x at the index whose dimension
// perm[d] is i[d].
std::vector<uint8_t> permuted(const std::vector<uint8_t>& x, const Shape& shape,
                              const std::vector<int64_t>& perm, std::size_t width) {
  const std::size_t rank = shape.size();
  Shape out_shape(rank);
  for (std::size_t d = 0; d < rank; ++d) out_shape[d] = shape[static_cast<std::size_t>(perm[d])];
  std::vector<int64_t> stride(rank, 1);
  for (std::size_t d = rank - 1; d-- > 0;) stride[d] = stride[d + 1] * shape[d + 1];
  std::vector<uint8_t> out(x.size());
  std::vector<int64_t> idx(rank, 0);
  for (std::size_t o = 0; o < x.size() / width; ++o) {
    int64_t from = 0;
    for (std::size_t d = 0; d < rank; ++d)
      from += idx[d] * stride[static_cast<std::size_t>(perm[d])];
    std::memcpy(&out[o * width], &x[static_cast<std::size_t>(from) * width], width);
    for (std::size_t d = rank; d-- > 0;) {
      if (++idx[d] < out_shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

void check(const Shape& shape, const std::vector<int64_t>& perm, DType dtype) {
  const std::size_t width = dtype == DType::Float32 ? 4 : 2;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<uint8_t> x(static_cast<std::size_t>(n) * width);
  std::mt19937_64 rng(static_cast<uint64_t>(n) * 31 + perm[0]);
  for (auto& b : x) b = static_cast<uint8_t>(rng());
  Shape out_shape;
  for (int64_t p : perm) out_shape.push_back(shape[static_cast<std::size_t>(p)]);
  std::vector<uint8_t> got(x.size());
  const std::vector<TensorView> in{{x.data(), dtype, shape}};
  run_kernel(ir::Op::Permute, ir::PermuteAttr{perm}, in, {got.data(), dtype, out_shape});
  std::string p;
  for (int64_t d : perm) p += std::to_string(d);
  ASSERT_TRUE(got == permuted(x, shape, perm, width))
      << dtype_name(dtype) << " [" << shape[0] << ",...] perm " << p;
}

TEST(Permute, MovesEveryBitAsDefined) {
  // The first transpose of a new shape makes oneDNN's reorder (the tests below cover it).
  const int64_t made = onednn::primitives_created();
  check({8, 40, 24, 24}, {0, 2, 3, 1}, DType::Float32);
  EXPECT_EQ(onednn::primitives_created(), made + 1);
  for (DType dtype : {DType::Float32, DType::BFloat16}) {
    std::vector<int64_t> perm{0, 1, 2, 3};
    do {
      check({6, 10, 24, 36}, perm, dtype);  // 51,840 elements: every permutation
    } while (std::next_permutation(perm.begin(), perm.end()));
    for (const Shape& s : {Shape{32, 64, 32, 32}, Shape{128, 16, 32, 32}, Shape{32, 32, 32, 32},
                           Shape{32, 16, 16, 32}, Shape{32, 512, 4, 4}, Shape{128, 8, 8, 64}}) {
      check(s, {0, 2, 3, 1}, dtype);  // NCHW to NHWC
      check(s, {0, 3, 1, 2}, dtype);  // NHWC to NCHW
    }
    check({64, 48, 40}, {0, 2, 1}, dtype);
    check({300, 200}, {1, 0}, dtype);
  }
}

}  // namespace
}  // namespace loom::runtime
