// oneDNN behind the CPU kernels (runtime/cpu/onednn.h): each conv pass in both layouts and
// both dtypes, and the matmul with its transposes, batches and epilogue, against a float64
// reference by the definition; the epilogue's post-ops giving the bits of the separate add and
// relu; the primitive cache; the heap allocations of a steady call; which results depend on
// the thread count; and the bfloat16 ops the CPU target keeps in bfloat16.
//
// Tolerances: float32 as conv_kernels_test's, kUlps * eps * sqrt(terms) * (|want| + rms(want))
// with `terms` the products summed into one element; bfloat16 1e-2 * (|want| + rms(want))
// against the reference on the bfloat16-rounded operands (the result is rounded to bfloat16,
// 2^-9 relative, after a float32 sum).
#include "runtime/cpu/onednn.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/heap_count.h"
#include "runtime/cpu/kernels.h"
#include "runtime/expect_near.h"
#include "runtime/registry.h"

#include <loom/bfloat16.h>
#include <loom/lazy.h>

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

using onednn::Layout;

constexpr double kUlps = 16;
constexpr double kBFloat16Tolerance = 1e-2;

double tolerance(DType t, int64_t terms) {
  if (t == DType::BFloat16) return kBFloat16Tolerance;
  return kUlps * std::numeric_limits<float>::epsilon() *
         std::sqrt(static_cast<double>(std::max<int64_t>(terms, 1)));
}

// Values in [-1, 1], already representable in `t` (so the reference sees what the kernel sees).
std::vector<double> random_values(int64_t n, unsigned seed, DType t) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    x = static_cast<float>(dist(gen));
    if (t == DType::BFloat16) x = round_to_bfloat16(static_cast<float>(x));
  }
  return v;
}

// A buffer of `t` holding `values`, and back.
struct Buffer {
  DType dtype;
  std::vector<float> f;
  std::vector<bfloat16> h;
  Buffer(DType t, const std::vector<double>& values) : dtype(t) {
    for (double v : values) {
      if (t == DType::BFloat16) h.push_back(bfloat16(static_cast<float>(v)));
      else f.push_back(static_cast<float>(v));
    }
  }
  Buffer(DType t, int64_t n) : Buffer(t, std::vector<double>(static_cast<std::size_t>(n), 12345.0)) {}
  void* data() { return dtype == DType::BFloat16 ? static_cast<void*>(h.data()) : f.data(); }
  std::vector<double> values() const {
    if (dtype == DType::BFloat16) return {h.begin(), h.end()};
    return {f.begin(), f.end()};
  }
};

// ---- convolutions ----

struct Case {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, groups;
};

ConvGeometry geometry(const Case& k) {
  const int64_t oh = (k.h + 2 * k.ph - k.dh * (k.kh - 1) - 1) / k.sh + 1;
  const int64_t ow = (k.w + 2 * k.pw - k.dw * (k.kw - 1) - 1) / k.sw + 1;
  return {k.n, k.c, k.h, k.w, k.o, k.kh, k.kw, oh, ow, k.sh, k.sw, k.ph, k.pw, k.dh, k.dw, k.groups};
}

std::string name(const ConvGeometry& g, DType t, Layout layout) {
  std::ostringstream s;
  s << "n" << g.n << " c" << g.c << " " << g.h << "x" << g.w << " o" << g.o << " k" << g.kh << "x"
    << g.kw << " s" << g.sh << "," << g.sw << " p" << g.ph << "," << g.pw << " d" << g.dh << ","
    << g.dw << " g" << g.groups << " " << dtype_name(t)
    << (layout == Layout::kPlain           ? " plain"
        : layout == Layout::kBlocked       ? " blocked"
        : layout == Layout::kChannelsLast  ? " channels-last"
                                           : " channels-last via blocked");
  return s.str();
}

struct Reference {
  std::vector<double> out, grad_in, grad_w;
};

