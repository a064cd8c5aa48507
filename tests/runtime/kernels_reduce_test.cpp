// Reductions to few outputs over much data (BatchNorm's per-channel statistics), which read
// their operand in fixed chunks: values against a double reference, a fused prologue against
// the same reduction of a stored operand (bit for bit), a bfloat16 operand read through its
// widening cast, and NaN in amax.
#include "test_util.h"

#include <tbb/global_control.h>

#include <cmath>
#include <limits>

namespace loom {
namespace {

// [n, c, h, w] with values that differ in every channel and position.
std::vector<float> activations(int64_t n, int64_t c, int64_t hw) {
  std::vector<float> v(static_cast<std::size_t>(n * c * hw));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = std::sin(static_cast<float>(i) * 0.013f) * 2.0f + static_cast<float>(i % 7) * 0.1f;
  return v;
}

TEST(ReduceInChunks, PerChannelSumsMeansAndMaximaMatchADoubleReference) {
  test::fresh_engine();
  const int64_t n = 16, c = 12, h = 48, w = 50;  // 38,400 elements per channel
  auto xv = activations(n, c, h * w);
  auto x = from_vector(xv, {n, c, h, w});
  auto s = x.sum({0, 2, 3}, true).to_vector<float>();
  auto m = x.mean({0, 2, 3}).to_vector<float>();
  auto a = amax(x, {0, 2, 3}).to_vector<float>();
  ASSERT_EQ(s.size(), static_cast<std::size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < h * w; ++p) {
        const float v = xv[static_cast<std::size_t>((i * c + ch) * h * w + p)];
        sum += v;
        mx = std::max(mx, v);
      }
    EXPECT_NEAR(s[ch], sum, 1e-6 * std::abs(sum) + 1e-3) << "channel " << ch;
    EXPECT_NEAR(m[ch], sum / double(n * h * w), 1e-6) << "channel " << ch;
    EXPECT_EQ(a[ch], mx) << "channel " << ch;
  }
}

TEST(ReduceInChunks, AFusedPrologueGivesTheBitsOfAStoredOperand) {
  test::fresh_engine();
  const int64_t n = 32, c = 4, hw = 64;  // runs of 64 (an 8x8 plane), 2048 per channel
  auto x = from_vector(activations(n * 16, c, hw), {n * 16, c, 8, 8});
  auto mean = x.mean({0, 2, 3}, true);
  auto fused = ((x - mean) * (x - mean)).sum({0, 2, 3}).to_vector<float>();
  std::vector<float> stored;
  {
    EagerModeGuard eager{true};  // every op alone: the reduction reads a stored operand
    stored = ((x - mean) * (x - mean)).sum({0, 2, 3}).to_vector<float>();
  }
  EXPECT_EQ(fused, stored);
}

TEST(ReduceInChunks, AmaxPropagatesNaN) {
  test::fresh_engine();
  auto xv = activations(8, 3, 64 * 64);
  xv[static_cast<std::size_t>((5 * 3 + 1) * 64 * 64 + 77)] = std::nanf("");
  auto a = amax(from_vector(xv, {8, 3, 64, 64}), {0, 2, 3}).to_vector<float>();
  EXPECT_FALSE(std::isnan(a[0]));
  EXPECT_TRUE(std::isnan(a[1]));
  EXPECT_FALSE(std::isnan(a[2]));
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// The channels-last statistics: [rows, C] reduced over the rows (reduce_rows_in_chunks), for C
// from a few to past a block, with and without a fused prologue, against a double reference,
// and the same bits whatever the thread count.
TEST(ReduceRowsInChunks, ColumnSumsMeansAndMaximaMatchADoubleReference) {
  for (int64_t c : {3, 16, 64, 1000}) {
    test::fresh_engine();
    const int64_t rows = (int64_t{1} << 17) / c + 7;  // several chunks and a short last one
    auto xv = activations(rows, c, 1);
    auto x = from_vector(xv, {rows, 1, 1, c});
    auto s = x.sum({0, 1, 2}, true).to_vector<float>();
    auto m = x.mean({0, 1, 2}).to_vector<float>();
    auto a = amax(x, {0, 1, 2}).to_vector<float>();
    auto sq = (x * x).sum({0, 1, 2}).to_vector<float>();  // a fused prologue
    ASSERT_EQ(s.size(), static_cast<std::size_t>(c));
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0, sum_sq = 0;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t r = 0; r < rows; ++r) {
        const float v = xv[static_cast<std::size_t>(r * c + ch)];
        sum += v;
        sum_sq += double(v * v);
        mx = std::max(mx, v);
      }
      EXPECT_NEAR(s[ch], sum, 1e-6 * std::abs(sum) + 1e-3) << "c " << c << " channel " << ch;
      EXPECT_NEAR(m[ch], sum / double(rows), 1e-6) << "c " << c << " channel " << ch;
      EXPECT_NEAR(sq[ch], sum_sq, 1e-6 * sum_sq + 1e-3) << "c " << c << " channel " << ch;
      EXPECT_EQ(a[ch], mx) << "c " << c << " channel " << ch;
    }
    std::vector<float> one_thread;
    {
      tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
      one_thread = x.sum({0, 1, 2}).to_vector<float>();
    }
    EXPECT_EQ(one_thread, s) << "c " << c;
    // The fused prologue is evaluated piece by piece (kernels_reduce.cpp's PieceReader), a
    // stored operand window by window: the same folds, so the same bits.
    std::vector<float> stored;
    {
      EagerModeGuard eager(true);
      stored = (x * x).sum({0, 1, 2}).to_vector<float>();
    }
    EXPECT_EQ(stored, sq) << "c " << c;
  }
}

