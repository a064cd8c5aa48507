// The epilogue pass: a bias add and an activation fold into the matmul or conv that produces
// their operand, and the folded kernel gives the bits that the separate ops give.
#include "compiler/pipeline.h"
#include "test_util.h"

#include <loom/autograd.h>

#include <algorithm>
#include <cmath>
#include <functional>

namespace loom {
namespace {

using ir::Program;

template <class T>
std::vector<T> ramp(int64_t n, double scale) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(std::cos(static_cast<double>(i) * scale));
  return v;
}

template <class T>
Tensor ramp_tensor(const Shape& s, double scale) {
  return from_vector(ramp<T>(shape_numel(s), scale), s);
}

// The one instruction that carries an epilogue (fails the test unless there is exactly one).
const ir::Instr* folded(const Program& p) {
  const ir::Instr* found = nullptr;
  int n = 0;
  for (const auto& in : p.instrs)
    if (in.epilogue.active()) found = &in, ++n;
  EXPECT_EQ(n, 1) << ir::to_text(p);
  return found;
}

// Compiles f() lazily and runs it, then runs it again op by op: the two results.
template <class T>
std::pair<std::vector<T>, std::vector<T>> compiled_and_eager(const std::function<Tensor()>& f,
                                                             Program* program) {
  auto y = f();
  *program = test::compile_for_cpu(test::graph_of(y));
  auto got = y.to_vector<T>();
  EagerModeGuard eager{true};
  return {got, f().to_vector<T>()};
}

// got against values computed on the host in double: eager mode runs the same kernels, so
// agreeing with it cannot show that both are right.
template <class T>
void expect_host(const std::vector<T>& got, const std::vector<double>& want, int64_t terms) {
  ASSERT_EQ(got.size(), want.size());
  const double eps = std::is_same_v<T, float> ? 1.2e-7 : 2.3e-16;
  const double tol = 16 * eps * std::sqrt(static_cast<double>(terms));
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
}

double activate(ir::Op act, double v) {
  if (act == ir::Op::Relu) return std::max(v, 0.0);
  if (act == ir::Op::Sigmoid) return 1 / (1 + std::exp(-v));
  if (act == ir::Op::Tanh) return std::tanh(v);
  return v;
}

// y = act(x @ w^T + b), a Linear layer; x [.., m, k] is multiplied as [rows, k] rows.
template <class T>
void check_linear(const Shape& batch, int64_t m, int64_t k, int64_t n, ir::Op act) {
  test::fresh_engine();
  Shape sx = batch;
  sx.insert(sx.end(), {m, k});
  auto x = ramp_tensor<T>(sx, 0.37);
  auto w = ramp_tensor<T>({n, k}, 0.11);
  auto b = ramp_tensor<T>({n}, 0.53);
  auto f = [&] {
    auto s = matmul(x, transpose(w, 0, 1)) + b;
    // An if-chain, not a switch: the test picks among three activations, Add for the bias
    // alone.
    if (act == ir::Op::Relu) return relu(s);
    if (act == ir::Op::Sigmoid) return sigmoid(s);
    if (act == ir::Op::Tanh) return tanh(s);
    EXPECT_EQ(act, ir::Op::Add) << "check_linear: unexpected activation " << ir::op_name(act);
    return s;
  };
  Program p;
  auto [got, want] = compiled_and_eager<T>(f, &p);
  EXPECT_EQ(test::count_instrs(p, ir::Op::Matmul), 1) << ir::to_text(p);
  EXPECT_EQ(test::count_instrs(p, ir::Op::Add), 0) << ir::to_text(p);
  EXPECT_EQ(p.instrs.size(), batch.empty() ? 1u : 2u) << ir::to_text(p);  // + x's reshape
  if (const auto* in = folded(p)) {
    EXPECT_EQ(in->op, ir::Op::Matmul);
    EXPECT_EQ(in->args.size(), 3u);
    EXPECT_EQ(in->epilogue.activation, act == ir::Op::Add ? ir::Op::Count_ : act);
  }
  ASSERT_EQ(got.size(), want.size());
  if (act == ir::Op::Relu || act == ir::Op::Add) {
    // The same GEMM, then the same add and max per element: the same bits as eager mode.
    EXPECT_EQ(got, want);
  } else {
    // Eager's sigmoid and tanh call the C library; the compiled kernels Eigen's vectorised
    // functions, a few ulps apart.
    const double tol = std::is_same_v<T, float> ? 1e-6 : 1e-14;
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], tol) << i;
  }
  const int64_t rows = shape_numel(sx) / k;
  const auto xv = ramp<T>(rows * k, 0.37), wv = ramp<T>(n * k, 0.11), bv = ramp<T>(n, 0.53);
  std::vector<double> host(static_cast<std::size_t>(rows * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double acc = bv[j];
      for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(xv[r * k + i]) * wv[j * k + i];
      host[r * n + j] = activate(act, acc);
    }
  expect_host(got, host, k);
}