// out, and the gradients of sum(out * grad_out), by the definition.
Reference reference(const ConvGeometry& g, const std::vector<double>& x,
                    const std::vector<double>& w, const std::vector<double>& go) {
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  Reference r{std::vector<double>(go.size()), std::vector<double>(x.size()),
              std::vector<double>(w.size())};
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t y = 0; y < g.oh; ++y)
        for (int64_t xx = 0; xx < g.ow; ++xx) {
          const int64_t oi = ((n * g.o + o) * g.oh + y) * g.ow + xx;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < g.kh; ++i)
              for (int64_t j = 0; j < g.kw; ++j) {
                const int64_t iy = y * g.sh - g.ph + i * g.dh, ix = xx * g.sw - g.pw + j * g.dw;
                if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                const int64_t xi = ((n * g.c + o / og * cg + c) * g.h + iy) * g.w + ix;
                const int64_t wi = ((o * cg + c) * g.kh + i) * g.kw + j;
                r.out[oi] += x[xi] * w[wi];
                r.grad_in[xi] += go[oi] * w[wi];
                r.grad_w[wi] += go[oi] * x[xi];
              }
        }
  return r;
}

std::vector<double> run_pass(ConvPass pass, const ConvGeometry& g, DType t, Layout layout,
                             const std::vector<double>& a, const std::vector<double>& b,
                             int64_t out_size) {
  Buffer ba(t, a), bb(t, b), out(t, out_size);
  onednn::conv2d(pass, g, t, layout, ba.data(), bb.data(), out.data());
  return out.values();
}

// [n,c,h,w] values to [n,h,w,c] (last) or back.
std::vector<double> transposed(const std::vector<double>& v, int64_t n, int64_t c, int64_t h,
                               int64_t w, bool to_last) {
  std::vector<double> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          const int64_t first = ((i * c + k) * h + y) * w + x, last = ((i * h + y) * w + x) * c + k;
          if (to_last) out[last] = v[first];
          else out[first] = v[last];
        }
  return out;
}

// Runs one conv pass on `a` and `b` in the activations' layout the caller gave, returning the
// result in that layout too.
using PassRunner = std::function<std::vector<double>(
    ConvPass, const ConvGeometry&, const std::vector<double>&, const std::vector<double>&,
    int64_t)>;

// The three passes of case k, run by `run` (activations channels-last when `last`), against
// the reference.
void check_passes(const Case& k, DType t, bool last, const std::string& what,
                  const PassRunner& run) {
  const ConvGeometry g = geometry(k);
  const int64_t nx = g.n * g.c * g.h * g.w, nw = g.o * (g.c / g.groups) * g.kh * g.kw,
                ny = g.n * g.o * g.oh * g.ow;
  const auto x = random_values(nx, 1, t), w = random_values(nw, 2, t), go = random_values(ny, 3, t);
  const Reference r = reference(g, x, w, go);
  const int64_t taps = g.kh * g.kw;
  // Channels-last: the activations go in as [N,H,W,C] and come back so.
  const auto act_x = [&](const std::vector<double>& v, bool to_last) {
    return last ? transposed(v, g.n, g.c, g.h, g.w, to_last) : v;
  };
  const auto act_y = [&](const std::vector<double>& v, bool to_last) {
    return last ? transposed(v, g.n, g.o, g.oh, g.ow, to_last) : v;
  };
  expect_near(act_y(run(ConvPass::kForward, g, act_x(x, true), w, ny), false), r.out,
              tolerance(t, g.c / g.groups * taps), what + " forward");
  expect_near(act_x(run(ConvPass::kGradInput, g, act_y(go, true), w, nx), false), r.grad_in,
              tolerance(t, g.o / g.groups * taps), what + " grad_input");
  expect_near(run(ConvPass::kGradWeight, g, act_x(x, true), act_y(go, true), nw), r.grad_w,
              tolerance(t, g.n * g.oh * g.ow), what + " grad_weight");
}

