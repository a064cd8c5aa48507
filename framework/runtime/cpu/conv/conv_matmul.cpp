// A channels-last conv as im2col and one oneDNN matmul (conv_matmul.h).
#include "runtime/cpu/conv/conv_matmul.h"

#include "runtime/cpu/kernels_impl.h"
#include "runtime/cpu/onednn.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loom::runtime {
namespace {

// Bytes of im2col or reordered weight per task: enough to pay for a task, few enough that the
// largest ResNet-18 shapes still split over the cores.
constexpr int64_t kTaskBytes = 64 * 1024;

// The conv that im2col reads and the matmul computes: the forward conv itself, or, for the
// input gradient, the forward conv of grad_y that gives grad_x (stride 1).
struct Conv {
  int64_t n, c, h, w;     // input [n, h, w, c]
  int64_t o, oh, ow;      // output [n, oh, ow, o]
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
  bool reversed;          // im2col writes tap t in column block taps - 1 - t
  int64_t rows() const { return n * oh * ow; }
  int64_t taps() const { return kh * kw; }
  int64_t depth() const { return taps() * c; }  // the matmul's inner dimension
  bool in_place() const {  // a 1x1 conv whose im2col is its input
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0;
  }
};

Conv forward_conv(const ConvGeometry& g) {
  return {g.n, g.c, g.h, g.w, g.o, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw,
          false};
}

Conv grad_input_conv(const ConvGeometry& g) {
  return {g.n, g.o, g.oh, g.ow, g.c, g.h, g.w, g.kh, g.kw, 1, 1,
          g.dh * (g.kh - 1) - g.ph, g.dw * (g.kw - 1) - g.pw, g.dh, g.dw, true};
}

int64_t grain_for(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, bytes_per_item));
}

// Calls f(slot, pixel) for each tap of output position r: slot the tap's column block (taps
// in reverse order for the input gradient), pixel the input position it reads ([n, h, w]
// flattened), or -1 where it falls in the padding.
template <class F>
void for_each_tap(const Conv& v, int64_t r, F f) {
  const int64_t plane = v.oh * v.ow;
  const int64_t img = r / plane, oy = r % plane / v.ow, ox = r % v.ow;
  for (int64_t ky = 0; ky < v.kh; ++ky) {
    const int64_t iy = oy * v.sh - v.ph + ky * v.dh;
    for (int64_t kx = 0; kx < v.kw; ++kx) {
      const int64_t ix = ox * v.sw - v.pw + kx * v.dw, t = ky * v.kw + kx;
      const bool inside = iy >= 0 && iy < v.h && ix >= 0 && ix < v.w;
      f(v.reversed ? v.taps() - 1 - t : t, inside ? (img * v.h + iy) * v.w + ix : -1);
    }
  }
}

// col [rows, taps * c]: each output position's input vectors, tap by tap, zeros where a tap
// falls in the padding; elements moved as bytes, `size` each.
void im2col(const Conv& v, std::size_t size, const std::byte* x, std::byte* col) {
  const auto depth = static_cast<std::size_t>(v.depth()) * size;
  const std::size_t vec = static_cast<std::size_t>(v.c) * size;
  parallel_range(v.rows(), grain_for(static_cast<int64_t>(depth)), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      std::byte* row = col + static_cast<std::size_t>(r) * depth;
      for_each_tap(v, r, [&](int64_t slot, int64_t pixel) {
        std::byte* dst = row + static_cast<std::size_t>(slot) * vec;
        if (pixel < 0) std::memset(dst, 0, vec);
        else std::memcpy(dst, x + static_cast<std::size_t>(pixel) * vec, vec);
      });
    }
  });
}

