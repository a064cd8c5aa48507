// Strided float32 convs on the direct stride-1 kernels (conv_direct.cpp), by phases.
//
// Along an axis of stride s and padding p, tap i reads input s*o + i - p. Writing
// i - p = s*u + a with 0 <= a < s, that is s*(o + u) + a: row o + u of phase a, the rows
// x[s*r + a]. So the conv is a stride-1 conv over the phases that taps read, each phase of a
// channel a channel of its own, with a kernel over the u's and leading padding -min(u):
//   forward:      out = conv'(phases(x), w'), summing only the taps that exist (a 3x3
//                 stride-2 conv: a 2x2 conv over 4 phases with 9 of its 16 taps);
//   weight grad:  grad_w = regroup(grad_w' of conv'), over those taps again;
//   input grad:   each phase's gradient is the input gradient of its own stride-1 conv (the
//                 phase's taps only), put back in place (where every input is read).
// A 1x1 stride-2 conv becomes a 1x1 conv over one phase, the subsampled input.
#include "runtime/cpu/conv/conv_direct.h"

#include "runtime/cpu/kernels_impl.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cassert>

namespace loom::runtime {
namespace {

constexpr int64_t kMaxStride = 4;
constexpr int64_t kMaxKernel = 16;
constexpr int64_t kLanes = 16;

int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// One axis of the strided conv, seen as a stride-1 conv over phases.
struct Axis {
  int64_t stride = 1, size = 0;  // along the input
  int64_t phases = 0;            // phases read, offsets phase[0] < phase[1] < ...
  std::array<int64_t, kMaxStride> phase{}, index{};  // offset -> its phase index, or -1
  int64_t k = 0, pad = 0, phase_size = 0;  // the stride-1 conv's kernel, padding, input size
  std::array<int64_t, kMaxKernel> slot{}, shift{};  // tap i -> its phase index, its new tap
  // Per phase: the new taps it has, [first, first + k), as a conv of its own.
  std::array<int64_t, kMaxStride> first{}, sub_k{};
};

bool make_axis(int64_t size, int64_t stride, int64_t pad, int64_t kernel, int64_t dilation,
               Axis& a) {
  if (dilation != 1 || stride > kMaxStride || kernel > kMaxKernel || pad < 0 || pad > kernel - 1)
    return false;
  a.stride = stride;
  a.size = size;
  a.index.fill(-1);
  for (int64_t i = 0; i < kernel; ++i) a.index[i - pad - floor_div(i - pad, stride) * stride] = 0;
  for (int64_t r = 0; r < stride; ++r)
    if (a.index[r] == 0) {
      a.index[r] = a.phases;
      a.phase[a.phases++] = r;
    }
  const int64_t u_min = floor_div(-pad, stride), u_max = floor_div(kernel - 1 - pad, stride);
  a.first.fill(kMaxKernel);
  for (int64_t i = 0; i < kernel; ++i) {
    const int64_t u = floor_div(i - pad, stride);
    a.slot[i] = a.index[i - pad - u * stride];
    a.shift[i] = u - u_min;
    a.first[a.slot[i]] = std::min(a.first[a.slot[i]], a.shift[i]);
    a.sub_k[a.slot[i]] = a.shift[i] - a.first[a.slot[i]] + 1;  // taps come in increasing order
  }
  a.k = u_max - u_min + 1;
  a.pad = -u_min;
  a.phase_size = ceil_div(size, stride);
  return true;
}

// The strided conv `g` as a stride-1 conv over phases (channel c's phase (ay, ax) is channel
// (c*Py + ay)*Px + ax), or false where that does not apply.
struct Phased {
  Axis y, x;
  ConvGeometry g;
  int64_t cg = 0;  // input channels per group of the original conv
};

bool make_phased(const ConvGeometry& g, ConvPass pass, Phased& p) {
  if ((g.sh == 1 && g.sw == 1) || !make_axis(g.h, g.sh, g.ph, g.kh, g.dh, p.y) ||
      !make_axis(g.w, g.sw, g.pw, g.kw, g.dw, p.x))
    return false;
  p.cg = g.c / g.groups;
  p.g = {g.n, g.c * p.y.phases * p.x.phases, p.y.phase_size, p.x.phase_size,
         g.o, p.y.k, p.x.k, g.oh, g.ow,
         1, 1, p.y.pad, p.x.pad, 1, 1, g.groups};
  return direct_chosen(p.g, pass);
}

// Calls f(plane, phase y index, phase x index, x row y, phase row r) for every row of every
// phase of every input plane, in parallel over planes.
template <class F>
void for_each_phase_row(const Phased& p, F f) {
  const int64_t planes = p.g.n * (p.g.c / (p.y.phases * p.x.phases));
  const int64_t grain =
      std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(1, p.y.size * p.x.size));
  parallel_range(planes, grain, [&](int64_t s, int64_t e) {
    for (int64_t plane = s; plane < e; ++plane)
      for (int64_t ay = 0; ay < p.y.phases; ++ay)
        for (int64_t ax = 0; ax < p.x.phases; ++ax)
          for (int64_t r = 0; r < p.y.phase_size; ++r)
            f(plane, ay, ax, r * p.y.stride + p.y.phase[ay], r);
  });
}

// x [N,C,H,W] -> phases [N, C*Py*Px, H', W'], zero past the input's edge.
void split_phases(const Phased& p, const float* x, float* out) {
  const int64_t hw = p.y.size * p.x.size, phw = p.y.phase_size * p.x.phase_size;
  const int64_t sx = p.x.stride, w = p.x.size, pw = p.x.phase_size;
  for_each_phase_row(p, [&](int64_t plane, int64_t ay, int64_t ax, int64_t yy, int64_t r) {
    float* d = out + ((plane * p.y.phases + ay) * p.x.phases + ax) * phw + r * pw;
    const int64_t x0 = p.x.phase[ax],
                  n = yy < p.y.size ? std::max<int64_t>(0, ceil_div(w - x0, sx)) : 0;
    const float* s = x + plane * hw + yy * w + x0;
    int64_t q = 0;
#ifdef __AVX512F__
    if (sx == 2) {  // 16 outputs from two vectors: their even elements
      const __m512i even =
          _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
      for (; q + kLanes <= n && 2 * q + 2 * kLanes <= w - x0; q += kLanes)
        _mm512_storeu_ps(d + q, _mm512_permutex2var_ps(_mm512_loadu_ps(s + 2 * q), even,
                                                       _mm512_loadu_ps(s + 2 * q + kLanes)));
    }
#endif
    for (; q < n; ++q) d[q] = s[q * sx];
    std::fill(d + n, d + pw, 0.f);
  });
}

// The adjoint for the input gradient, from phases laid out [phase][N][C][H'][W']: each input
// element takes its phase's value (every offset is some phase's).
void merge_phases(const Phased& p, const float* phases, float* x) {
  const int64_t n = p.g.n, c = p.g.c / (p.y.phases * p.x.phases);
  const int64_t hw = p.y.size * p.x.size, phw = p.y.phase_size * p.x.phase_size;
  const int64_t sx = p.x.stride, w = p.x.size, pw = p.x.phase_size;
  assert(p.y.phases == p.y.stride && p.x.phases == p.x.stride && "merge_phases: missing phases");
  auto phase_row = [&](int64_t plane, int64_t ay, int64_t ax, int64_t r) {
    return phases + ((ay * p.x.phases + ax) * n * c + plane) * phw + r * pw;
  };
  const bool pairs = sx == 2 && p.x.phases == 2;  // two phases interleave into one row
  for_each_phase_row(p, [&](int64_t plane, int64_t ay, int64_t ax, int64_t yy, int64_t r) {
    if (yy >= p.y.size || (pairs && ax == 1)) return;
    float* d = x + plane * hw + yy * w;
    int64_t q = 0;
#ifdef __AVX512F__
    if (pairs) {
      const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
      const __m512i hi =
          _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
      const float *s0 = phase_row(plane, ay, 0, r), *s1 = phase_row(plane, ay, 1, r);
      for (; 2 * q + 2 * kLanes <= w; q += kLanes) {
        const __m512 a = _mm512_loadu_ps(s0 + q), b = _mm512_loadu_ps(s1 + q);
        _mm512_storeu_ps(d + 2 * q, _mm512_permutex2var_ps(a, lo, b));
        _mm512_storeu_ps(d + 2 * q + kLanes, _mm512_permutex2var_ps(a, hi, b));
      }
    }
#endif
    for (int64_t a = pairs ? 0 : ax; a < (pairs ? 2 : ax + 1); ++a) {
      const float* s = phase_row(plane, ay, a, r);
      const int64_t x0 = p.x.phase[a], m = std::max<int64_t>(0, ceil_div(w - x0, sx));
      for (int64_t k = q; k < m; ++k) d[x0 + k * sx] = s[k];
    }
  });
}

// Index in the phased weight [O, C'/g, k'h, k'w] of tap (i, j) of input channel c (within a
// group) of output channel o.
int64_t phased_index(const Phased& p, int64_t o, int64_t c, int64_t i, int64_t j) {
  const int64_t ch = (c * p.y.phases + p.y.slot[i]) * p.x.phases + p.x.slot[j];
  return ((o * (p.g.c / p.g.groups) + ch) * p.y.k + p.y.shift[i]) * p.x.k + p.x.shift[j];
}

// Calls f(index in the original weight, index in the phased weight) for every original tap.
template <class F>
void for_each_tap(const Phased& p, const ConvGeometry& g, F f) {
  for (int64_t o = 0; o < g.o; ++o)
    for (int64_t c = 0; c < p.cg; ++c)
      for (int64_t i = 0; i < g.kh; ++i)
        for (int64_t j = 0; j < g.kw; ++j)
          f(((o * p.cg + c) * g.kh + i) * g.kw + j, phased_index(p, o, c, i, j));
}

// Which taps of the phased conv exist (per input channel of a group, as conv2d_direct takes).
const uint8_t* phased_taps(const Phased& p, const ConvGeometry& g) {
  const int64_t taps = p.g.kh * p.g.kw, per_o = (p.g.c / p.g.groups) * taps;
  auto* used = scratch<uint8_t>(per_o, Scratch::kDerived);
  std::fill(used, used + per_o, uint8_t{0});
  for (int64_t c = 0; c < p.cg; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) used[phased_index(p, 0, c, i, j)] = 1;
  return used;
}

// x split into phases (the phased conv's input), in the calling thread's kPhases slot.
const float* phased_input(const Phased& p, const float* x) {
  float* phases = scratch<float>(p.g.n * p.g.c * p.g.h * p.g.w, Scratch::kPhases);
  split_phases(p, x, phases);
  return phases;
}

// Elements of the phased conv's weight.
int64_t phased_weight_size(const Phased& p) {
  return p.g.o * (p.g.c / p.g.groups) * p.g.kh * p.g.kw;
}

}  // namespace