// On oneDNN directly, in `layout`.
void check_conv(const Case& k, DType t, Layout layout) {
  const bool last = layout == Layout::kChannelsLast || layout == Layout::kChannelsLastBlocked;
  check_passes(k, t, last, name(geometry(k), t, layout),
               [&](ConvPass pass, const ConvGeometry& g, const std::vector<double>& a,
                   const std::vector<double>& b, int64_t out_size) {
                 return run_pass(pass, g, t, layout, a, b, out_size);
               });
}

const Case kCases[] = {
    {2, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // a ResNet block, small
    {3, 5, 7, 9, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1},      // odd sizes, channels not a multiple of 16
    {2, 4, 10, 6, 6, 3, 3, 1, 1, 0, 0, 1, 1, 1},     // no padding
    {2, 4, 9, 11, 4, 3, 5, 1, 1, 2, 1, 1, 1, 1},     // a 3x5 kernel, padding differing per axis
    {2, 3, 12, 10, 5, 3, 3, 1, 1, 2, 2, 2, 2, 1},    // dilation
    {2, 6, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2},      // groups
    {2, 32, 6, 6, 48, 3, 3, 1, 1, 1, 1, 1, 1, 2},    // groups of 16 and 24 channels
    {2, 8, 5, 5, 12, 1, 1, 1, 1, 0, 0, 1, 1, 1},     // 1x1
    {2, 16, 6, 6, 32, 1, 1, 2, 2, 0, 0, 1, 1, 1},    // 1x1 stride 2 (a projection shortcut)
    {2, 16, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1},     // stride 2, odd size
    {3, 16, 16, 16, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1},  // a ResNet stage entry, small
    {2, 4, 11, 10, 6, 5, 4, 3, 2, 2, 1, 1, 1, 1},    // stride 3 x 2, a wider kernel
    {2, 3, 6, 6, 4, 3, 3, 1, 1, 3, 3, 1, 1, 1},      // padding beyond the kernel's reach
    {4, 3, 16, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1},   // a stem: 3 input channels
    {2, 64, 7, 5, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1},    // wide, odd planes
    {2, 130, 3, 5, 66, 3, 3, 1, 1, 1, 1, 1, 1, 1},   // channels past blocks of 16
};

TEST(OneDnn, ConvPassesMatchReferenceFloat32) {
  for (Layout layout :
       {Layout::kPlain, Layout::kBlocked, Layout::kChannelsLast, Layout::kChannelsLastBlocked})
    for (const Case& k : kCases) check_conv(k, DType::Float32, layout);
}

// Channels-last activations go through the blocked layouts only for the float32 forward of
// 3x3 convs with 32 channels or more on both sides, on a CPU below AVX-512 (where oneDNN has
// no bfloat16 kernels either: bfloat16_supported is the same test of its ISA).
TEST(OneDnn, ChannelsLastConvsGoBlockedOnlyWhereMeasuredFaster) {
  const ConvGeometry wide = geometry({2, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1});
  const ConvGeometry narrow = geometry(kCases[0]);  // 16 channels
  const ConvGeometry pointwise = geometry(kCases[8]);
  const Layout blocked =
      onednn::bfloat16_supported() ? Layout::kChannelsLast : Layout::kChannelsLastBlocked;
  EXPECT_EQ(onednn::channels_last_layout(wide, ConvPass::kForward, DType::Float32), blocked);
  for (ConvPass pass : {ConvPass::kGradInput, ConvPass::kGradWeight})
    EXPECT_EQ(onednn::channels_last_layout(wide, pass, DType::Float32), Layout::kChannelsLast);
  EXPECT_EQ(onednn::channels_last_layout(wide, ConvPass::kForward, DType::BFloat16),
            Layout::kChannelsLast);
  EXPECT_EQ(onednn::channels_last_layout(narrow, ConvPass::kForward, DType::Float32),
            Layout::kChannelsLast);
  EXPECT_EQ(onednn::channels_last_layout(pointwise, ConvPass::kForward, DType::Float32),
            Layout::kChannelsLast);
}

// oneDNN has bfloat16 kernels from AVX-512 on (emulated there without AVX512_BF16).
constexpr const char* kNoBFloat16 =
    "oneDNN has no bfloat16 convs or matmuls on this CPU (it needs AVX-512); "
    "BFloat16KernelsRunOnEveryCpu checks the kernels' widened path instead";

TEST(OneDnn, ConvPassesMatchReferenceBFloat16) {
  if (!onednn::bfloat16_supported()) GTEST_SKIP() << kNoBFloat16;
  for (Layout layout : {Layout::kPlain, Layout::kBlocked, Layout::kChannelsLast})
    for (const Case& k : kCases) check_conv(k, DType::BFloat16, layout);
}

// The bias and relu as post-ops give the bits of the conv followed by a separate add and relu
// (what eager mode runs), so folding an epilogue (compiler/fuse_epilogue.h) changes nothing.
TEST(OneDnn, ConvEpilogueGivesTheBitsOfTheSeparateOps) {
  for (Layout layout : {Layout::kPlain, Layout::kBlocked})
    for (const Case& k : {kCases[0], kCases[1], kCases[8], kCases[10], kCases[15]}) {
      const ConvGeometry g = geometry(k);
      const auto x = random_values(g.n * g.c * g.h * g.w, 1, DType::Float32);
      const auto w = random_values(g.o * (g.c / g.groups) * g.kh * g.kw, 2, DType::Float32);
      const auto bias = random_values(g.o, 4, DType::Float32);
      const int64_t ny = g.n * g.o * g.oh * g.ow;
      Buffer bx(DType::Float32, x), bw(DType::Float32, w), bb(DType::Float32, bias);
      Buffer fused(DType::Float32, ny), plain(DType::Float32, ny);
      onednn::conv2d(ConvPass::kForward, g, DType::Float32, layout, bx.data(), bw.data(),
                     fused.data(), {bb.f.data(), true});
      onednn::conv2d(ConvPass::kForward, g, DType::Float32, layout, bx.data(), bw.data(),
                     plain.data());
      const int64_t plane = g.oh * g.ow;
      for (int64_t i = 0; i < ny; ++i) {
        const float sum = plain.f[i] + bb.f[i / plane % g.o];
        ASSERT_EQ(fused.f[i], sum < 0 ? 0.0f : sum) << name(g, DType::Float32, layout) << " at " << i;
      }
    }
}

// ---- matmul ----

struct MatmulCase {
  int64_t batch, m, k, n;
  bool ta, tb;
};

// Where a matmul runs: on oneDNN directly, or through the kernels' dispatch (run_kernel).
enum class Via { kOneDnn, kKernel };

void check_matmul(const MatmulCase& c, DType t, bool epilogue, Via via = Via::kOneDnn) {
  const auto a = random_values(c.batch * c.m * c.k, 5, t), b = random_values(c.batch * c.k * c.n, 6, t);
  const auto bias = random_values(c.n, 7, DType::Float32);
  std::vector<double> want(static_cast<std::size_t>(c.batch * c.m * c.n));
  for (int64_t q = 0; q < c.batch; ++q)
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double s = epilogue ? bias[j] : 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double av = c.ta ? a[(q * c.k + p) * c.m + i] : a[(q * c.m + i) * c.k + p];
          const double bv = c.tb ? b[(q * c.n + j) * c.k + p] : b[(q * c.k + p) * c.n + j];
          s += av * bv;
        }
        want[(q * c.m + i) * c.n + j] = epilogue ? std::max(s, 0.0) : s;
      }
  Buffer ba(t, a), bb(t, b), bias32(DType::Float32, bias), out(t, c.batch * c.m * c.n);
  if (via == Via::kOneDnn) {
    onednn::matmul({c.batch, c.m, c.n, c.k, c.ta, c.tb}, t, ba.data(), bb.data(), out.data(),
                   epilogue ? onednn::Epilogue{bias32.f.data(), true} : onednn::Epilogue{});
  } else {
    assert(!epilogue && "check_matmul: run_kernel's Matmul has no epilogue");
    const Shape sa = c.ta ? Shape{c.batch, c.k, c.m} : Shape{c.batch, c.m, c.k};
    const Shape sb = c.tb ? Shape{c.batch, c.n, c.k} : Shape{c.batch, c.k, c.n};
    const std::vector<TensorView> in{{ba.data(), t, sa}, {bb.data(), t, sb}};
    run_kernel(ir::Op::Matmul, ir::MatmulAttr{.transpose_a = c.ta, .transpose_b = c.tb}, in,
               {out.data(), t, {c.batch, c.m, c.n}});
  }
  std::ostringstream what;
  what << c.batch << "x[" << c.m << "," << c.k << "]x[" << c.k << "," << c.n << "]"
       << (c.ta ? " ta" : "") << (c.tb ? " tb" : "") << (epilogue ? " +bias relu " : " ")
       << dtype_name(t) << (via == Via::kKernel ? " run_kernel" : "");
  expect_near(out.values(), want, tolerance(t, c.k), what.str());
}