// A bfloat16 conv output's statistics as a bfloat16 ResNet step computes them: the widening
// cast and the centring are the reduction's prologue, reading the 2-byte values.
TEST(ReduceRowsInChunks, StatisticsOfABfloat16TensorMatchTheStoredFloat32Operand) {
  for (int64_t c : {16, 24}) {
    test::fresh_engine();
    const int64_t rows = (int64_t{1} << 16) / c + 5;
    auto x = from_vector(activations(rows, c, 1), {rows, 1, 1, c}).to(DType::BFloat16);
    mark_step();
    auto xf = x.to(DType::Float32);
    auto m = xf.mean({0, 1, 2}, true);
    auto var = ((xf - m) * (xf - m)).mean({0, 1, 2});
    auto got_m = m.to_vector<float>(), got_var = var.to_vector<float>();
    std::vector<float> want_m, want_var;
    {
      EagerModeGuard eager(true);
      auto ef = x.to(DType::Float32);
      auto em = ef.mean({0, 1, 2}, true);
      auto ed = ef - em;
      want_m = em.to_vector<float>();
      want_var = (ed * ed).mean({0, 1, 2}).to_vector<float>();
    }
    EXPECT_EQ(got_m, want_m) << "c " << c;
    EXPECT_EQ(got_var, want_var) << "c " << c;
    auto xv = x.to(DType::Float32).to_vector<float>();
    for (int64_t ch = 0; ch < c; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t r = 0; r < rows; ++r) sum += xv[static_cast<std::size_t>(r * c + ch)];
      const double mean = sum / double(rows);
      for (int64_t r = 0; r < rows; ++r) {
        const double d = xv[static_cast<std::size_t>(r * c + ch)] - mean;
        sq += d * d;
      }
      EXPECT_NEAR(got_m[ch], mean, 1e-6) << "c " << c << " channel " << ch;
      EXPECT_NEAR(got_var[ch], sq / double(rows), 1e-5 * sq / double(rows)) << "c " << c;
    }
  }
}

}  // namespace
}  // namespace loom
