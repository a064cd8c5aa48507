// Reductions to few outputs over much data (BatchNorm's per-channel statistics), which read
// their operand in fixed chunks: values against a double reference, a fused prologue against
// the same reduction of a stored operand (bit for bit), a bfloat16 operand read through its
// widening cast, and NaN in amax; row maxima (a softmax's) against the sequential fold; a
// channels-last pool's prologue against the stored operand.
#include "runtime/cpu/kernels_fused.h"
#include "test_util.h"

#include <tbb/global_control.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

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

// Also over many short runs, the per-channel statistics of small NCHW planes (4x4: 512 per
// channel), which are read in chunks too, against a double reference.
TEST(ReduceInChunks, AFusedPrologueGivesTheBitsOfAStoredOperand) {
  for (auto [n, c, side] : {std::array<int64_t, 3>{512, 4, 8}, {32, 512, 4}}) {
    test::fresh_engine();
    const int64_t hw = side * side;
    const auto values = activations(n, c, hw);
    auto x = from_vector(values, {n, c, side, side});
    auto mean = x.mean({0, 2, 3}, true);
    auto fused = ((x - mean) * (x - mean)).sum({0, 2, 3}).to_vector<float>();
    std::vector<float> stored;
    {
      EagerModeGuard eager{true};  // every op alone: the reduction reads a stored operand
      stored = ((x - mean) * (x - mean)).sum({0, 2, 3}).to_vector<float>();
    }
    EXPECT_EQ(fused, stored) << side << "x" << side;
    const auto m = mean.to_vector<float>();
    for (int64_t ch = 0; ch < c; ++ch) {
      double sq = 0;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t p = 0; p < hw; ++p) {
          const double d = values[static_cast<std::size_t>((i * c + ch) * hw + p)] - double(m[ch]);
          sq += d * d;
        }
      EXPECT_NEAR(fused[static_cast<std::size_t>(ch)], sq, 1e-5 * sq) << side << " channel " << ch;
    }
  }
}