const MatmulCase kMatmuls[] = {
    {1, 37, 29, 41, false, false}, {1, 37, 29, 41, true, false}, {1, 37, 29, 41, false, true},
    {1, 37, 29, 41, true, true},   {6, 17, 64, 9, false, true},  {3, 1, 100, 7, false, false},
    {2, 64, 300, 48, true, false}, {1, 5, 1, 3, false, false},
};

TEST(OneDnn, MatmulMatchesReference) {
  for (DType t : {DType::Float32, DType::BFloat16}) {
    if (t == DType::BFloat16 && !onednn::bfloat16_supported()) {
      std::printf("%s: bfloat16 cases skipped\n", kNoBFloat16);
      continue;
    }
    for (bool epilogue : {false, true})
      for (const MatmulCase& c : kMatmuls) check_matmul(c, t, epilogue);
  }
}

// Products whose k-major operands have rows 2 KB apart (a Linear's weight gradient at width
// 512, its input gradient's weight, a 1x1 conv's weight gradient): on an AVX2 CPU oneDNN reads
// them from padded copies (matmul_read_strides), with or without the epilogue, called directly
// and through run_kernel (each large enough for oneDNN there: matmul_on_onednn).
TEST(OneDnn, PaddedOperandsMatchReference) {
  const MatmulCase cases[] = {
      {1, 512, 48, 512, true, false},  // both operands padded where the CPU pads
      {1, 512, 96, 64, true, false},   // a only
      {1, 64, 96, 1024, false, false}, // b only
      {1, 512, 33, 512, true, true},   // a only: b is stored [n, k]
  };
  for (const MatmulCase& c : cases) {
    for (bool epilogue : {false, true}) check_matmul(c, DType::Float32, epilogue);
    check_matmul(c, DType::Float32, false, Via::kKernel);
  }
}

