// For the channels-last Winograd tests (float32 and bfloat16 operands): their test convs and
// float64 references by the definition for the three passes of a 3x3 stride-1 conv, x
// [N,H,W,C], w [O,C,3,3] and grad (of the output) [N,Ho,Wo,O], every product taken in float64.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace loom::runtime {

// The float32 channels-last Winograd's error against these references, relative to |want| +
// rms(want) (expect_near.h): with 4x4 output tiles (the default, conv_winograd_f32.h) within
// 1e-4, with 2x2 tiles within 1e-5 (conv_winograd_f32_test.cpp says why).
constexpr double kF32WinogradTolerance4x4 = 1e-4;
constexpr double kF32WinogradTolerance2x2 = 1e-5;

// A test conv: batch, input channels, plane, output channels, padding (3x3, stride 1).
struct Conv3x3Case {
  int64_t n, c, h, w, o, ph, pw;
};

inline ConvGeometry geometry(const Conv3x3Case& k) {
  return {k.n, k.c, k.h, k.w, k.o, 3, 3, k.h + 2 * k.ph - 2, k.w + 2 * k.pw - 2,
          1,   1,   k.ph, k.pw, 1,   1, 1};
}

// "forward n2 c16 8x8 o16 p1,1" (the pass: forward, grad_input or grad_weight).
inline std::string name(const ConvGeometry& g, ConvPass pass) {
  std::ostringstream s;
  s << (pass == ConvPass::kForward     ? "forward"
        : pass == ConvPass::kGradInput ? "grad_input"
                                       : "grad_weight")
    << " n" << g.n << " c" << g.c << " " << g.h << "x" << g.w << " o" << g.o << " p" << g.ph
    << "," << g.pw;
  return s.str();
}

// f(x_at, grad_at, tap) for every output position and every tap inside the input plane:
// x_at and grad_at the offsets of the channels of that input and output position, tap = 3i + j.
template <class F>
void for_each_tap(const ConvGeometry& g, F f) {
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t y = 0; y < g.oh; ++y)
      for (int64_t xx = 0; xx < g.ow; ++xx)
        for (int64_t i = 0; i < 3; ++i)
          for (int64_t j = 0; j < 3; ++j) {
            const int64_t iy = y - g.ph + i, ix = xx - g.pw + j;
            if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
            f(((n * g.h + iy) * g.w + ix) * g.c, ((n * g.oh + y) * g.ow + xx) * g.o, 3 * i + j);
          }
}

inline std::size_t ref_at(int64_t i) { return static_cast<std::size_t>(i); }

// n float32 operands uniform in [-1, 1) from `seed`, and float32 results widened for
// comparison with the float64 references.
inline std::vector<float> random_floats(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(ref_at(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> values(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// out [N,Ho,Wo,O] = conv(x, w) + bias (none if empty), then relu.
template <class T>
std::vector<double> forward_reference(const ConvGeometry& g, const std::vector<T>& x,
                                      const std::vector<T>& w, const std::vector<float>& bias,
                                      bool relu) {
  std::vector<double> out(ref_at(g.n * g.oh * g.ow * g.o));
  for_each_tap(g, [&](int64_t xa, int64_t ga, int64_t tap) {
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        out[ref_at(ga + o)] += static_cast<double>(x[ref_at(xa + c)]) *
                               static_cast<double>(w[ref_at((o * g.c + c) * 9 + tap)]);
  });
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!bias.empty()) out[i] += bias[i % bias.size()];
    if (relu) out[i] = std::max(out[i], 0.0);
  }
  return out;
}

// grad_x [N,H,W,C] from grad and w.
template <class T>
std::vector<double> grad_input_reference(const ConvGeometry& g, const std::vector<T>& grad,
                                         const std::vector<T>& w) {
  std::vector<double> out(ref_at(g.n * g.h * g.w * g.c));
  for_each_tap(g, [&](int64_t xa, int64_t ga, int64_t tap) {
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        out[ref_at(xa + c)] += static_cast<double>(grad[ref_at(ga + o)]) *
                               static_cast<double>(w[ref_at((o * g.c + c) * 9 + tap)]);
  });
  return out;
}

// grad_w [O,C,3,3] from x and grad.
template <class T>
std::vector<double> grad_weight_reference(const ConvGeometry& g, const std::vector<T>& x,
                                          const std::vector<T>& grad) {
  std::vector<double> out(ref_at(g.o * g.c * 9));
  for_each_tap(g, [&](int64_t xa, int64_t ga, int64_t tap) {
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t c = 0; c < g.c; ++c)
        out[ref_at((o * g.c + c) * 9 + tap)] += static_cast<double>(grad[ref_at(ga + o)]) *
                                                static_cast<double>(x[ref_at(xa + c)]);
  });
  return out;
}

}  // namespace loom::runtime
