// The CPU's movement and index kernels past one task's grain (kernels_movement.cpp,
// kernels_index.cpp), against values worked out on the host: a broadcast of one value and of a
// column (the fills), a long contiguous copy split among the threads, and an index_select's
// gradient, a scatter_add of whole rows into a table with one outer position. Movement and
// integer sums are exact, so the values must match bit for bit.
#include "test_util.h"

#include <loom/autograd.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace loom {
namespace {

TEST(IndexMovementPaths, BroadcastsOfAValueAndOfAColumnFillEveryRow) {
  test::fresh_engine();
  const int64_t rows = 300, cols = 200;  // 60,000 elements: several tasks
  auto one = expand(reshape(from_vector(std::vector<int64_t>{-7}, {1}), {1, 1}), {rows, cols});
  std::vector<int64_t> col(rows);
  for (int64_t r = 0; r < rows; ++r) col[static_cast<std::size_t>(r)] = r * 3 - 100;
  auto wide = expand(from_vector(col, {rows, 1}), {rows, cols});
  const auto o = one.to_vector<int64_t>(), w = wide.to_vector<int64_t>();
  ASSERT_EQ(o.size(), static_cast<std::size_t>(rows * cols));
  ASSERT_EQ(w.size(), o.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<std::size_t>(r * cols + c);
      ASSERT_EQ(o[i], -7) << r << ", " << c;
      ASSERT_EQ(w[i], col[static_cast<std::size_t>(r)]) << r << ", " << c;
    }
}

TEST(IndexMovementPaths, ALongContiguousSliceIsCopiedWhole) {
  test::fresh_engine();
  std::vector<int32_t> v(3 * 50000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 7 % 100003);
  auto x = from_vector(v, {3, 50000});
  auto middle = slice(x, 0, 1, 2);  // one run of 50,000 elements
  const auto got = middle.to_vector<int32_t>();
  ASSERT_EQ(got.size(), 50000u);
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], v[50000 + i]) << i;
}

// An embedding's gradient: index_select's backward adds each picked row's gradient into its
// row of the table, in index order, repeated rows included.
TEST(IndexMovementPaths, AnEmbeddingGradientAddsEveryPickedRow) {
  test::fresh_engine();
  const int64_t vocab = 50, dim = 300, picks = 70;
  std::vector<float> wv(static_cast<std::size_t>(vocab * dim), 0.5f);
  auto table = from_vector(wv, {vocab, dim});
  table.requires_grad_();
  std::vector<int64_t> idx(picks);
  for (int64_t i = 0; i < picks; ++i) idx[static_cast<std::size_t>(i)] = (i * 13 + i / 7) % vocab;
  std::vector<float> gv(static_cast<std::size_t>(picks * dim));
  for (std::size_t i = 0; i < gv.size(); ++i) gv[i] = static_cast<float>(static_cast<int>(i % 37) - 18);
  auto rows = index_select(table, 0, from_vector(idx, {picks}));
  (rows * from_vector(gv, {picks, dim})).sum().backward();
  std::vector<float> want(static_cast<std::size_t>(vocab * dim), 0.0f);
  for (int64_t i = 0; i < picks; ++i)
    for (int64_t c = 0; c < dim; ++c)
      want[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)] * dim + c)] +=
          gv[static_cast<std::size_t>(i * dim + c)];
  EXPECT_EQ(table.grad().to_vector<float>(), want);
}

// The same gradient with values whose sums depend on their order: the CPU adds whole rows
// (scatter_add_rows_kernel, the index being an Expand of one value per row) in index order,
// so every element gets the bits of a serial sum in that order. Added onto a table that is
// not zero, through scatter_add itself, over two outer positions.
TEST(IndexMovementPaths, ARowScatterAddsInIndexOrder) {
  test::fresh_engine();
  const int64_t outer = 2, vocab = 40, dim = 200, picks = 90;
  std::vector<float> base(static_cast<std::size_t>(outer * vocab * dim));
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<int64_t> idx(static_cast<std::size_t>(outer * picks));
  for (std::size_t i = 0; i < idx.size(); ++i)
    idx[i] = static_cast<int64_t>((i * 7 + i / 5) % static_cast<std::size_t>(vocab));
  std::vector<float> src(static_cast<std::size_t>(outer * picks * dim));
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = std::cos(0.11f * static_cast<float>(i)) * 3;
  auto self = from_vector(base, {outer, vocab, dim});
  auto index = from_vector(idx, {outer, picks, 1});
  auto values = from_vector(src, {outer, picks, dim});
  mark_step();
  auto out = scatter_add(self, 1, index.expand({outer, picks, dim}), values);
  const auto p = test::compile_for_cpu(test::graph_of(out));
  const auto& scatter = p.instrs.back();
  ASSERT_EQ(scatter.op, ir::Op::ScatterAdd) << ir::to_text(p);
  EXPECT_TRUE(ir::index_uniform_inner(p, scatter.args[1], 1)) << ir::to_text(p);
  std::vector<float> want = base;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t t = 0; t < picks; ++t)
      for (int64_t c = 0; c < dim; ++c) {
        const int64_t row = idx[static_cast<std::size_t>(o * picks + t)];
        want[static_cast<std::size_t>((o * vocab + row) * dim + c)] +=
            src[static_cast<std::size_t>((o * picks + t) * dim + c)];
      }
  EXPECT_EQ(out.to_vector<float>(), want);
}

// An index out of range on that path is an error naming it, as on the element path.
TEST(IndexMovementPaths, ARowScatterNamesAnIndexOutOfRange) {
  test::fresh_engine();
  auto self = zeros({5, 64});
  auto index = from_vector(std::vector<int64_t>{1, 5, 2}, {3, 1});
  auto values = ones({3, 64});
  mark_step();
  auto out = scatter_add(self, 0, index.expand({3, 64}), values);
  const auto message = test::error_of([&] { out.to_vector<float>(); });
  EXPECT_NE(message.find("scatter_add: index 5 is out of range for dimension 0 of size 5"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace loom
