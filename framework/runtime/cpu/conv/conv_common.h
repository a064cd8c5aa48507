// Private to the CPU conv and pooling kernels: Eigen views of row-major buffers, the geometry
// of one conv2d or pooling, im2col and its adjoint, per-thread scratch buffers, the input
// gradient as a transposed conv, and the average-pooling window that the forward kernels and
// their gradients share.
#pragma once

#include "ir/attr.h"

#include <loom/dtype.h>

// TBB splits the work above Eigen, whose GEMM runs single-threaded inside each task: a build
// with OpenMP must not let Eigen start threads of its own there (oversubscription).
#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE
#endif
#include <Eigen/Core>

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

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

// The one place a Conv2dAttr becomes a geometry: `input` [N,C,H,W], `weight` [O,C/g,kh,kw] and
// `output` [N,O,Ho,Wo] are the forward conv's shapes (for its gradients: the shapes of what
// they compute or read in those roles).
inline ConvGeometry conv_geometry(const ir::Conv2dAttr& a, const Shape& input, const Shape& weight,
                                  const Shape& output) {
  return {input[0],    input[1],    input[2],    input[3],     weight[0],
          weight[2],   weight[3],   output[2],   output[3],    a.stride[0],
          a.stride[1], a.padding[0], a.padding[1], a.dilation[0], a.dilation[1],
          a.groups};
}

// A 1x1 conv that reads every input position once: its im2col is the input itself.
inline bool pointwise(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 &&
         g.oh == g.h && g.ow == g.w;
}

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

// Where tap (i, j) of output row `oy` reads: whether that input row exists, and the offset in
// the input plane that output column 0 would read (columns outside the input excluded by
// valid_range).
struct TapRow {
  bool inside;  // the row oy*sh - ph + i*dh is inside the input
  int64_t base;
};

inline TapRow tap_row(const ConvGeometry& g, int64_t oy, int64_t i, int64_t j) {
  const int64_t y = oy * g.sh - g.ph + i * g.dh;
  return {y >= 0 && y < g.h, y * g.w - g.pw + j * g.dw};
}

// im2col's row for tap (i, j) of one channel over all positions, when the stride is 1 and
// output rows are as wide as input rows: then position p reads plane[p + off], so the row is
// one contiguous copy whose out-of-bounds columns are zeroed afterwards.
template <class T>
void im2col_shifted_row(const T* plane, const ConvGeometry& g, int64_t i, int64_t j, T* dst) {
  int64_t ylo, yhi, xlo, xhi;
  valid_range(g.h, g.oh, 1, g.ph, i * g.dh, ylo, yhi);
  valid_range(g.w, g.ow, 1, g.pw, j * g.dw, xlo, xhi);
  const int64_t positions = g.oh * g.ow;
  const int64_t off = (i * g.dh - g.ph) * g.w + j * g.dw - g.pw;
  // Positions outside the plane's memory are all in padding columns, zeroed below.
  const int64_t a = std::min(positions, std::max(ylo * g.ow, -off));
  const int64_t b = std::max(a, std::min(yhi * g.ow, g.h * g.w - off));
  std::fill(dst, dst + a, T(0));
  if (b > a) std::copy(plane + a + off, plane + b + off, dst + a);
  std::fill(dst + b, dst + positions, T(0));
  if (xlo == 0 && xhi == g.ow) return;
  for (int64_t oy = ylo; oy < yhi; ++oy) {
    std::fill(dst + oy * g.ow, dst + oy * g.ow + xlo, T(0));
    std::fill(dst + oy * g.ow + xhi, dst + (oy + 1) * g.ow, T(0));
  }
}

// Unfolds input channels [c0, c0+cn) of one image into col [cn*kh*kw, p1-p0] for output
// positions [p0, p1) (row-major over oh, ow), rows `ld` floats apart (default p1-p0: a dense
// matrix; wider to fill a block of columns of a larger one); taps in the padding read zero.
// Runs inside the input are copied (whole shifted planes when the stride is 1), the rest
// zero-filled, with no separate zeroing pass over col.
template <class T>
void im2col(const T* img, const ConvGeometry& g, int64_t c0, int64_t cn, int64_t p0, int64_t p1,
            T* col, int64_t ld = 0) {
  const int64_t width = ld > 0 ? ld : p1 - p0;
  const bool shifted = g.sw == 1 && g.sh == 1 && g.ow == g.w && p0 == 0 && p1 == g.oh * g.ow;
  for (int64_t ci = 0; ci < cn; ++ci) {
    const T* plane = img + (c0 + ci) * g.h * g.w;
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T* dst = col + ((ci * g.kh + i) * g.kw + j) * width;  // dst[p - p0]: position p
        if (shifted) {
          im2col_shifted_row(plane, g, i, j, dst);
          continue;
        }
        int64_t xlo, xhi;
        valid_range(g.w, g.ow, g.sw, g.pw, j * g.dw, xlo, xhi);
        for (int64_t p = p0; p < p1;) {
          const int64_t oy = p / g.ow, row_end = std::min(p1, (oy + 1) * g.ow);
          const TapRow r = tap_row(g, oy, i, j);
          const int64_t a = std::clamp(oy * g.ow + xlo, p, row_end);
          const int64_t b = r.inside ? std::clamp(oy * g.ow + xhi, a, row_end) : a;
          std::fill(dst + (p - p0), dst + (a - p0), T(0));
          if (b > a) {
            const T* src = plane + r.base + (a - oy * g.ow) * g.sw;  // read by position a
            if (g.sw == 1) std::copy(src, src + (b - a), dst + (a - p0));
            else
              for (int64_t q = 0; q < b - a; ++q) dst[a - p0 + q] = src[q * g.sw];
          }
          std::fill(dst + (b - p0), dst + (row_end - p0), T(0));
          p = row_end;
        }
      }
  }
}