TEST(FuseEpilogue, LinearBiasRelu) { check_linear<float>({}, 67, 33, 300, ir::Op::Relu); }
TEST(FuseEpilogue, LinearBiasReluFloat64) { check_linear<double>({}, 67, 33, 300, ir::Op::Relu); }
TEST(FuseEpilogue, LinearBiasOnly) { check_linear<float>({}, 40, 16, 24, ir::Op::Add); }
TEST(FuseEpilogue, LinearBiasSigmoid) { check_linear<float>({}, 31, 20, 150, ir::Op::Sigmoid); }
TEST(FuseEpilogue, LinearBiasTanhFloat64) { check_linear<double>({}, 31, 20, 150, ir::Op::Tanh); }
TEST(FuseEpilogue, BatchedRowsThroughReshape) {
  check_linear<float>({3}, 45, 28, 70, ir::Op::Relu);
}
TEST(FuseEpilogue, BatchedRowsThroughReshapeFloat64) {
  check_linear<double>({2, 3}, 17, 9, 33, ir::Op::Relu);
}

// A true batched product [B, M, K] x [B, K, N] plus bias [N].
template <class T>
void check_batched() {
  test::fresh_engine();
  auto x = ramp_tensor<T>({4, 19, 13}, 0.29);
  auto w = ramp_tensor<T>({4, 13, 37}, 0.07);
  auto b = ramp_tensor<T>({37}, 0.5);
  Program p;
  auto [got, want] = compiled_and_eager<T>([&] { return relu(matmul(x, w) + b); }, &p);
  EXPECT_EQ(p.instrs.size(), 1u) << ir::to_text(p);
  folded(p);
  EXPECT_EQ(got, want);
  const auto xv = ramp<T>(4 * 19 * 13, 0.29), wv = ramp<T>(4 * 13 * 37, 0.07), bv = ramp<T>(37, 0.5);
  std::vector<double> host(4 * 19 * 37);
  for (int bi = 0; bi < 4; ++bi)
    for (int r = 0; r < 19; ++r)
      for (int j = 0; j < 37; ++j) {
        double acc = bv[j];
        for (int i = 0; i < 13; ++i)
          acc += static_cast<double>(xv[(bi * 19 + r) * 13 + i]) * wv[(bi * 13 + i) * 37 + j];
        host[(bi * 19 + r) * 37 + j] = std::max(acc, 0.0);
      }
  expect_host(got, host, 13);
}

TEST(FuseEpilogue, BatchedMatmul) { check_batched<float>(); }
TEST(FuseEpilogue, BatchedMatmulFloat64) { check_batched<double>(); }