// Which operands are padded: only k-major ones (a when ta, b unless tb) whose rows are a
// multiple of 512 float32 apart, in float32 products of at most 512 x 512 outputs, whose copy
// takes at most 32 MB, and only below AVX-512, where it was measured.
TEST(OneDnn, OnlyAliasingKMajorOperandsOfSmallProductsArePadded) {
  const bool pads = !onednn::avx512_core();
  const auto strides = [](onednn::MatmulShape s, DType t = DType::Float32) {
    const auto r = onednn::matmul_read_strides(s, t);
    return std::pair{r.a, r.b};
  };
  const int64_t p = pads ? 16 : 0;
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(strides({.m = 512, .n = 512, .k = 2048, .ta = true}), (P{512 + p, 512 + p}));
  EXPECT_EQ(strides({.m = 512, .n = 512, .k = 2048, .ta = true, .tb = true}), (P{512 + p, 2048}))
      << "b stored [n, k] is read along its rows";
  EXPECT_EQ(strides({.m = 512, .n = 512, .k = 1024}), (P{1024, 512 + p}))
      << "a stored [m, k] is read along its rows";
  EXPECT_EQ(strides({.m = 1024, .n = 256, .k = 2048, .ta = true}), (P{1024 + p, 256}))
      << "rows 1 KB apart are read as they are";
  EXPECT_EQ(strides({.m = 640, .n = 512, .k = 2048, .ta = true}), (P{640, 512}))
      << "a product of more than 512 x 512 outputs";
  EXPECT_EQ(strides({.batch = 2, .m = 512, .n = 512, .k = 64, .ta = true}), (P{512, 512}))
      << "a batch of products";
  EXPECT_EQ(strides({.m = 512, .n = 512, .k = 64, .ta = true}, DType::BFloat16), (P{512, 512}));
  EXPECT_EQ(strides({.m = 512, .n = 512, .k = 15000, .ta = true}), (P{512 + p, 512 + p}));
  EXPECT_EQ(strides({.m = 512, .n = 512, .k = 17000, .ta = true}), (P{512, 512}))
      << "copies of more than 32 MB";
}

