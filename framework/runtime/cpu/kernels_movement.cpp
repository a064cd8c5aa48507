// Movement kernels: reshape, permute, slice, expand, pad and concat. All but concat are one
// strided copy: the output's multi-index maps to an input offset through per-dimension
// strides (0 for a broadcast dimension), so they differ only in how they build the strides.
#include "runtime/cpu/conv/conv_common.h"
#include "runtime/cpu/kernels_impl.h"
#include "runtime/cpu/onednn.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

namespace loom::runtime {
namespace {

// Where a permute runs as oneDNN's reorder (onednn::reorder, whose JIT kernels transpose in
// vector registers) rather than transpose_copy's tiles: a float32 or bfloat16 tensor of up to 4
// dimensions, of at least kOneDnnMinPermute elements, whose innermost dimension moves (a
// transpose: NCHW to NHWC and back, a matrix's last two dimensions). Measured on the 2-core
// development machine (2026-11-25, captured x.permute(p) steps, 100 runs each, loom's time over
// oneDNN's): float32 NCHW to NHWC 1.3 to 3.0 at ResNet shapes ([32,64,32,32] 1.31,
// [128,16,32,32] 1.57, [32,512,4,4] 2.7), NHWC to NCHW 1.1 to 3.3, bfloat16 1.3 to 4.0
// everywhere. The exception, kept on the tiles: float32 NHWC to NCHW from 32 channels onto
// planes of 512 elements or more ([32,32,32,32]: 0.66, [128,16,32,32]: 0.57; from 16 or 64
// channels, or onto 256-element planes, oneDNN wins). kernel_bench's BM_Permute rows time the
// two back to back (the same day: 1.3 to 2.1 in float32, 1.8 to 2.0 in bfloat16, and 0.66 and
// 0.68 at the two float32 exceptions, where bfloat16 was even and 1.6). bfloat16 only where
// oneDNN has JIT reorders for it (from AVX-512 on): below, its reference reorder ("simple:any")
// changed 290 of 51,840 random bit patterns (signalling NaNs made quiet, subnormals flushed to
// zero) on an AVX2-only EPYC, where a permute moves bits.
constexpr int64_t kOneDnnMinPermute = int64_t{1} << 15;

bool onednn_transposes(const TensorView& x, const std::vector<int64_t>& perm,
                       const TensorView& out) {
  const std::size_t rank = perm.size();
  if (x.dtype == DType::BFloat16 && !onednn::bfloat16_supported()) return false;
  if ((x.dtype != DType::Float32 && x.dtype != DType::BFloat16) || rank < 2 || rank > 4 ||
      out.numel() < kOneDnnMinPermute || perm.back() == static_cast<int64_t>(rank) - 1)
    return false;
  // The slow pattern: float32 rows of 32 (x's innermost dimension) spread onto planes of 512
  // or more (out's stride for that dimension).
  const auto moved = static_cast<std::size_t>(
      std::find(perm.begin(), perm.end(), static_cast<int64_t>(rank) - 1) - perm.begin());
  const int64_t plane = dims_product(out.shape, moved + 1, rank);
  return !(x.dtype == DType::Float32 && x.shape.back() == 32 && plane >= 512);
}

struct CopyPlan {
  Strides shape;
  Strides src_strides, dst_strides;
};

// Drops size-1 dimensions and merges neighbours that are contiguous in both source and
// destination, so that a slice of whole rows becomes one long run (often a memcpy).
CopyPlan coalesce(const Shape& shape, const Strides& src_strides, const Strides& dst_strides) {
  CopyPlan p;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!p.shape.empty() && p.src_strides.back() == src_strides[d] * shape[d] &&
        p.dst_strides.back() == dst_strides[d] * shape[d]) {
      p.shape.back() *= shape[d];
      p.src_strides.back() = src_strides[d];
      p.dst_strides.back() = dst_strides[d];
      continue;
    }
    p.shape.push_back(shape[d]);
    p.src_strides.push_back(src_strides[d]);
    p.dst_strides.push_back(dst_strides[d]);
  }
  return p;
}

int64_t outer_offset(int64_t o, const CopyPlan& p, std::size_t dims, const Strides& strides) {
  int64_t off = 0;
  for (std::size_t d = dims; d-- > 0;) {
    off += (o % p.shape[d]) * strides[d];
    o /= p.shape[d];
  }
  return off;
}