bool conv2d_strided(const ConvGeometry& g, const float* x, const float* w, float* out) {
  Phased p;
  if (!make_phased(g, ConvPass::kForward, p)) return false;
  const float* phases = phased_input(p, x);
  const int64_t wsize = phased_weight_size(p);
  float* phased = scratch<float>(wsize, Scratch::kDerived);
  std::fill(phased, phased + wsize, 0.f);
  for_each_tap(p, g, [&](int64_t orig, int64_t ph) { phased[ph] = w[orig]; });
  return conv2d_direct(p.g, phases, phased, out, phased_taps(p, g));
}

bool conv2d_grad_weight_strided(const ConvGeometry& g, const float* x, const float* grad_out,
                                float* grad_w) {
  Phased p;
  if (!make_phased(g, ConvPass::kGradWeight, p)) return false;
  const float* phases = phased_input(p, x);
  float* phased = scratch<float>(phased_weight_size(p), Scratch::kDerived);
  conv2d_grad_weight_direct(p.g, phases, grad_out, phased, phased_taps(p, g));
  for_each_tap(p, g, [&](int64_t orig, int64_t ph) { grad_w[orig] = phased[ph]; });
  return true;
}

bool conv2d_grad_input_strided(const ConvGeometry& g, const float* grad_out, const float* w,
                               float* grad_in) {
  Phased p;
  // Where some inputs are read by no tap (a 1x1 stride-2 conv reads one in four), the GEMM
  // path's scatter of the few gradients is cheaper than merging phases into the whole input.
  if (!make_phased(g, ConvPass::kGradInput, p) || p.y.phases < p.y.stride ||
      p.x.phases < p.x.stride)
    return false;
  // Each phase's own conv must have its padding within its reach (first + k > pad).
  for (const Axis* a : {&p.y, &p.x})
    for (int64_t ph = 0; ph < a->phases; ++ph)
      if (a->first[ph] + a->sub_k[ph] <= a->pad) return false;
  const int64_t plane = p.g.h * p.g.w, per_phase = g.n * g.c * plane;
  float* phases = scratch<float>(p.y.phases * p.x.phases * per_phase, Scratch::kPhases);
  for (int64_t ay = 0; ay < p.y.phases; ++ay)
    for (int64_t ax = 0; ax < p.x.phases; ++ax) {
      const int64_t kh = p.y.sub_k[ay], kw = p.x.sub_k[ax];
      const int64_t ph = p.y.pad - p.y.first[ay], pw = p.x.pad - p.x.first[ax];
      const ConvGeometry sub{g.n, g.c, p.g.h, p.g.w, g.o, kh, kw, g.oh, g.ow,
                             1, 1, ph, pw, 1, 1, g.groups};
      float* sub_w = scratch<float>(g.o * p.cg * kh * kw, Scratch::kDerived);
      for (int64_t o = 0; o < g.o; ++o)
        for (int64_t c = 0; c < p.cg; ++c)
          for (int64_t i = 0; i < g.kh; ++i)
            for (int64_t j = 0; j < g.kw; ++j)
              if (p.y.slot[i] == ay && p.x.slot[j] == ax)
                sub_w[((o * p.cg + c) * kh + p.y.shift[i] - p.y.first[ay]) * kw + p.x.shift[j] -
                      p.x.first[ax]] = w[((o * p.cg + c) * g.kh + i) * g.kw + j];
      conv2d_grad_input_stride1(sub, grad_out, sub_w, phases + (ay * p.x.phases + ax) * per_phase);
    }
  merge_phases(p, phases, grad_in);
  return true;
}

}  // namespace loom::runtime