// col [rows, c * taps]: the same values with the columns in the weight's own order (input
// channel, then tap), for a forward conv whose weight is larger than its im2col (few output
// positions: inference at batch 1), which then reads the weight as it is, not reordered.
template <class E>
void im2col_weight_order(const Conv& v, const E* x, E* col) {
  const int64_t depth = v.depth(), taps = v.taps();
  parallel_range(v.rows(), grain_for(depth * static_cast<int64_t>(sizeof(E))),
                 [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      E* row = col + r * depth;
      for_each_tap(v, r, [&](int64_t t, int64_t pixel) {
        const E* p = pixel < 0 ? nullptr : x + pixel * v.c;
        for (int64_t c = 0; c < v.c; ++c) row[c * taps + t] = p ? p[c] : E(0);
      });
    }
  });
}

// The weight [O, C, taps] as [O][C][taps] (PyTorch's layout), [O][taps][C] (the forward's and
// the weight gradient's matmul operand) or [C][taps][O] (the input gradient's, taps reversed
// by im2col instead): strides of the dims (o, c, t).
struct WeightLayout {
  int64_t o, c, t;
};
WeightLayout pytorch(const ConvGeometry& g) { return {g.c * g.kh * g.kw, g.kh * g.kw, 1}; }
WeightLayout taps_outer(const ConvGeometry& g) { return {g.kh * g.kw * g.c, 1, g.c}; }
WeightLayout transposed(const ConvGeometry& g) { return {1, g.kh * g.kw * g.o, g.o}; }

void reorder(const ConvGeometry& g, DType dtype, WeightLayout from, WeightLayout to,
             const void* src, void* dst) {
  onednn::Strided s;
  const int64_t dims[3] = {g.o, g.c, g.kh * g.kw};
  const int64_t src_strides[3] = {from.o, from.c, from.t}, dst_strides[3] = {to.o, to.c, to.t};
  for (int i = 0; i < 3; ++i)
    s.dims[i] = dims[i], s.src[i] = src_strides[i], s.dst[i] = dst_strides[i];
  s.src[3] = s.dst[3] = 1;
  onednn::reorder(s, dtype, src, dst);
}

// The caller's per-thread buffers (kernels_impl.h's thread_scratch).
struct ColTag;
struct WeightTag;
struct PartTag;

// im2col of x in the calling thread's buffer (x itself for a 1x1 conv that reads its input in
// place), its columns in the weight's order where `weight_order`.
const void* columns(const Conv& v, DType dtype, const void* x, bool weight_order = false) {
  if (v.in_place()) return x;
  const std::size_t size = dtype_size(dtype);
  const auto bytes = static_cast<std::size_t>(v.rows() * v.depth()) * size;
  auto* col = thread_scratch<std::byte, ColTag>(bytes);
  if (!weight_order)
    im2col(v, size, static_cast<const std::byte*>(x), col);
  else if (dtype == DType::BFloat16)
    im2col_weight_order(v, static_cast<const uint16_t*>(x), reinterpret_cast<uint16_t*>(col));
  else
    im2col_weight_order(v, static_cast<const uint32_t*>(x), reinterpret_cast<uint32_t*>(col));
  return col;
}

// The calling thread's buffer for a reordered weight of conv g.
void* weight_buffer(const ConvGeometry& g, DType dtype) {
  const auto elements = static_cast<std::size_t>(g.o * g.c * g.kh * g.kw);
  return thread_scratch<std::byte, WeightTag>(elements * dtype_size(dtype));
}

}  // namespace

bool conv_matmul_applies(const ConvGeometry& g, ConvPass pass, DType dtype) {
  if (g.groups != 1) return false;
  if (dtype != DType::Float32 && !(dtype == DType::BFloat16 && onednn::amx_bfloat16()))
    return false;
  if (pass != ConvPass::kGradInput) return true;
  return g.sh == 1 && g.sw == 1 && g.ph <= g.dh * (g.kh - 1) && g.pw <= g.dw * (g.kw - 1);
}