// A global average pool over a channels-last [N, H, W, C] whose operand is a fused prologue
// (relu of a residual sum): each image's rows are read through the piece reader, and the
// result has the bits of the same mean over the stored operand. Also with more channels than
// that path takes (the row-by-row loop) and with sums.
TEST(KeptInnerReductions, APoolsProloguePerImageGivesTheBitsOfAStoredOperand) {
  test::fresh_engine();
  for (int64_t c : {16, 64, 300}) {
    const int64_t n = 6, h = 7, w = 9;
    auto a = from_vector(activations(n, c, h * w), {n, h, w, c});
    auto bv = activations(n, c, h * w);
    std::reverse(bv.begin(), bv.end());
    auto b = from_vector(bv, {n, h, w, c});
    auto pooled = relu(a + b).mean({1, 2});
    auto summed = relu(a - b).sum({1, 2}, true);
    auto p = test::compile_for_cpu(
        ir::build_graph({pooled.impl()->pending(), summed.impl()->pending()}));
    int prologues = 0;
    for (const auto& in : p.instrs)
      prologues += (in.op == ir::Op::Mean || in.op == ir::Op::Sum) && in.fusion;
    EXPECT_EQ(prologues, 2) << "both reductions evaluate their operand\n" << ir::to_text(p);
    std::vector<float> want_pooled, want_summed;
    {
      EagerModeGuard eager{true};  // every op alone: the reductions read stored operands
      want_pooled = relu(a + b).mean({1, 2}).to_vector<float>();
      want_summed = relu(a - b).sum({1, 2}, true).to_vector<float>();
    }
    EXPECT_EQ(pooled.to_vector<float>(), want_pooled) << c << " channels";
    EXPECT_EQ(summed.to_vector<float>(), want_summed) << c << " channels";
  }
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

namespace loom {
namespace {

// amax's definition, folded in order: a NaN wins, and of equal values (+0 and -0) the first.
float sequential_max(const float* p, int64_t n) {
  float a = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(p[i]) || p[i] > a) a = p[i];
  return a;
}

// Row maxima over rows of many lengths (short runs, lane tails, several runs per row), rows
// with a NaN, with -inf (a masked attention row), with a zero maximum of either sign first:
// the kernel's lane maxima give the sequential fold's bits; a fused prologue gives the bits of
// the stored operand.
TEST(RowReductions, RowMaximaAreTheSequentialFold) {
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t len : {7, 31, 32, 33, 47, 100, 512, 600, 1037}) {
    test::fresh_engine();
    const int64_t rows = 12;
    std::vector<float> v(static_cast<std::size_t>(rows * len));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = std::sin(static_cast<float>(i) * 0.37f) * 3.0f - 4.0f;
    auto at = [&](int64_t r, int64_t i) -> float& { return v[static_cast<std::size_t>(r * len + i)]; };
    at(1, len / 2) = std::nanf("");
    at(2, len - 1) = std::nanf("");
    for (int64_t i = 0; i < len; i += 3) at(3, i) = -inf;
    for (int64_t i = 0; i < len; ++i) at(4, i) = -inf;
    // Zero maxima: the first of +0 and -0 is the maximum. At 21 and 34 the second falls in an
    // earlier lane of sixteen than the first.
    const int64_t z1 = std::min<int64_t>(21, len - 2), z2 = std::min<int64_t>(34, len - 1);
    at(5, z1) = 0.0f;
    at(5, z2) = -0.0f;
    at(6, z1) = -0.0f;
    at(6, z2) = 0.0f;
    at(7, 0) = 7.5f;
    at(8, len - 1) = 7.5f;
    auto x = from_vector(v, {rows, len});
    auto got = amax(x, {1}).to_vector<float>();
    auto doubled = amax(x * 2.0, {1}).to_vector<float>();
    std::vector<float> stored;
    {
      EagerModeGuard eager{true};
      stored = amax(x * 2.0, {1}).to_vector<float>();
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float want = sequential_max(&v[static_cast<std::size_t>(r * len)], len);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[r])) << "row " << r << " of " << len;
      } else {
        EXPECT_EQ(got[r], want) << "row " << r << " of " << len;
        EXPECT_EQ(std::signbit(got[r]), std::signbit(want)) << "row " << r << " of " << len;
      }
      EXPECT_EQ(std::isnan(doubled[r]), std::isnan(stored[r])) << "row " << r << " of " << len;
      if (!std::isnan(stored[r])) {
        EXPECT_EQ(doubled[r], stored[r]) << "row " << r << " of " << len;
        EXPECT_EQ(std::signbit(doubled[r]), std::signbit(stored[r])) << "row " << r << " of " << len;
      }
    }
  }
}

// A run's sum as kernels_reduce.cpp defines it: 32 double lanes (element i into lane i % 32),
// then folded pairwise, lane k with lane k + 16, ..., k + 1.
double lane_sum(const float* p, int64_t n) {
  double lane[32] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % 32] += static_cast<double>(p[i]);
  for (int w = 16; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) lane[k] += lane[k + w];
  return lane[0];
}

