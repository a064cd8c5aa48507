// Indexing kernels: gather, index_select, scatter_add and one_hot. Indices are int64 and
// checked before anything is written; a negative or too-large index is a user error
// (loom::Error naming the op, the index and the valid range), never wrapped around.
//
// gather and scatter_add view the index as [outer, L, inner] around `dim`: elements that
// differ outside `dim` address different elements of x (or self), which lets scatter_add
// split work across threads without atomics and add in a fixed order (deterministic sums).
#include "runtime/cpu/kernels_impl.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

namespace loom::runtime {
namespace {

[[noreturn]] void index_error(const char* op, int64_t index, std::size_t dim, int64_t size) {
  throw Error(std::string(op) + ": index " + std::to_string(index) +
              " is out of range for dimension " + std::to_string(dim) + " of size " +
              std::to_string(size));
}

// A serial scan: cheap next to the kernel (a branch-free pass the compiler vectorises; a
// negative index reads as a huge unsigned one), and it reports the first bad index, whatever
// the thread count.
void check_indices(const char* op, const TensorView& index, std::size_t dim, int64_t size) {
  const int64_t* p = index.as<const int64_t>();
  const int64_t n = index.numel();
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint64_t>(p[i]) >= static_cast<uint64_t>(size);
  if (!bad) return;
  for (int64_t i = 0; i < n; ++i)
    if (p[i] < 0 || p[i] >= size) index_error(op, p[i], dim, size);
}

// The index's shape split around dim, with x's strides for the dims outside it.
struct IndexLayout {
  int64_t outer, len, inner;
  int64_t dim_stride;                  // x's stride along dim
  Strides outer_shape;                 // index dims before dim
  Strides outer_strides;               // x's strides for them
  const int64_t* inner_offset;         // x offset of each inner position q (thread scratch)
};

IndexLayout index_layout(const Shape& x_shape, const Shape& index_shape, std::size_t dim) {
  IndexLayout l;
  auto xs = contiguous_strides(x_shape);
  l.outer = dims_product(index_shape, 0, dim);
  l.len = index_shape[dim];
  l.inner = dims_product(index_shape, dim + 1, index_shape.size());
  l.dim_stride = xs[dim];
  l.outer_shape = Strides(index_shape.begin(), index_shape.begin() + dim);
  l.outer_strides = Strides(xs.begin(), xs.begin() + dim);
  // The index may be smaller than x outside dim, so inner positions are not always x's.
  int64_t* inner_offset = thread_scratch<int64_t, IndexLayout>(l.inner);
  l.inner_offset = inner_offset;
  for (int64_t q = 0; q < l.inner; ++q) {
    int64_t off = 0, r = q;
    for (std::size_t d = index_shape.size(); d-- > dim + 1;) {
      off += (r % index_shape[d]) * xs[d];
      r /= index_shape[d];
    }
    inner_offset[q] = off;
  }
  return l;
}

int64_t outer_offset(const IndexLayout& l, int64_t o) {
  int64_t off = 0;
  for (std::size_t d = l.outer_shape.size(); d-- > 0;) {
    off += (o % l.outer_shape[d]) * l.outer_strides[d];
    o /= l.outer_shape[d];
  }
  return off;
}

template <class U>
void gather_typed(const IndexLayout& l, const U* px, const int64_t* idx, U* po) {
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(l.inner, 1));
  parallel_range(l.outer * l.len, grain, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const U* base = px + outer_offset(l, row / l.len);
      const int64_t at = row * l.inner;
      for (int64_t q = 0; q < l.inner; ++q)
        po[at + q] = base[idx[at + q] * l.dim_stride + l.inner_offset[q]];
    }
  });
}

// A task owns one outer position and a block of inner positions, all along dim, so each
// element of the result is summed by one task in index order. With few outer positions (an
// embedding's gradient has one, over rows of 512 or so) the blocks are narrower, so that every
// thread has some. With kRows (scatter_add_rows_kernel: the index holds one value per line
// and spans self's inner dims, so a line's positions are contiguous in self) a line adds its
// source row at the line's first index, a vector loop over the block; each element sees the
// same additions in the same order either way.
template <class T, bool kRows>
void scatter_add_typed(const IndexLayout& l, const int64_t* idx, const T* src, T* po) {
  // Rows: about 8 column blocks a row (multiples of 16 elements, at least 64).
  const int64_t block = kRows ? std::max<int64_t>(64, (l.inner + 7) / 8 / 16 * 16)
                              : (l.outer >= 16 ? 1024 : 128);
  const int64_t blocks = (l.inner + block - 1) / block;
  const int64_t grain =
      std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(l.len * block, 1));
  parallel_range(l.outer * blocks, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / blocks, q0 = (t % blocks) * block;
      const int64_t q1 = std::min(l.inner, q0 + block);
      T* base = po + outer_offset(l, o);
      for (int64_t i = 0; i < l.len; ++i) {
        const int64_t at = (o * l.len + i) * l.inner;
        if constexpr (kRows) {
          T* row = base + idx[at] * l.dim_stride;
          for (int64_t q = q0; q < q1; ++q) row[q] += src[at + q];
        } else {
          for (int64_t q = q0; q < q1; ++q)
            base[idx[at + q] * l.dim_stride + l.inner_offset[q]] += src[at + q];
        }
      }
    }
  });
}