// relu(conv2d(x, w, b)) over shapes that reach each conv algorithm.
template <class T>
void check_conv(const Shape& sx, const Shape& sw, Conv2dParams o_) {
  test::fresh_engine();
  auto x = ramp_tensor<T>(sx, 0.013);
  auto w = ramp_tensor<T>(sw, 0.021);
  auto b = ramp_tensor<T>({sw[0]}, 0.7);
  Program p;
  auto [got, want] = compiled_and_eager<T>([&] { return relu(conv2d(x, w, b, o_)); }, &p);
  // One instruction, and where the layout pass put the conv channels-last (cpu_backend.cpp's
  // choice; the FuseEpilogue.Nchw run keeps them all [N,C,H,W]), the transposes of its input
  // and result around it.
  const auto permutes = static_cast<std::size_t>(std::ranges::count_if(
      p.instrs, [](const ir::Instr& in) { return in.op == ir::Op::Permute; }));
  EXPECT_EQ(p.instrs.size() - permutes, 1u) << ir::to_text(p);
  if (const auto* in = folded(p)) {
    EXPECT_EQ(in->op, ir::Op::Conv2d);
    EXPECT_EQ(in->epilogue.activation, ir::Op::Relu);
    EXPECT_EQ(permutes, in->attr.get<ir::Conv2dAttr>().channels_last ? 2u : 0u) << ir::to_text(p);
    if (std::getenv("LOOM_CONV_LAYOUT") && std::string(std::getenv("LOOM_CONV_LAYOUT")) == "nchw") {
      EXPECT_FALSE(in->attr.get<ir::Conv2dAttr>().channels_last);
    }
  }
  EXPECT_EQ(got, want);
  // The conv by its definition (groups 1, dilation 1 here).
  const auto xv = ramp<T>(shape_numel(sx), 0.013), wv = ramp<T>(shape_numel(sw), 0.021),
             bv = ramp<T>(sw[0], 0.7);
  const int64_t n = sx[0], c = sx[1], h = sx[2], wd = sx[3], o = sw[0], kh = sw[2], kw = sw[3];
  const int64_t oh = (h + 2 * o_.padding[0] - kh) / o_.stride[0] + 1;
  const int64_t ow = (wd + 2 * o_.padding[1] - kw) / o_.stride[1] + 1;
  std::vector<double> host(static_cast<std::size_t>(n * o * oh * ow));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x) {
          double acc = bv[oc];
          for (int64_t ic = 0; ic < c; ++ic)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = y * o_.stride[0] - o_.padding[0] + i;
                const int64_t ix = x * o_.stride[1] - o_.padding[1] + j;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += static_cast<double>(xv[((b * c + ic) * h + iy) * wd + ix]) *
                       wv[((oc * c + ic) * kh + i) * kw + j];
              }
          host[((b * o + oc) * oh + y) * ow + x] = std::max(acc, 0.0);
        }
  expect_host(got, host, c * kh * kw);
}

TEST(FuseEpilogue, ConvBiasReluSmallPlanes) { check_conv<float>({2, 3, 5, 5}, {6, 3, 3, 3}, {}); }
TEST(FuseEpilogue, ConvBiasReluDirect) {
  Conv2dParams o;
  o.padding = {1, 1};
  check_conv<float>({2, 16, 12, 12}, {8, 16, 3, 3}, o);
}
TEST(FuseEpilogue, ConvBiasReluWinograd) {
  Conv2dParams o;
  o.padding = {1, 1};
  check_conv<float>({1, 64, 10, 10}, {64, 64, 3, 3}, o);
}
TEST(FuseEpilogue, ConvBiasReluStrided) {
  Conv2dParams o;
  o.stride = {2, 2};
  o.padding = {1, 1};
  check_conv<float>({2, 8, 17, 17}, {5, 8, 3, 3}, o);
}
TEST(FuseEpilogue, ConvBiasReluFloat64) {
  Conv2dParams o;
  o.padding = {1, 1};
  check_conv<double>({2, 4, 9, 9}, {6, 4, 3, 3}, o);
}
TEST(FuseEpilogue, ConvPointwiseFloat64) { check_conv<double>({2, 4, 6, 6}, {5, 4, 1, 1}, {}); }

TEST(FuseEpilogue, AProductWithAnotherReaderStaysStored) {
  test::fresh_engine();
  auto x = ramp_tensor<float>({8, 5}, 0.3);
  auto w = ramp_tensor<float>({5, 6}, 0.2);
  auto b = ramp_tensor<float>({6}, 0.4);
  auto mm = matmul(x, w);
  auto y = relu(mm + b) * mm;
  auto p = test::compile_for_cpu(test::graph_of(y));
  for (const auto& in : p.instrs) EXPECT_FALSE(in.epilogue.active()) << ir::to_text(p);
  auto got = y.to_vector<float>();
  EagerModeGuard eager{true};
  auto mm2 = matmul(x, w);
  EXPECT_EQ(got, (relu(mm2 + b) * mm2).to_vector<float>());
}

