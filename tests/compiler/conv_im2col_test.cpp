// compiler/conv_im2col.h: a forward conv the target asks for becomes Im2col and one Matmul.
// The programs are compiled for a copy of the CPU's target with the rule set (the CUDA
// target's, or one that takes every conv) and run on the CPU backend, against the CPU's own
// conv kernels, so the GPU's program shape and values are checked without a GPU.
#include "compiler/conv_im2col.h"
#include "test_util.h"

#include <loom/autocast.h>
#include <loom/autograd.h>

#include <cmath>
#include <cstring>

namespace loom {
namespace {

using ir::Op;

// A rule that takes every conv the pass can rewrite (one group, [N,C,H,W]).
bool every_conv(DType, const ir::Conv2dAttr&, const Shape&, const Shape&, const Shape&) {
  return true;
}

ir::Target cpu_target_with(decltype(ir::Target::conv_as_matmul) rule) {
  ir::Target t = runtime::backend(Device{}).target();
  t.conv_as_matmul = rule;
  return t;
}

template <class T>
std::vector<T> values_of(const std::vector<unsigned char>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

Tensor wave(const Shape& shape, double scale, DType dtype) {
  std::vector<double> v(static_cast<std::size_t>(shape_numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(scale * static_cast<double>(i + 1));
  return from_vector(v, shape).to(dtype);
}

// Compiles conv2d(x, w) in `dtype` (its result read as float64) with `rule` and without any,
// runs both on the CPU backend, and returns the largest difference relative to the largest
// magnitude; `rewritten` says whether the rule's program holds Im2col and Matmul in place of
// Conv2d.
struct Compared {
  double relative_error = 0, magnitude = 0;
  bool rewritten = false;
};

Compared compare(const Shape& xs, const Shape& ws, const Conv2dParams& params,
                 decltype(ir::Target::conv_as_matmul) rule, DType dtype) {
  test::fresh_engine();
  auto x = wave(xs, 0.37, dtype);
  auto w = wave(ws, 0.11, dtype);
  mark_step();
  auto y = conv2d(x, w, {}, params).to(DType::Float64);
  const auto g = test::graph_of(y);
  const auto p = compiler::compile(g, cpu_target_with(rule));
  Compared c;
  c.rewritten = test::count_instrs(p, Op::Conv2d) == 0 && test::count_instrs(p, Op::Im2col) == 1 &&
                test::count_instrs(p, Op::Matmul) == 1;
  const auto got = values_of<double>(test::run_on_cpu(g, cpu_target_with(rule))[0]);
  const auto want = values_of<double>(test::run_on_cpu(g, cpu_target_with(nullptr))[0]);
  EXPECT_EQ(got.size(), want.size());
  double err = 0, mag = 0;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    mag = std::max(mag, std::abs(want[i]));
  }
  c.relative_error = err / mag;
  c.magnitude = mag;
  mark_step();
  return c;
}

TEST(ConvIm2col, EveryGeometryGivesTheConvsValues) {
  struct Case {
    const char* what;
    Shape x, w;
    Conv2dParams params;
  };
  const Case cases[] = {
      {"3x3 pad 1, batch 1", {1, 8, 4, 4}, {16, 8, 3, 3}, {.padding = {1, 1}}},
      {"3x3 stride 2 pad 1, three images", {3, 4, 7, 6}, {5, 4, 3, 3},
       {.stride = {2, 2}, .padding = {1, 1}}},
      {"1x1 stride 2 (a projection)", {2, 6, 8, 8}, {12, 6, 1, 1}, {.stride = {2, 2}}},
      {"3x2 window, stride (2, 1), padding (1, 0), dilation (1, 2)", {2, 3, 9, 7}, {4, 3, 3, 2},
       {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}}},
      {"no padding, a window the size of the plane", {1, 5, 3, 3}, {7, 5, 3, 3}, {}},
  };
  for (const auto& c : cases) {
    const auto r = compare(c.x, c.w, c.params, every_conv, DType::Float64);
    EXPECT_TRUE(r.rewritten) << c.what;
    EXPECT_LT(r.relative_error, 1e-13) << c.what;
  }
}

// The float32 bound is the conv kernel's: below AVX-512 the conv compared with runs as loom's
// Winograd in 4x4 output tiles, within 1e-4 of the operands' scale (conv_winograd_f32.h);
// elsewhere oneDNN's direct kernels, within 1e-5.
TEST(ConvIm2col, Float32AndBFloat16KeepTheirTolerances) {
  for (DType t : {DType::Float32, DType::BFloat16}) {
    const auto r = compare({1, 64, 4, 4}, {128, 64, 3, 3}, {.padding = {1, 1}}, every_conv, t);
    EXPECT_TRUE(r.rewritten) << dtype_name(t);
    EXPECT_LT(r.relative_error, t == DType::Float32 ? 1e-4 : 1e-2) << dtype_name(t);
    EXPECT_GT(r.magnitude, 1.0) << dtype_name(t);
  }
}

// The CUDA target's rule: fewer output positions than output channels, one group, [N,C,H,W].
TEST(ConvIm2col, TheTinyPlaneRuleTakesResNet18sLastStagesAtBatch1) {
  const ir::Conv2dAttr pad1{.padding = {1, 1}};
  auto takes = [&](const Shape& x, const Shape& w, const Shape& y, ir::Conv2dAttr a) {
    return compiler::tiny_plane_conv(DType::Float32, a, x, w, y);
  };
  EXPECT_TRUE(takes({1, 512, 4, 4}, {512, 512, 3, 3}, {1, 512, 4, 4}, pad1));
  EXPECT_TRUE(takes({1, 256, 8, 8}, {256, 256, 3, 3}, {1, 256, 8, 8}, pad1));
  EXPECT_TRUE(takes({1, 256, 8, 8}, {512, 256, 1, 1}, {1, 512, 4, 4}, {.stride = {2, 2}}));
  EXPECT_FALSE(takes({1, 128, 16, 16}, {128, 128, 3, 3}, {1, 128, 16, 16}, pad1));
  EXPECT_FALSE(takes({256, 512, 4, 4}, {512, 512, 3, 3}, {256, 512, 4, 4}, pad1));
  ir::Conv2dAttr grouped = pad1;
  grouped.groups = 2;
  EXPECT_FALSE(takes({1, 512, 4, 4}, {512, 256, 3, 3}, {1, 512, 4, 4}, grouped));
  ir::Conv2dAttr last = pad1;
  last.channels_last = true;
  EXPECT_FALSE(takes({1, 512, 4, 4}, {512, 512, 3, 3}, {1, 512, 4, 4}, last));

  // The wider rule (LOOM_CONV_IM2COL=small_output): every conv of a batch-1 evaluation, the
  // 64-channel 32x32 stage's too, and none of a batch-4 one's first stage.
  auto small = [&](const Shape& x, const Shape& w, const Shape& y) {
    return compiler::small_output_conv(DType::Float32, pad1, x, w, y);
  };
  EXPECT_TRUE(small({1, 64, 32, 32}, {64, 64, 3, 3}, {1, 64, 32, 32}));
  EXPECT_TRUE(small({1, 512, 4, 4}, {512, 512, 3, 3}, {1, 512, 4, 4}));
  EXPECT_FALSE(small({4, 64, 32, 32}, {64, 64, 3, 3}, {4, 64, 32, 32}));

  // In a program: at batch 1 the 512-channel conv is rewritten, at batch 64 it is not.
  for (int64_t n : {1, 64}) {
    test::fresh_engine();
    auto x = wave({n, 32, 2, 2}, 0.3, DType::Float32);
    auto w = wave({64, 32, 3, 3}, 0.2, DType::Float32);
    mark_step();
    const auto p = compiler::compile(test::graph_of(conv2d(x, w, {}, {.padding = {1, 1}})),
                                     cpu_target_with(compiler::tiny_plane_conv));
    EXPECT_EQ(test::count_instrs(p, Op::Im2col), n == 1 ? 1 : 0) << ir::to_text(p);
    EXPECT_EQ(test::count_instrs(p, Op::Conv2d), n == 1 ? 0 : 1) << ir::to_text(p);
    mark_step();
  }
}

// In a training step only the forward conv changes: its gradients keep their kernels, and the
// loss and both gradients are the conv's (float64).
TEST(ConvIm2col, GradientsKeepTheirKernelsAndValues) {
  test::fresh_engine();
  auto x = wave({1, 16, 4, 4}, 0.37, DType::Float64);
  auto w = wave({32, 16, 3, 3}, 0.11, DType::Float64);
  x.requires_grad_();
  w.requires_grad_();
  mark_step();
  auto y = conv2d(x, w, {}, {.padding = {1, 1}});
  auto loss = sum(y * y);
  loss.backward();
  const auto g = ir::build_graph(
      {loss.impl()->pending(), x.grad().impl()->pending(), w.grad().impl()->pending()});
  const auto p = compiler::compile(g, cpu_target_with(every_conv));
  EXPECT_EQ(test::count_instrs(p, Op::Conv2d), 0) << ir::to_text(p);
  EXPECT_EQ(test::count_instrs(p, Op::Conv2dGradInput), 1) << ir::to_text(p);
  EXPECT_EQ(test::count_instrs(p, Op::Conv2dGradWeight), 1) << ir::to_text(p);
  const auto got = test::run_on_cpu(g, cpu_target_with(every_conv));
  const auto want = test::run_on_cpu(g, cpu_target_with(nullptr));
  ASSERT_EQ(got.size(), 3u);
  for (std::size_t k = 0; k < got.size(); ++k) {
    const auto a = values_of<double>(got[k]), b = values_of<double>(want[k]);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i], 1e-10 * std::max(1.0, std::abs(b[i])))
          << "output " << k << " [" << i << "]";
  }
  mark_step();
}

}  // namespace
}  // namespace loom