int64_t weight_grad_images(const ConvGeometry& g, DType dtype, int64_t column_bytes) {
  if (dtype != DType::Float32 || forward_conv(g).in_place())
    return g.n;  // one rounding in bfloat16; no im2col for a 1x1 conv read in place
  const int64_t per_image = g.oh * g.ow * g.kh * g.kw * g.c * static_cast<int64_t>(sizeof(float));
  return std::clamp<int64_t>(column_bytes / std::max<int64_t>(per_image, 1), 1,
                             std::max<int64_t>(g.n, 1));
}

void conv2d_matmul_grad_weight(const ConvGeometry& g, DType dtype, const void* x,
                               const void* grad_y, void* out, int64_t column_bytes) {
  const int64_t taps = g.kh * g.kw;
  void* weight = taps > 1 ? weight_buffer(g, dtype) : out;
  // A matmul per group of images (one group but for a large float32 batch), the later groups'
  // products added to the first's in image order: the groups are fixed by the shape, not the
  // thread count.
  const int64_t images = weight_grad_images(g, dtype, column_bytes);
  const auto size = static_cast<int64_t>(dtype_size(dtype));
  const auto* xb = static_cast<const std::byte*>(x);
  const auto* grad = static_cast<const std::byte*>(grad_y);
  for (int64_t first = 0; first < g.n; first += images) {
    Conv group = forward_conv(g);
    group.n = std::min(images, g.n - first);
    const void* col = columns(group, dtype, xb + first * g.h * g.w * g.c * size);
    const int64_t elements = g.o * group.depth();
    float* part = first == 0 ? nullptr
                             : thread_scratch<float, PartTag>(static_cast<std::size_t>(elements));
    onednn::matmul({.m = g.o, .n = group.depth(), .k = group.rows(), .ta = true}, dtype,
                   grad + first * g.oh * g.ow * g.o * size, col, part ? part : weight);
    if (part) {  // float32 only (weight_grad_images)
      auto* sum = static_cast<float*>(weight);
      parallel_range(elements, grain_for(4 * sizeof(float)), [&](int64_t s, int64_t e) {
        for (int64_t i = s; i < e; ++i) sum[i] += part[i];
      });
    }
  }
  if (taps > 1) reorder(g, dtype, taps_outer(g), pytorch(g), weight, out);
}

void conv2d_matmul(const ConvGeometry& g, ConvPass pass, DType dtype, const void* a,
                   const void* b, void* out, const float* bias, bool relu) {
  const int64_t taps = g.kh * g.kw;  // a 1x1 weight is the matmul's operand as it is
  switch (pass) {
    case ConvPass::kForward: {
      const Conv v = forward_conv(g);
      // The weight outweighs im2col (fewer positions than output channels): read it as it is.
      const bool weight_order = taps > 1 && v.rows() < g.o;
      const void* col = columns(v, dtype, a, weight_order);
      const void* w = b;
      if (taps > 1 && !weight_order) {
        void* wr = weight_buffer(g, dtype);
        reorder(g, dtype, pytorch(g), taps_outer(g), b, wr);
        w = wr;
      }
      onednn::matmul({.m = v.rows(), .n = g.o, .k = v.depth(), .tb = true}, dtype, col, w, out,
                     {bias, relu});
      return;
    }
    case ConvPass::kGradInput: {
      const Conv v = grad_input_conv(g);
      const void* col = columns(v, dtype, a);
      if (taps == 1) {  // grad_x = col * w: w [O, C] is already the matmul's [k, n]
        onednn::matmul({.m = v.rows(), .n = g.c, .k = v.depth()}, dtype, col, b, out);
        return;
      }
      void* weight = weight_buffer(g, dtype);
      reorder(g, dtype, pytorch(g), transposed(g), b, weight);
      onednn::matmul({.m = v.rows(), .n = g.c, .k = v.depth(), .tb = true}, dtype, col, weight,
                     out);
      return;
    }
    case ConvPass::kGradWeight:
      conv2d_matmul_grad_weight(g, dtype, a, b, out);
      return;
  }
}

}  // namespace loom::runtime