// Row sums over rows of many lengths (short runs, partial lane rows, several 512-element runs
// per row): the defined order, bit for bit (whether the CPU takes the AVX-512 lanes or the
// plain loop), and a fused prologue gives the bits of the stored operand.
TEST(RowReductions, RowSumsFoldTheirRunsInTheDefinedOrder) {
  for (int64_t len : {7, 31, 32, 33, 100, 512, 600, 1037, 2100}) {
    test::fresh_engine();
    const int64_t rows = 7;
    std::vector<float> v(static_cast<std::size_t>(rows * len));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = std::sin(static_cast<float>(i) * 0.37f) * 1e3f + static_cast<float>(i % 11) * 1e-3f;
    // Rows where the order shows: 2^60, 1 and -2^60 in three lanes sum to 1 or to 0 in double
    // depending on which lanes are paired first (each pairing step, + 16 down to + 1).
    auto at = [&](int64_t r, int64_t i) -> float& { return v[static_cast<std::size_t>(r * len + i % len)]; };
    const int64_t triples[][3] = {{0, 8, 16}, {1, 17, 33}, {3, 35, 19}, {5, 29, 45}, {2, 6, 10}, {0, 1, 2}};
    for (int64_t r = 1; r < rows; ++r) {
      for (int64_t i = 0; i < len; ++i) at(r, i) = 0.0f;
      at(r, triples[r - 1][0]) = 0x1p60f;
      at(r, triples[r - 1][1]) += 1.0f;
      at(r, triples[r - 1][2]) += -0x1p60f;
    }
    auto x = from_vector(v, {rows, len});
    auto got = x.sum({1}).to_vector<float>();
    auto doubled = (x * 2.0).sum({1}).to_vector<float>();
    std::vector<float> stored;
    {
      EagerModeGuard eager{true};
      stored = (x * 2.0).sum({1}).to_vector<float>();
    }
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0;  // the row, folded run by run (512 elements at a time)
      for (int64_t i = 0; i < len; i += 512)
        want += lane_sum(&v[static_cast<std::size_t>(r * len + i)], std::min<int64_t>(512, len - i));
      EXPECT_EQ(got[r], static_cast<float>(want)) << "row " << r << " of " << len;
      EXPECT_EQ(doubled[r], stored[r]) << "row " << r << " of " << len;
    }
  }
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// A float column sum over [rows, C] at the channel counts with a fixed-width fold (8, 16, 32,
// 64), as kernels_reduce.cpp defines it: chunks of 2^15 elements (2^15 / C rows); in a chunk,
// groups of 8 rows from its start, each summed in float as ((r0 + r1) + (r2 + r3)) +
// ((r4 + r5) + (r6 + r7)) with the rows missing from the last group as +0, and added to the
// chunk's double partial; the chunks' partials added in chunk order.
std::vector<double> grouped_column_sums(const std::vector<float>& v, int64_t rows, int64_t c) {
  const int64_t per_chunk = (int64_t{1} << 15) / c;
  std::vector<double> total(static_cast<std::size_t>(c), 0.0);
  for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
    const int64_t r1 = std::min(rows, r0 + per_chunk);
    for (int64_t ch = 0; ch < c; ++ch) {
      double part = 0;
      for (int64_t g = r0; g < r1; g += 8) {
        float x[8] = {};
        for (int64_t k = 0; k < 8 && g + k < r1; ++k) x[k] = v[static_cast<std::size_t>((g + k) * c + ch)];
        part += static_cast<double>(((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7])));
      }
      total[static_cast<std::size_t>(ch)] = r0 == 0 ? part : total[static_cast<std::size_t>(ch)] + part;
    }
  }
  return total;
}

// The sum, the mean and a fused prologue's sum (x * 2) over the rows of v ([rows, c]), each
// to the bit against `defined(values, rows, c)`: the kernel's order of adds in double.
template <class Defined>
void expect_column_sums_as_defined(const std::vector<float>& v, int64_t rows, int64_t c,
                                   Defined defined) {
  auto x = from_vector(v, {rows, 1, 1, c});
  auto got = x.sum({0, 1, 2}).to_vector<float>();
  auto mean = x.mean({0, 1, 2}).to_vector<float>();
  auto doubled = (x * 2.0).sum({0, 1, 2}).to_vector<float>();  // a fused prologue
  std::vector<float> twice(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) twice[i] = v[i] * 2.0f;
  const auto want = defined(v, rows, c);
  const auto want_doubled = defined(twice, rows, c);
  for (int64_t ch = 0; ch < c; ++ch) {
    const auto i = static_cast<std::size_t>(ch);
    EXPECT_EQ(got[i], static_cast<float>(want[i])) << "c " << c << " channel " << ch;
    EXPECT_EQ(mean[i], static_cast<float>(want[i] / double(rows))) << "c " << c << " channel " << ch;
    EXPECT_EQ(doubled[i], static_cast<float>(want_doubled[i])) << "c " << c << " channel " << ch;
  }
}

