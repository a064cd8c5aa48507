// Private to the CPU conv and pooling kernels: Eigen views of row-major buffers, the geometry
// of one conv2d or pooling, the im2col unfolding and the average-pooling window that the
// forward kernels and their gradients share.
#pragma once

#include "ir/attr.h"

#include <loom/dtype.h>

#include <Eigen/Core>

#include <algorithm>
#include <cassert>
#include <cstdint>

namespace loom::runtime {

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMajor<T>>;
template <class T>
using Map = Eigen::Map<RowMajor<T>>;
// A block of columns of a wider row-major matrix.
template <class T>
using StridedMap = Eigen::Map<RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstStridedMap = Eigen::Map<const RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct ConvGeometry {
  int64_t n, c, h, w;         // input
  int64_t o, kh, kw;          // weight
  int64_t oh, ow;             // output
  int64_t sh, sw, ph, pw, dh, dw, groups;
};

// First and one-past-last output index o with 0 <= o*stride - pad + tap < size, clamped to
// [0, out).
inline void valid_range(int64_t size, int64_t out, int64_t stride, int64_t pad, int64_t tap,
                        int64_t& lo, int64_t& hi) {
  const int64_t off = tap - pad;  // input index = o*stride + off
  lo = off >= 0 ? 0 : ceil_div(-off, stride);
  hi = size - off <= 0 ? 0 : ceil_div(size - off, stride);
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// Unfolds input channels [c0, c0+cn) of one image into col [cn*kh*kw, p1-p0] for output
// positions [p0, p1) (row-major over oh, ow); taps in the padding read zero.
template <class T>
void im2col(const T* img, const ConvGeometry& g, int64_t c0, int64_t cn, int64_t p0, int64_t p1,
            T* col) {
  const int64_t width = p1 - p0;
  for (int64_t ci = 0; ci < cn; ++ci) {
    const T* plane = img + (c0 + ci) * g.h * g.w;
    for (int64_t i = 0; i < g.kh; ++i) {
      int64_t ylo, yhi;
      valid_range(g.h, g.oh, g.sh, g.ph, i * g.dh, ylo, yhi);
      for (int64_t j = 0; j < g.kw; ++j) {
        int64_t xlo, xhi;
        valid_range(g.w, g.ow, g.sw, g.pw, j * g.dw, xlo, xhi);
        T* dst = col + ((ci * g.kh + i) * g.kw + j) * width;
        std::fill(dst, dst + width, T(0));
        // Output rows that overlap [p0, p1), each clipped to the valid columns.
        for (int64_t oy = std::max(ylo, p0 / g.ow); oy < yhi && oy * g.ow < p1; ++oy) {
          const int64_t base = (oy * g.sh - g.ph + i * g.dh) * g.w - g.pw + j * g.dw;
          const int64_t x0 = std::max(xlo, p0 - oy * g.ow), x1 = std::min(xhi, p1 - oy * g.ow);
          T* d = dst + oy * g.ow - p0;
          for (int64_t ox = x0; ox < x1; ++ox) d[ox] = plane[base + ox * g.sw];
        }
      }
    }
  }
}

// Pooling over planes [planes, h, w] -> [planes, oh, ow].
struct PoolGeometry {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

// `input` is [N,C,H,W], `pooled` [N,C,Ho,Wo]; attr.ints starts {kh, kw, sh, sw, ph, pw}.
inline PoolGeometry pool_geometry(const ir::Attr& attr, const Shape& input, const Shape& pooled) {
  assert(attr.ints.size() >= 6 && "pool: attr.ints = {kh, kw, sh, sw, ph, pw, ...}");
  const auto& a = attr.ints;
  return {input[0] * input[1], input[2], input[3], pooled[2], pooled[3], a[0], a[1], a[2], a[3], a[4], a[5]};
}

// The in-bounds window [y0, y1) x [x0, x1) of output (oy, ox) and the divisor average
// pooling uses: with count_include_pad, the window clipped to the padded input (PyTorch's
// rule); otherwise the in-bounds elements.
struct AvgWindow {
  int64_t y0, y1, x0, x1, divisor;
};

inline AvgWindow avg_window(const PoolGeometry& g, int64_t oy, int64_t ox, bool count_include_pad) {
  int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  int64_t y1 = std::min(y0 + g.kh, g.h + g.ph), x1 = std::min(x0 + g.kw, g.w + g.pw);
  const int64_t padded = (y1 - y0) * (x1 - x0);
  y0 = std::max<int64_t>(y0, 0);
  x0 = std::max<int64_t>(x0, 0);
  y1 = std::min(y1, g.h);
  x1 = std::min(x1, g.w);
  return {y0, y1, x0, x1, count_include_pad ? padded : (y1 - y0) * (x1 - x0)};
}

}  // namespace loom::runtime
