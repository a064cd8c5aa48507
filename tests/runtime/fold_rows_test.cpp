// A reduction prologue's rows folded straight from the machine code's registers
// (FusedCode::fold_rows, fold_fusion_rows): a column sum over rows of 8, 16, 32 or 64 values, in
// groups of 8 rows summed in float as a fixed tree and added in double, gives the bits of that
// definition applied to the prologue's stored values, with the code's fold, with code that
// only stores, and with no code; over operands read in place (float32, bfloat16), per column,
// as a scalar and strided (which the code does not take in place: the fold's staging path),
// from a group's start other than 0 and with a short last group.
#include "ir/program.h"
#include "runtime/cpu/fused_jit.h"
#include "runtime/cpu/kernels_fused.h"

#include <loom/bfloat16.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

using ir::Op;

// The fold's definition over stored values v[0, len): groups of 8 rows of `width` from v's
// start, the last padded with zeros, each column's group summed as
// ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)) and added to sums in double.
void reference_fold(const float* v, int64_t len, int64_t width, double* sums) {
  for (int64_t g = 0; g < len; g += 8 * width)
    for (int64_t j = 0; j < width; ++j) {
      float r[8] = {};
      for (int64_t k = 0; k < 8 && g + k * width < len; ++k) r[k] = v[g + k * width + j];
      sums[j] += static_cast<double>(((r[0] + r[1]) + (r[2] + r[3])) +
                                     ((r[4] + r[5]) + (r[6] + r[7])));
    }
}

// Operands over [rows, width]: x bfloat16 and y float32 read in place, c one value per column,
// s a scalar, z float32 stored transposed ([width, rows]).
struct Operands {
  std::vector<bfloat16> x;
  std::vector<float> y, c, s, z;
  std::vector<TensorView> views;

  Operands(int64_t rows, int64_t width) {
    const int64_t n = rows * width;
    for (int64_t i = 0; i < n; ++i) {
      x.push_back(bfloat16(std::sin(static_cast<float>(i) * 0.011f) * 3.0f));
      y.push_back(std::cos(static_cast<float>(i) * 0.007f) + 0.25f);
      z.push_back(static_cast<float>(i % 13) * 0.125f - 0.7f);
    }
    for (int64_t j = 0; j < width; ++j) c.push_back(0.5f + static_cast<float>(j) * 0.0625f);
    s.push_back(-0.375f);
    const Shape shape{rows, width};
    views = {{x.data(), DType::BFloat16, shape},
             {y.data(), DType::Float32, shape},
             {c.data(), DType::Float32, {width}},
             {s.data(), DType::Float32, {1}},
             {z.data(), DType::Float32, {width, rows}}};
  }
};

// ((float(x) - c) * y + s), and + z (strided) when `strided`.
ir::Fusion prologue(int64_t rows, int64_t width, bool strided) {
  const int64_t n = rows * width;
  ir::Fusion f;
  f.compute = DType::Float32;
  f.shape = {rows, width};
  f.loads = {{0, DType::BFloat16, {n}, {1}},
             {1, DType::Float32, {n}, {1}},
             {2, DType::Float32, {rows, width}, {0, 1}},
             {3, DType::Float32, {n}, {0}}};
  if (strided) f.loads.push_back({4, DType::Float32, {rows, width}, {1, rows}});
  const int loads = static_cast<int>(f.loads.size());
  f.steps = {{Op::Sub, 0, 2, -1, 0, DType::Float32},
             {Op::Mul, loads, 1, -1, 0, DType::Float32},
             {Op::Add, loads + 1, 3, -1, 0, DType::Float32}};
  if (strided) f.steps.push_back({Op::Add, loads + 2, 4, -1, 0, DType::Float32});
  // Every value its own register but y's, read in place.
  const int values = loads + static_cast<int>(f.steps.size());
  for (int v = 0; v < values; ++v) f.register_of.push_back(v == 1 ? -1 : v);
  f.num_registers = values;
  return f;
}

TEST(FoldRows, EveryPathGivesTheBitsOfTheDefinition) {
  const bool jit = fused_jit_available();
  if (!jit) std::printf("no fused code here: only the evaluator's fold is checked\n");
  // The code folds rows of a multiple of its vector's lanes: 8 from AVX2, 16 from AVX-512.
  const int64_t lanes = jit ? fused_lanes(fused_isas().back()) : 8;
  for (int64_t width : {8, 16, 32, 64}) {
    // 2^15 elements from the row after the first group, a short last group among them.
    const int64_t rows = (int64_t{1} << 15) / width + 8 + 3;
    const int64_t begin = 8 * width, len = rows * width - begin;
    Operands ops(rows, width);
    for (bool strided : {false, true}) {
      const ir::Fusion f = prologue(rows, width, strided);
      std::vector<float> stored(static_cast<std::size_t>(len));
      eval_fusion<float>(f, ops.views, begin, len, stored.data());
      std::vector<double> want(static_cast<std::size_t>(width), 0.25);
      reference_fold(stored.data(), len, width, want.data());

      const auto folding =
          compile_fused_code(f, DType::Float32, std::nullopt, static_cast<int>(width));
      const auto storing = compile_fused_code(f, DType::Float32);
      if (jit) {
        ASSERT_TRUE(folding && storing) << "width " << width;
        EXPECT_EQ(folding->fold_width(), width % lanes == 0 ? width : 0) << "width " << width;
        EXPECT_EQ(storing->fold_width(), 0);
      }
      const FusedCode* none = nullptr;
      for (const FusedCode* code : {folding.get(), storing.get(), none}) {
        std::vector<double> got(static_cast<std::size_t>(width), 0.25);
        fold_fusion_rows(f, ops.views, begin, len, width, got.data(), code);
        const std::string what =
            "width " + std::to_string(width) + (strided ? ", strided" : "") +
            (code == nullptr ? ", no code" : code->fold_width() ? ", fold" : ", code");
        for (int64_t j = 0; j < width; ++j)
          ASSERT_EQ(got[static_cast<std::size_t>(j)], want[static_cast<std::size_t>(j)])
              << what << ", column " << j;
      }
    }
  }
}

}  // namespace
}  // namespace loom::runtime