TEST(FuseEpilogue, AProductThatIsAnOutputStaysStored) {
  test::fresh_engine();
  auto x = ramp_tensor<float>({8, 5}, 0.3);
  auto w = ramp_tensor<float>({5, 6}, 0.2);
  auto b = ramp_tensor<float>({6}, 0.4);
  auto mm = matmul(x, w);
  auto y = relu(mm + b);
  auto p = test::compile_for_cpu(ir::build_graph({mm.impl()->pending(), y.impl()->pending()}));
  for (const auto& in : p.instrs) EXPECT_FALSE(in.epilogue.active()) << ir::to_text(p);
  EXPECT_EQ(test::count_instrs(p, ir::Op::Matmul), 1);
}

TEST(FuseEpilogue, ASumWithAnotherReaderKeepsItsActivationApart) {
  test::fresh_engine();
  auto x = ramp_tensor<float>({8, 5}, 0.3);
  auto w = ramp_tensor<float>({5, 6}, 0.2);
  auto b = ramp_tensor<float>({6}, 0.4);
  auto f = [&] {
    auto s = matmul(x, w) + b;
    return relu(s) + s;
  };
  Program p;
  auto [got, want] = compiled_and_eager<float>(f, &p);
  if (const auto* in = folded(p)) {
    EXPECT_EQ(in->epilogue.activation, ir::Op::Count_);
  }
  EXPECT_EQ(got, want);
}

TEST(FuseEpilogue, ANonBroadcastAddIsLeftAlone) {
  test::fresh_engine();
  auto x = ramp_tensor<float>({8, 5}, 0.3);
  auto w = ramp_tensor<float>({5, 6}, 0.2);
  auto c = ramp_tensor<float>({8, 1}, 0.4);  // one value per row, not per column
  auto y = relu(matmul(x, w) + c);
  auto p = test::compile_for_cpu(test::graph_of(y));
  for (const auto& in : p.instrs) EXPECT_FALSE(in.epilogue.active()) << ir::to_text(p);
}

// A training step through Linear + ReLU: the backward pass reads relu's output, which the
// folded matmul still writes, so the forward folds and the gradients match eager mode.
TEST(FuseEpilogue, GradientsThroughAFoldedLinearRelu) {
  auto run = [](bool eager_mode) {
    test::fresh_engine();
    EagerModeGuard eager{eager_mode};
    auto x = ramp_tensor<double>({12, 7}, 0.3);
    auto w = ramp_tensor<double>({9, 7}, 0.2).requires_grad_();
    auto b = ramp_tensor<double>({9}, 0.4).requires_grad_();
    auto loss = (relu(matmul(x, transpose(w, 0, 1)) + b) * 0.5).sum();
    loss.backward();
    if (!eager_mode) {
      auto p = test::compile_for_cpu(
          ir::build_graph({w.grad().impl()->pending(), b.grad().impl()->pending()}));
      EXPECT_EQ(folded(p)->epilogue.activation, ir::Op::Relu);
    }
    auto gw = w.grad().to_vector<double>();
    auto gb = b.grad().to_vector<double>();
    gw.insert(gw.end(), gb.begin(), gb.end());
    return gw;
  };
  const auto compiled = run(false);
  EXPECT_EQ(compiled, run(true));
  // On the host: loss = 0.5 sum relu(x w^T + b); d/dw[j] = 0.5 sum_r [s_rj > 0] x_r, d/db[j] = 0.5 #[s_rj > 0].
  const auto xv = ramp<double>(12 * 7, 0.3), wv = ramp<double>(9 * 7, 0.2), bv = ramp<double>(9, 0.4);
  std::vector<double> host(9 * 7 + 9, 0.0);
  for (int r = 0; r < 12; ++r)
    for (int j = 0; j < 9; ++j) {
      double sum = bv[j];
      for (int i = 0; i < 7; ++i) sum += xv[r * 7 + i] * wv[j * 7 + i];
      if (sum <= 0) continue;
      for (int i = 0; i < 7; ++i) host[j * 7 + i] += 0.5 * xv[r * 7 + i];
      host[9 * 7 + j] += 0.5;
    }
  expect_host(compiled, host, 12);
}

}  // namespace
}  // namespace loom