// The adjoint of im2col over all positions: adds col [cn*kh*kw, oh*ow] into input channels
// [c0, c0+cn) of one image (taps in the padding are dropped), each channel's taps in a fixed
// order.
template <class T>
void col2im_add(const T* col, const ConvGeometry& g, int64_t c0, int64_t cn, T* img) {
  const int64_t positions = g.oh * g.ow;
  for (int64_t ci = 0; ci < cn; ++ci) {
    T* plane = img + (c0 + ci) * g.h * g.w;
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        int64_t xlo, xhi;
        valid_range(g.w, g.ow, g.sw, g.pw, j * g.dw, xlo, xhi);
        const T* src = col + ((ci * g.kh + i) * g.kw + j) * positions;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const TapRow r = tap_row(g, oy, i, j);
          if (!r.inside) continue;
          const T* s = src + oy * g.ow;
          if (g.sw == 1)
            for (int64_t ox = xlo; ox < xhi; ++ox) plane[r.base + ox] += s[ox];
          else
            for (int64_t ox = xlo; ox < xhi; ++ox) plane[r.base + ox * g.sw] += s[ox];
        }
      }
  }
}

// Per-thread scratch buffers, reused across calls so that a steady training step does not
// allocate. A task body uses the task slots and must not wait on other tasks while it holds
// them (a thread then runs one body at a time, so no two users share a buffer); the thread
// that calls parallel_range, which runs tasks too, holds its own data in the caller slots.
enum class Scratch {
  kTaskInput, kTaskGrad, kTaskAcc,     // task slots
  kWeights, kPacked, kPartial, kPhases, kDerived,  // caller slots
  kGemmA, kGemmB,  // gemm.h's packing buffers: held only inside one gemm call, which never waits
  kCount
};

// The buffer starts on a 64-byte boundary, so rows that are multiples of a cache line apart
// start on cache lines too.
template <class T>
T* scratch(std::size_t n, Scratch slot) {
  constexpr std::size_t kAlign = 64;
  thread_local std::vector<std::byte> buffers[static_cast<int>(Scratch::kCount)];
  auto& b = buffers[static_cast<int>(slot)];
  if (b.size() < n * sizeof(T) + kAlign) b.resize(n * sizeof(T) + kAlign);
  const auto addr = reinterpret_cast<std::uintptr_t>(b.data());
  return reinterpret_cast<T*>(b.data() + (kAlign - addr % kAlign) % kAlign);
}

// Which pass of a conv a kernel computes; the algorithm is chosen per pass (conv_algorithm.h).
enum class ConvPass { kForward, kGradInput, kGradWeight };

// conv2d forward on row-major buffers (kernels_compute.cpp), for float and double; the input
// gradient of a stride-1 conv runs through it too (kernels_grad.cpp), as pass kGradInput.
template <class T>
void conv2d_forward(const ConvGeometry& g, const T* px, const T* pw, T* po, ConvPass pass);

// With stride 1, the input gradient is itself a stride-1 conv: of grad_out, with each group's
// weight transposed (in <-> out channels) and flipped, and padding d*(k-1) - p. That runs on
// conv2d_forward's kernels, which write each input element once instead of adding into it
// (col2im), with a GEMM inner dimension of og*kh*kw instead of og. Returns false, doing
// nothing, for strided convs and padding beyond the kernel's reach.
template <class T>
bool conv2d_grad_input_stride1(const ConvGeometry& g, const T* grad_out, const T* w, T* grad_in) {
  if (g.sh != 1 || g.sw != 1 || g.ph > g.dh * (g.kh - 1) || g.pw > g.dw * (g.kw - 1)) return false;
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t taps = g.kh * g.kw;
  T* flipped = scratch<T>(g.o * cg * taps, Scratch::kWeights);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t o = 0; o < og; ++o)
      for (int64_t c = 0; c < cg; ++c) {
        const T* src = w + ((grp * og + o) * cg + c) * taps;
        std::reverse_copy(src, src + taps, flipped + ((grp * cg + c) * og + o) * taps);
      }
  const ConvGeometry t{g.n, g.o, g.oh, g.ow, g.c, g.kh, g.kw, g.h, g.w, 1, 1,
                       g.dh * (g.kh - 1) - g.ph, g.dw * (g.kw - 1) - g.pw, g.dh, g.dw, g.groups};
  conv2d_forward(t, grad_out, flipped, grad_in, ConvPass::kGradInput);
  return true;
}

// Pooling over planes [planes, h, w] -> [planes, oh, ow].
struct PoolGeometry {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

// `input` is [N,C,H,W], `pooled` [N,C,Ho,Wo].
inline PoolGeometry pool_geometry(const ir::Pool2dAttr& a, const Shape& input, const Shape& pooled) {
  return {input[0] * input[1], input[2], input[3], pooled[2], pooled[3], a.kernel[0],
          a.kernel[1], a.stride[0], a.stride[1], a.padding[0], a.padding[1]};
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