// Channel 1 is zero in its first 256 rows but for four sets of 2^30, 1 and -2^30, placed so
// that the grouping and the tree show (in float, 2^30 + 1 rounds to 2^30):
//   rows 0, 1, 2:       one group, 0; a row-by-row double fold gives 1;
//   rows 64, 72, 80:    three groups, 1; groups of 16 rows give 0;
//   rows 128, 132, 136: two groups, 0; groups of 4 rows give 1;
//   rows 192, 194, 195 (1, 2^30, -2^30): the tree gives 1, a sequential float sum 0.
// Bit for bit, with and without a fused prologue, over several chunks and a short last group.
TEST(ReduceRowsInChunks, FloatColumnSumsFoldGroupsOfEightRowsInTheDefinedOrder) {
  for (int64_t c : {8, 16, 32, 64}) {
    test::fresh_engine();
    const int64_t rows = (int64_t{1} << 16) / c * 2 + 5;
    auto v = activations(rows, c, 1);
    auto at = [&](int64_t r, int64_t ch) -> float& { return v[static_cast<std::size_t>(r * c + ch)]; };
    for (int64_t r = 0; r < 256; ++r) at(r, 1) = 0.0f;
    for (int64_t first : {0, 64, 128}) {
      const int64_t step = first == 0 ? 1 : first == 64 ? 8 : 4;
      at(first, 1) = 0x1p30f, at(first + step, 1) = 1.0f, at(first + 2 * step, 1) = -0x1p30f;
    }
    at(192, 1) = 1.0f, at(194, 1) = 0x1p30f, at(195, 1) = -0x1p30f;
    expect_column_sums_as_defined(v, rows, c, grouped_column_sums);
  }
}

// A float column sum at the other widths (more than 64 columns, or not a fixed row width), as
// kernels_reduce.cpp defines it: chunks of 2^15 elements (2^15 / C rows); in a chunk each
// column's rows added in order to a double from +0; the chunks' partials added in chunk order.
std::vector<double> sequential_column_sums(const std::vector<float>& v, int64_t rows, int64_t c) {
  const int64_t per_chunk = (int64_t{1} << 15) / c;
  std::vector<double> total(static_cast<std::size_t>(c), 0.0);
  for (int64_t r0 = 0; r0 < rows; r0 += per_chunk) {
    std::vector<double> part(static_cast<std::size_t>(c), 0.0);
    for (int64_t r = r0; r < std::min(rows, r0 + per_chunk); ++r)
      for (int64_t ch = 0; ch < c; ++ch)
        part[static_cast<std::size_t>(ch)] += static_cast<double>(v[static_cast<std::size_t>(r * c + ch)]);
    for (int64_t ch = 0; ch < c; ++ch) {
      const auto i = static_cast<std::size_t>(ch);
      total[i] = r0 == 0 ? part[i] : total[i] + part[i];
    }
  }
  return total;
}

// Channel 1 holds 2^60, 1 and -2^60 in each chunk's first three rows: in order they sum to 0,
// paired otherwise to 1.
TEST(ReduceRowsInChunks, FloatColumnSumsAtOtherWidthsAddTheirRowsInOrder) {
  for (int64_t c : {72, 128, 200, 256, 512, 1000}) {
    test::fresh_engine();
    const int64_t rows = (int64_t{1} << 16) / c + 13;  // several chunks and a short last one
    auto v = activations(rows, c, 1);
    auto at = [&](int64_t r, int64_t ch) -> float& { return v[static_cast<std::size_t>(r * c + ch)]; };
    const int64_t per_chunk = (int64_t{1} << 15) / c;
    for (int64_t r0 = 0; r0 + 2 < rows; r0 += per_chunk)
      at(r0, 1) = 0x1p60f, at(r0 + 1, 1) = 1.0f, at(r0 + 2, 1) = -0x1p60f;
    expect_column_sums_as_defined(v, rows, c, sequential_column_sums);
  }
}