// out = self, split among the threads (nothing to do where the result took self's buffer).
void copy_self(const TensorView& self, const TensorView& out) {
  if (out.data == self.data) return;
  const int64_t bytes = out.numel() * static_cast<int64_t>(dtype_size(out.dtype));
  const auto* from = static_cast<const unsigned char*>(self.data);
  auto* to = static_cast<unsigned char*>(out.data);
  parallel_range(bytes, kGrainElementwise * 4, [&](int64_t b, int64_t e) {
    std::memcpy(to + b, from + b, static_cast<std::size_t>(e - b));
  });
}

}  // namespace

void gather_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& index,
                   const TensorView& out) {
  auto dim = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  check_indices("gather", index, dim, x.shape[dim]);
  if (out.numel() == 0) return;
  IndexLayout l = index_layout(x.shape, index.shape, dim);
  visit_width(out.dtype, [&](auto tag) {
    using U = typename decltype(tag)::type;
    gather_typed<U>(l, x.as<const U>(), index.as<const int64_t>(), out.as<U>());
  });
}

void index_select_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& index,
                         const TensorView& out) {
  auto dim = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  check_indices("index_select", index, dim, x.shape[dim]);
  const int64_t outer = dims_product(x.shape, 0, dim);
  const int64_t size = x.shape[dim];
  const int64_t len = index.numel();
  const std::size_t run = dims_product(x.shape, dim + 1, x.shape.size()) * dtype_size(x.dtype);
  if (outer * len == 0 || run == 0) return;
  const int64_t* idx = index.as<const int64_t>();
  const auto* src = static_cast<const unsigned char*>(x.data);
  auto* dst = static_cast<unsigned char*>(out.data);
  // Rows are whole slices after dim, so each output row is one memcpy.
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise * 4 / static_cast<int64_t>(run));
  parallel_range(outer * len, grain, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      const int64_t o = row / len, i = row % len;
      std::memcpy(dst + row * run, src + (o * size + idx[i]) * run, run);
    }
  });
}

void scatter_add_kernel(const ir::Attr& attr, const TensorView& self, const TensorView& index,
                        const TensorView& src, const TensorView& out) {
  auto dim = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  check_indices("scatter_add", index, dim, self.shape[dim]);
  copy_self(self, out);
  if (index.numel() == 0) return;
  IndexLayout l = index_layout(self.shape, index.shape, dim);
  visit_numeric("scatter_add", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_add_typed<T, false>(l, index.as<const int64_t>(), src.as<const T>(), out.as<T>());
  });
}

void scatter_add_rows_kernel(const ir::Attr& attr, const TensorView& self,
                             const TensorView& index, const TensorView& src,
                             const TensorView& out) {
  const auto dim = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  // Rows are contiguous in self only where the index spans self's inner dims.
  const bool rows = index.shape.size() == self.shape.size() &&
                    std::equal(index.shape.begin() + static_cast<std::ptrdiff_t>(dim) + 1,
                               index.shape.end(),
                               self.shape.begin() + static_cast<std::ptrdiff_t>(dim) + 1);
  if (!rows) return scatter_add_kernel(attr, self, index, src, out);
  // Only each line's first index is read, so only those are checked.
  const int64_t size = self.shape[dim];
  const int64_t inner = dims_product(index.shape, dim + 1, index.shape.size());
  const int64_t lines = inner > 0 ? index.numel() / inner : 0;
  const int64_t* p = index.as<const int64_t>();
  for (int64_t k = 0; k < lines; ++k)
    if (p[k * inner] < 0 || p[k * inner] >= size)
      index_error("scatter_add", p[k * inner], dim, size);
  copy_self(self, out);
  if (index.numel() == 0) return;
  const IndexLayout l = index_layout(self.shape, index.shape, dim);
  visit_numeric("scatter_add", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_add_typed<T, true>(l, p, src.as<const T>(), out.as<T>());
  });
}

void one_hot_kernel(const ir::Attr& attr, const TensorView& indices, const TensorView& out) {
  const int64_t classes = attr.get<ir::OneHotAttr>().num_classes;
  const int64_t* idx = indices.as<const int64_t>();
  const int64_t n = indices.numel();
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= classes)
      throw Error("one_hot: index " + std::to_string(idx[i]) +
                  " is out of range for num_classes " + std::to_string(classes));
  int64_t* po = out.as<int64_t>();
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / classes);
  parallel_range(n, grain, [&](int64_t b, int64_t e) {
    std::fill(po + b * classes, po + e * classes, int64_t{0});
    for (int64_t i = b; i < e; ++i) po[i * classes + idx[i]] = 1;
  });
}

}  // namespace loom::runtime
