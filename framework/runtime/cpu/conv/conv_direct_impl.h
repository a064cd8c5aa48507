// Private to the direct conv kernels (conv_direct.cpp, conv_direct_weight.cpp): the padded
// flat layout they share, the (channel, tap) pairs a conv sums over, and copying planes in.
// AVX-512 builds only.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace loom::runtime::direct {

constexpr int64_t kLanes = 16;
constexpr int kTileO = 4;  // output channels per register tile
constexpr int64_t kMaxTaps = 64;

inline int64_t round_up(int64_t a, int64_t b) {
  return (a + b - 1) / b * b;
}

// Keeps a loaded vector in a register: otherwise GCC folds the load into every FMA that uses
// it, which multiplies the (mostly cache-line-splitting) loads by the tile's height and
// makes the loop load-bound.
inline void pin(__m512& v) {
  asm("" : "+v"(v));
}

// The padded flat layout of one conv's input planes.
struct Flat {
  int64_t wp = 0;  // row stride: W + gap
  int64_t origin =
      0;             // where (y, x) = (-ph, -pw) would sit, so tap t of q reads origin + q + tap[t]
  int64_t data = 0;  // index of input (0, 0)
  int64_t q = 0;     // grid positions Ho * wp
  int64_t plane = 0;  // floats per padded plane, a multiple of kLanes
  int64_t ntaps = 0;
  std::array<int64_t, kMaxTaps> tap{};
};

// The layout, with ntaps == 0 where the direct kernels do not apply.
inline Flat flat_layout(const ConvGeometry& g) {
  Flat f;
  const int64_t rh = g.dh * (g.kh - 1) - g.ph, rw = g.dw * (g.kw - 1) - g.pw;  // far-side padding
  const int64_t gap = std::max(g.pw, rw);
  // The last column's taps must land in the data or the gap after it, not the next row.
  if (g.sh != 1 || g.sw != 1 || g.ph < 0 || g.pw < 0 || rh < 0 || rw < 0 ||
      g.kh * g.kw > kMaxTaps || g.oh * g.ow == 0 || g.ow + rw > g.w + gap)
    return f;
  f.wp = g.w + gap;
  f.data = gap + g.ph * f.wp;
  f.origin = gap - g.pw;
  f.q = g.oh * f.wp;
  f.ntaps = g.kh * g.kw;
  for (int64_t i = 0; i < g.kh; ++i)
    for (int64_t j = 0; j < g.kw; ++j) f.tap[i * g.kw + j] = i * g.dh * f.wp + j * g.dw;
  // The last vector of positions may run kLanes - 1 past q; its reads stay inside the plane.
  f.plane = round_up(f.origin + round_up(f.q, kLanes) + f.tap[f.ntaps - 1] + 1, kLanes);
  return f;
}

// Copies `planes` planes of [rows, cols] into grid rows wp floats apart, from offset `first` of
// planes `stride` floats apart. Only the data is written: callers zero a scratch buffer once
// and every image then leaves its padding untouched. Rows are short (8 to 64 floats here),
// so they are copied inline rather than by a library call each.
inline void scatter_rows(const float* src, int64_t planes, int64_t rows, int64_t cols, float* dst,
                         int64_t stride, int64_t first, int64_t wp) {
  // Masked stores are slow on some processors: a half vector takes a 256-bit store.
  const int64_t full = cols / kLanes * kLanes, half = cols % kLanes >= 8 ? 8 : 0;
  const auto tail = static_cast<__mmask16>((1u << (cols - full - half)) - 1);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t y = 0; y < rows; ++y, src += cols) {
      float* d = dst + p * stride + first + y * wp;
      for (int64_t i = 0; i < full; i += kLanes) _mm512_storeu_ps(d + i, _mm512_loadu_ps(src + i));
      if (half) _mm256_storeu_ps(d + full, _mm256_loadu_ps(src + full));
      if (tail)
        _mm512_mask_storeu_ps(d + full + half, tail,
                              _mm512_maskz_loadu_ps(tail, src + full + half));
    }
}

// The (channel, tap) pairs of one group that a conv sums over, channel-major: all of them,
// or those `used` marks (used[c * ntaps + t]; the other taps' weights are zero, as in a
// strided conv regrouped by phases). start[c] is the first pair of channel c, start[cg] the
// count. Held in the calling thread's kPacked slot.
struct Pairs {
  int64_t count = 0;
  const int64_t* channel = nullptr;
  const int64_t* tap = nullptr;
  const int64_t* start = nullptr;
};

inline Pairs make_pairs(int64_t cg, int64_t ntaps, const uint8_t* used) {
  int64_t* buf = scratch<int64_t>(3 * cg * ntaps + cg + 1, Scratch::kPacked);
  int64_t *channel = buf, *tap = buf + cg * ntaps, *start = buf + 2 * cg * ntaps;
  int64_t n = 0;
  for (int64_t c = 0; c < cg; ++c) {
    start[c] = n;
    for (int64_t t = 0; t < ntaps; ++t)
      if (!used || used[c * ntaps + t]) {
        channel[n] = c;
        tap[n++] = t;
      }
  }
  start[cg] = n;
  return {n, channel, tap, start};
}

}  // namespace loom::runtime::direct