// A stacked sum (compiler/stack_reductions.h) over two fused prologues of three operands, x and
// (x - c) * y: each row of its result has the bits of that prologue's sum alone, where the kernel
// reads the prologues piece by piece together (rows of 16, reads_stacked), where their code
// folds them in one pass (compile_stacked_fold: rows of 8 (AVX2), 16, 32 and 64, with and
// without a short last group of rows, which the pieces then take) and where it runs them one
// after another (rows of 12).
TEST(StackedReduce, EachRowHasTheBitsOfItsReductionAlone) {
  using ir::Op;
  const bool jit = runtime::fused_jit_available();
  if (!jit) std::printf("no fused code here: the stacked fold is not checked\n");
  const int64_t lanes = jit ? runtime::fused_lanes(runtime::fused_isas().back()) : 8;
  for (auto [width, rows] : {std::pair<int64_t, int64_t>{8, 4099}, {16, 5000}, {16, 5003},
                              {32, 1029}, {64, 512}, {64, 3000}, {12, 5000}}) {
    const int64_t n = rows * width;
    std::vector<float> x(static_cast<std::size_t>(n)), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = std::sin(static_cast<float>(i) * 0.003f) * 3.0f;
      y[i] = std::cos(static_cast<float>(i) * 0.007f) + 0.25f;
    }
    const Shape shape{rows, width};
    std::vector<float> c(static_cast<std::size_t>(width));
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = 0.5f + static_cast<float>(i) * 0.25f;
    const std::vector<runtime::TensorView> in{{x.data(), DType::Float32, shape},
                                              {y.data(), DType::Float32, shape},
                                              {c.data(), DType::Float32, {width}}};
    // x alone, or (x - c) * y with c one value per column (a per-channel operand).
    auto prologue = [&](bool product) {
      ir::Fusion f;
      f.compute = DType::Float32;
      f.shape = shape;
      f.loads = {{0, DType::Float32, {n}, {1}}, {1, DType::Float32, {n}, {1}},
                 {2, DType::Float32, {rows, width}, {0, 1}}};
      if (product) {
        f.steps = {{Op::Sub, 0, 2, -1, 0, DType::Float32}, {Op::Mul, 3, 1, -1, 0, DType::Float32}};
        f.num_registers = 3;
        f.register_of = {-1, -1, 0, 1, 2};
      } else {
        f.steps = {{Op::Cast, 0, -1, -1, 0, DType::Float32}};
        f.num_registers = 2;
        f.register_of = {-1, -1, 0, 1};
      }
      return f;
    };
    const ir::Fusion a = prologue(false), b = prologue(true);
    const ir::Attr axes = ir::AxesAttr{{0}};
    EXPECT_EQ(runtime::reads_stacked(shape, {0}), width != 12) << width;

    // With the prologues' machine code (where the CPU has an instruction set for it) and
    // without.
    const auto code_a = runtime::compile_fused_code(a, DType::Float32);
    const auto code_b = runtime::compile_fused_code(b, DType::Float32);
    const ir::Fusion* prologues[] = {&a, &b};
    const int fold_width = runtime::rows_fold_width(shape, {0});
    EXPECT_EQ(fold_width, width == 12 ? 0 : width);
    const auto fold = runtime::compile_stacked_fold(prologues, fold_width);
    if (jit && fold_width && fold_width % lanes == 0) {
      ASSERT_TRUE(fold) << width;
      EXPECT_EQ(fold->fusion.loads.size(), 3u) << "x is loaded once";
    }
    for (int path : {0, 1, 2}) {  // the code folding together, the code per piece, no code
    const bool machine_code = path < 2;
    std::vector<float> together(static_cast<std::size_t>(2 * width));
    const runtime::FusedCode* codes[] = {machine_code ? code_a.get() : nullptr,
                                         machine_code ? code_b.get() : nullptr};
    runtime::stacked_reduce_kernel(Op::Sum, axes, prologues, codes, in,
                                   {together.data(), DType::Float32, {2, width}},
                                   path == 0 ? fold.get() : nullptr);
    for (int k = 0; k < 2; ++k) {
      std::vector<float> alone(static_cast<std::size_t>(width));
      runtime::fused_reduce_kernel(Op::Sum, axes, k == 0 ? a : b, in,
                                   {alone.data(), DType::Float32, {width}}, codes[k]);
      EXPECT_EQ(std::vector<float>(together.begin() + k * width,
                                   together.begin() + (k + 1) * width),
                alone)
          << rows << " rows of " << width << ", prologue " << k << ", path " << path;
    }
    }
  }
}

}  // namespace
}  // namespace loom