// The two innermost dims are transposed (the source is contiguous along the outer of them).
// Each square tile goes through a small local buffer so that both sides are touched a whole
// contiguous run at a time; walking the strided side directly thrashes cache sets when the
// strides are powers of two.
template <class U>
void transpose_copy(const U* src, U* dst, const CopyPlan& p) {
  constexpr int64_t kTile = 32;
  const std::size_t rank = p.shape.size();
  const int64_t rows = p.shape[rank - 2], cols = p.shape[rank - 1];
  const int64_t src_col = p.src_strides[rank - 1], dst_row = p.dst_strides[rank - 2];
  const int64_t tr = (rows + kTile - 1) / kTile, tc = (cols + kTile - 1) / kTile;
  const int64_t outer = dims_product(p.shape, 0, rank - 2);
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / (kTile * kTile));
  parallel_range(outer * tr * tc, grain, [&](int64_t b, int64_t e) {
    U tile[kTile][kTile];
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / (tr * tc);
      const int64_t i0 = (t / tc % tr) * kTile, j0 = (t % tc) * kTile;
      const int64_t i1 = std::min(rows, i0 + kTile), j1 = std::min(cols, j0 + kTile);
      const U* s = src + outer_offset(o, p, rank - 2, p.src_strides);
      U* d = dst + outer_offset(o, p, rank - 2, p.dst_strides);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) tile[j - j0][i - i0] = s[i + j * src_col];
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = j0; j < j1; ++j) d[i * dst_row + j] = tile[j - j0][i - i0];
    }
  });
}

// n elements, s read every ss and t written every ds: a memcpy when both are contiguous, a fill
// when one value is broadcast over a contiguous run.
template <class U>
void copy_run(const U* s, U* t, int64_t n, int64_t ss, int64_t ds) {
  if (ss == 1 && ds == 1) {
    std::memcpy(t, s, n * sizeof(U));
  } else if (ss == 0 && ds == 1) {
    std::fill(t, t + n, *s);
  } else {
    for (int64_t i = 0; i < n; ++i) t[i * ds] = s[i * ss];
  }
}

template <class U>
void strided_copy_typed(const U* src, U* dst, const CopyPlan& p) {
  std::size_t rank = p.shape.size();
  if (rank == 0) {  // a single element
    *dst = *src;
    return;
  }
  // (A zero inner stride is a broadcast of each source element along the row, not a transpose.)
  if (rank >= 2 && p.src_strides[rank - 2] == 1 && p.src_strides[rank - 1] > 1 &&
      p.dst_strides[rank - 1] == 1)
    return transpose_copy(src, dst, p);
  const int64_t inner = p.shape.back();
  const int64_t ss = p.src_strides.back(), ds = p.dst_strides.back();
  if (rank == 1) {  // one run (a whole copy, or a scalar broadcast): split among the threads
    parallel_range(inner, kGrainElementwise, [&](int64_t begin, int64_t end) {
      copy_run(src + begin * ss, dst + begin * ds, end - begin, ss, ds);
    });
    return;
  }
  const int64_t rows = dims_product(p.shape, 0, rank - 1);
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / inner);
  parallel_range(rows, grain, [&](int64_t begin, int64_t end) {
    // Odometer over the outer dimensions, started at row `begin`.
    Strides idx(rank - 1);
    int64_t so = 0, dof = 0;
    for (int64_t r = begin, d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      idx[d] = r % p.shape[d];
      r /= p.shape[d];
      so += idx[d] * p.src_strides[d];
      dof += idx[d] * p.dst_strides[d];
    }
    for (int64_t row = begin; row < end; ++row) {
      copy_run(src + so, dst + dof, inner, ss, ds);
      for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
        so += p.src_strides[d];
        dof += p.dst_strides[d];
        if (++idx[d] < p.shape[d]) break;
        so -= idx[d] * p.src_strides[d];
        dof -= idx[d] * p.dst_strides[d];
        idx[d] = 0;
      }
    }
  });
}

// Copies the whole input into out with the given per-output-dimension input strides.
void gather_strided(const TensorView& x, const Strides& src_strides, int64_t src_offset,
                    const TensorView& out) {
  strided_copy(x.data, src_strides, src_offset, out.data, contiguous_strides(out.shape), 0,
               out.shape, out.dtype);
}

}  // namespace

void strided_copy(const void* src, const Strides& src_strides, int64_t src_offset, void* dst,
                  const Strides& dst_strides, int64_t dst_offset, const Shape& shape, DType dtype) {
  if (shape_numel(shape) == 0) return;
  CopyPlan plan = coalesce(shape, src_strides, dst_strides);
  visit_width(dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    strided_copy_typed(static_cast<const U*>(src) + src_offset, static_cast<U*>(dst) + dst_offset,
                       plan);
  });
}

void reshape_kernel(const TensorView& x, const TensorView& out) {
  if (x.data != out.data) std::memcpy(out.data, x.data, out.numel() * dtype_size(out.dtype));
}