// One bfloat16 conv pass through the kernels' own dispatch (run_kernel), activations
// channels-last when `last`.
std::vector<double> run_conv_kernel(ConvPass pass, const ConvGeometry& g, bool last,
                                    const std::vector<double>& a, const std::vector<double>& b,
                                    int64_t out_size) {
  const DType t = DType::BFloat16;
  Buffer ba(t, a), bb(t, b), out(t, out_size);
  const Shape x = last ? Shape{g.n, g.h, g.w, g.c} : Shape{g.n, g.c, g.h, g.w};
  const Shape y = last ? Shape{g.n, g.oh, g.ow, g.o} : Shape{g.n, g.o, g.oh, g.ow};
  const Shape w{g.o, g.c / g.groups, g.kh, g.kw};
  const ir::Conv2dAttr conv{.stride = {g.sh, g.sw}, .padding = {g.ph, g.pw},
                            .dilation = {g.dh, g.dw}, .groups = g.groups, .channels_last = last};
  switch (pass) {
    case ConvPass::kForward: {
      const std::vector<TensorView> in{{ba.data(), t, x}, {bb.data(), t, w}};
      run_kernel(ir::Op::Conv2d, conv, in, {out.data(), t, y});
      break;
    }
    case ConvPass::kGradInput: {
      const std::vector<TensorView> in{{ba.data(), t, y}, {bb.data(), t, w}};
      run_kernel(ir::Op::Conv2dGradInput, ir::Conv2dGradAttr{conv, {g.h, g.w}}, in,
                 {out.data(), t, x});
      break;
    }
    case ConvPass::kGradWeight: {
      const std::vector<TensorView> in{{ba.data(), t, x}, {bb.data(), t, y}};
      run_kernel(ir::Op::Conv2dGradWeight, ir::Conv2dGradAttr{conv, {g.kh, g.kw}}, in,
                 {out.data(), t, w});
      break;
    }
  }
  return out.values();
}

// Bfloat16 convs and a matmul through the kernels' own dispatch (run_kernel), which takes
// oneDNN where it has bfloat16 kernels and loom's float32 ones on widened copies where it has
// none (an AVX2-only CPU), whatever LOOM_CONV asks: the reference holds on every CPU, the convs
// in [N,C,H,W] and channels-last.
TEST(OneDnn, BFloat16KernelsRunOnEveryCpu) {
  const DType t = DType::BFloat16;
  for (bool last : {false, true})
    for (const Case& k : {kCases[0], kCases[9], kCases[14]})
      check_passes(k, t, last,
                   name(geometry(k), t, last ? Layout::kChannelsLast : Layout::kPlain) +
                       " run_kernel",
                   [&](ConvPass pass, const ConvGeometry& g, const std::vector<double>& a,
                       const std::vector<double>& b, int64_t out_size) {
                     return run_conv_kernel(pass, g, last, a, b, out_size);
                   });
  // Large enough for oneDNN (matmul_on_onednn).
  check_matmul({1, 96, 256, 160, false, false}, t, false, Via::kKernel);
  check_matmul({2, 64, 300, 48, true, true}, t, false, Via::kKernel);
}

// ---- the cache, the heap, threads ----

// A shape seen before creates no primitive: not on the second call, nor after other shapes.
TEST(OneDnn, CachedShapesCreateNoPrimitive) {
  const ConvGeometry g = geometry({1, 7, 6, 6, 9, 3, 3, 1, 1, 1, 1, 1, 1, 1});  // this test's own
  Buffer x(DType::Float32, 64), w(DType::Float32, 64 * 9), y(DType::Float32, 64 * 9);
  auto conv = [&] {
    onednn::conv2d(ConvPass::kForward, g, DType::Float32, Layout::kBlocked, x.data(), w.data(), y.data());
  };
  auto mm = [&] { onednn::matmul({1, 8, 8, 8}, DType::Float32, x.data(), w.data(), y.data()); };
  conv();
  mm();
  const int64_t created = onednn::primitives_created();
  conv();
  mm();
  conv();
  EXPECT_EQ(onednn::primitives_created(), created);
  onednn::conv2d(ConvPass::kForward, g, DType::Float32, Layout::kPlain, x.data(), w.data(), y.data());
  EXPECT_EQ(onednn::primitives_created(), created + 1) << "another layout is another primitive";
}

// A steady call asks the heap for nothing on loom's side: oneDNN's own allocations inside
// execute count apart (ExecuteHeapAllocLibrary).
TEST(OneDnn, SteadyCallsAllocateOnlyInsideTheLibrary) {
  if (kSanitizerAllocator) GTEST_SKIP() << kSanitizerAllocatorSkip;
  ASSERT_TRUE(heap_counting_supported());
  const ConvGeometry g = geometry(kCases[10]);
  Buffer x(DType::Float32, g.n * g.c * g.h * g.w), w(DType::Float32, g.o * g.c * 9),
      y(DType::Float32, g.n * g.o * g.oh * g.ow);
  auto calls = [&] {
    for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput, ConvPass::kGradWeight}) {
      void* a = pass == ConvPass::kGradInput ? y.data() : x.data();
      void* b = pass == ConvPass::kGradWeight ? y.data() : w.data();
      void* out = pass == ConvPass::kForward ? y.data() : pass == ConvPass::kGradInput ? x.data() : w.data();
      onednn::conv2d(pass, g, DType::Float32, Layout::kBlocked, a, b, out);
    }
    onednn::matmul({1, 64, 64, 64}, DType::Float32, x.data(), w.data(), y.data());
  };
  calls();  // creates the primitives and grows the buffers
  HeapCount counting;
  const int64_t before = heap_allocations(), library = library_heap_allocations();
  calls();
  EXPECT_EQ(heap_allocations() - before, 0);
  EXPECT_GT(library_heap_allocations() - library, 0) << "oneDNN's own are counted apart";
}