void permute_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  const auto& perm = attr.get<ir::PermuteAttr>().perm;
  assert(perm.size() == x.shape.size() && "permute: one entry per dimension");
  auto in_strides = contiguous_strides(x.shape);
  Strides src(out.shape.size());
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = in_strides[perm[i]];
  if (onednn_transposes(x, perm, out)) {
    onednn::Strided s;
    const auto out_strides = contiguous_strides(out.shape);
    const std::size_t pad = 4 - out.shape.size();  // leading dimensions of size 1
    for (std::size_t i = 0; i < pad; ++i) s.src[i] = s.dst[i] = out.numel();
    for (std::size_t i = 0; i < out.shape.size(); ++i) {
      s.dims[pad + i] = out.shape[i];
      s.src[pad + i] = src[i];
      s.dst[pad + i] = out_strides[i];
    }
    onednn::reorder(s, x.dtype, x.data, out.data);
    return;
  }
  gather_strided(x, src, 0, out);
}

void slice_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  // The sizes are already the output's shape.
  const auto& a = attr.get<ir::SliceAttr>();
  std::size_t r = x.shape.size();
  assert(a.starts.size() == r && a.steps.size() == r && "slice: a start and a step per dimension");
  auto in_strides = contiguous_strides(x.shape);
  Strides src(r);
  int64_t offset = 0;
  for (std::size_t d = 0; d < r; ++d) {
    offset += a.starts[d] * in_strides[d];
    src[d] = a.steps[d] * in_strides[d];
  }
  gather_strided(x, src, offset, out);
}

void expand_kernel(const TensorView& x, const TensorView& out) {
  assert(x.shape.size() == out.shape.size() && "expand: same rank");
  auto in_strides = contiguous_strides(x.shape);
  for (std::size_t d = 0; d < in_strides.size(); ++d)
    if (x.shape[d] != out.shape[d]) in_strides[d] = 0;  // a size-1 dim being broadcast
  gather_strided(x, in_strides, 0, out);
}

void pad_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  const auto& a = attr.get<ir::PadAttr>();
  assert(a.lo.size() == x.shape.size() && "pad: a low pad per dimension");
  fill_value(out, a.value);
  auto out_strides = contiguous_strides(out.shape);
  int64_t offset = 0;
  for (std::size_t d = 0; d < out_strides.size(); ++d) offset += a.lo[d] * out_strides[d];
  strided_copy(x.data, contiguous_strides(x.shape), 0, out.data, out_strides, offset, x.shape,
               x.dtype);
}

void concat_kernel(const ir::Attr& attr, Inputs in, const TensorView& out) {
  // Each input is a run of in.shape[axis] * inner contiguous elements per outer index, so the
  // output row is those runs laid side by side.
  auto axis = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  const std::size_t elem = dtype_size(out.dtype);
  const int64_t outer = dims_product(out.shape, 0, axis);
  const int64_t inner = dims_product(out.shape, axis + 1, out.shape.size());
  const int64_t out_row = out.shape[axis] * inner;
  Strides run(in.size()), start(in.size());
  for (std::size_t i = 0, at = 0; i < in.size(); ++i) {
    run[i] = in[i].shape[axis] * inner;
    start[i] = static_cast<int64_t>(at);
    at += run[i];
  }
  if (outer * out_row == 0) return;
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / out_row);
  auto* dst = static_cast<unsigned char*>(out.data);
  parallel_range(outer, grain, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (run[i] == 0) continue;
        const auto* src = static_cast<const unsigned char*>(in[i].data);
        std::memcpy(dst + (o * out_row + start[i]) * elem, src + o * run[i] * elem, run[i] * elem);
      }
  });
}

// Row (c, i, j) of the result holds, for every output position (n, y, x) in turn, the input
// element that tap (i, j) of the window at (y, x) reads from channel c of image n, zero in the
// padding: each image's im2col (conv_common.h, as the im2col + GEMM convs write it) placed in
// its block of columns. (image, channel) pairs are the tasks.
void im2col_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  const auto& a = attr.get<ir::Conv2dGradAttr>();
  const int64_t n = x.shape[0], c = x.shape[1];
  const int64_t cols = out.shape[1], positions = n > 0 ? cols / n : 0;
  if (shape_numel(out.shape) == 0) return;
  auto extent = [&](int i) {
    const auto& v = a.conv;
    return (x.shape[2 + i] + 2 * v.padding[i] - v.dilation[i] * (a.size[i] - 1) - 1) / v.stride[i] +
           1;
  };
  const ConvGeometry g = conv_geometry(a.conv, x.shape, {1, c, a.size[0], a.size[1]},
                                       {n, 1, extent(0), extent(1)});
  const int64_t rows_per_channel = g.kh * g.kw;
  visit_width(x.dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    const auto* src = static_cast<const U*>(x.data);
    auto* dst = static_cast<U*>(out.data);
    const int64_t grain = std::max<int64_t>(1, kGrainElementwise / (rows_per_channel * positions));
    parallel_range(n * c, grain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / c, ch = t % c;
        im2col(src + b * c * g.h * g.w, g, ch, 1, 0, positions,
               dst + ch * rows_per_channel * cols + b * positions, cols);
      }
    });
  });
}

}  // namespace loom::runtime