// oneDNN's forward and input gradient give each output element to one thread; its weight
// gradient splits the sum over images by the thread count, so loom keeps that pass on its
// own kernels when deterministic algorithms are asked for.
TEST(OneDnn, ForwardAndInputGradientIndependentOfThreadCount) {
  for (const Case& k : {kCases[0], kCases[10], Case{8, 64, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}})
    for (Layout layout : {Layout::kPlain, Layout::kBlocked})
      for (ConvPass pass : {ConvPass::kForward, ConvPass::kGradInput}) {
        const ConvGeometry g = geometry(k);
        const int64_t nx = g.n * g.c * g.h * g.w, ny = g.n * g.o * g.oh * g.ow;
        const auto a = random_values(pass == ConvPass::kForward ? nx : ny, 1, DType::Float32);
        const auto w = random_values(g.o * g.c * g.kh * g.kw, 2, DType::Float32);
        auto in_arena = [&](int threads) {
          std::vector<double> r;
          tbb::task_arena(threads).execute([&] {
            r = run_pass(pass, g, DType::Float32, layout, a, w, pass == ConvPass::kForward ? ny : nx);
          });
          return r;
        };
        const auto one = in_arena(1);
        EXPECT_EQ(in_arena(2), one) << name(g, DType::Float32, layout);
      }
}

// oneDNN's GEMM splits k across threads where m x n is small (a weight gradient's [64, 4096] x
// [4096, 64] differs between one and two threads), so deterministic algorithms keep every
// matmul on Eigen, whose split is by rows and columns only: the same bits on 1, 2 and 4
// threads, even where LOOM_MATMUL=onednn would force oneDNN.
TEST(OneDnn, DeterministicMatmulIndependentOfThreadCount) {
  use_deterministic_algorithms(true);
  for (const MatmulCase& c : {MatmulCase{1, 512, 2048, 384, true, false},
                              MatmulCase{1, 300, 700, 200, false, true},
                              MatmulCase{1, 64, 4096, 64, true, false}}) {
    Buffer a(DType::Float32, random_values(c.m * c.k, 5, DType::Float32));
    Buffer b(DType::Float32, random_values(c.k * c.n, 6, DType::Float32));
    const Shape sa = c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
    const Shape sb = c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
    const std::vector<TensorView> in{{a.data(), DType::Float32, sa}, {b.data(), DType::Float32, sb}};
    auto in_arena = [&](int threads) {
      Buffer out(DType::Float32, c.m * c.n);
      tbb::task_arena(threads).execute([&] {
        run_kernel(ir::Op::Matmul, ir::MatmulAttr{.transpose_a = c.ta, .transpose_b = c.tb}, in,
                   {out.data(), DType::Float32, {c.m, c.n}});
      });
      return out.values();
    };
    const auto one = in_arena(1);
    for (int threads : {2, 4}) EXPECT_EQ(in_arena(threads), one) << c.m << "x" << c.k << "x" << c.n;
  }
  use_deterministic_algorithms(false);
}

TEST(OneDnn, DeterministicAlgorithmsKeepTheWeightGradientOffOneDnn) {
  const ConvGeometry g = geometry(kCases[10]);
  for (DType t : {DType::Float32, DType::BFloat16}) {
    use_deterministic_algorithms(true);
    EXPECT_NE(conv_algorithm(g, ConvPass::kGradWeight, t), ConvAlgorithm::kOneDnn);
    use_deterministic_algorithms(false);
  }
}

// The CPU target keeps bfloat16 convs and matmuls in bfloat16 exactly where oneDNN has
// bfloat16 instructions to run them (this machine: AVX512_BF16; the test suite runs again with
// ONEDNN_MAX_CPU_ISA=AVX512_CORE, where they are widened).
TEST(OneDnn, TargetRunsBFloat16ConvsAndMatmulsWhereNative) {
  const ir::Target& t = backend(Device{}).target();
  for (ir::Op op : {ir::Op::Conv2d, ir::Op::Conv2dGradInput, ir::Op::Conv2dGradWeight, ir::Op::Matmul})
    EXPECT_EQ(t.runs(op, DType::BFloat16), onednn::native_bfloat16()) << ir::op_name(op);
  EXPECT_FALSE(t.runs(ir::Op::Add, DType::BFloat16));
}

}  // namespace
}  // namespace loom::runtime
