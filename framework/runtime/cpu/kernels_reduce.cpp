// Reduction kernels: sum, mean and amax over a set of axes (kept with size 1), and argmax
// over one axis. Axes are first simplified: size-1 dimensions are dropped and neighbouring
// dimensions that are both reduced or both kept are merged, leaving one of two layouts:
//   ... reduced innermost: each output folds contiguous runs (e.g. a row sum);
//   ... kept innermost:    a block of neighbouring outputs folds whole input rows at once
//                          (e.g. a column sum), so memory is read in order; with few outputs
//                          (a column sum of a tall matrix) the rows are split in chunks.
// What each reduction folds, element by element and run by run, is reduce_ops.h.
#include "runtime/cpu/kernels_fused.h"
#include "runtime/cpu/kernels_impl.h"
#include "runtime/cpu/reduce_ops.h"

#include "ir/unreachable.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <span>
#include <type_traits>
#include <vector>

namespace loom::runtime {
namespace {

using ir::Op;
using reduce_ops::is_nan;
using reduce_ops::MaxOp;
using reduce_ops::MeanOp;
using reduce_ops::SumOp;

struct Dim {
  int64_t size;
  int64_t stride;  // in input elements
};
using Dims = SmallVector<Dim, 8>;

// Outputs folded together per task in the kept-innermost layout.
constexpr int64_t kBlock = 256;

// What a reduction reads: its operand in memory, or a fused elementwise prologue evaluated
// run by run (compiler/fuse_reduce.cpp), so the operand never goes to memory.
template <class T>
struct Operand {
  const T* data = nullptr;
  const ir::Fusion* prologue = nullptr;
  std::span<const TensorView> prologue_in;
  const FusedCode* code = nullptr;  // the prologue's machine code, if it has any

  // Elements [offset, offset + len) in row-major order; `tmp` has room for len elements.
  const T* run(int64_t offset, int64_t len, T* tmp) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (prologue) {
        eval_fusion<T>(*prologue, prologue_in, offset, len, tmp, code);
        return tmp;
      }
    }
    return data + offset;
  }
};

// Elements read at a time in the reduced-innermost layout.
constexpr int64_t kRun = kFusedBlock;
// Reductions to at most kFewOutputs outputs, of at least kChunkElems elements each (or of
// short runs, kChunkElems elements in all), read their operand in chunks of about kChunkElems
// elements (reduce_in_chunks).
constexpr int64_t kFewOutputs = 1024;
constexpr int64_t kChunkElems = int64_t{1} << 15;
constexpr std::size_t kMaxChunkRank = 16;  // dimensions reduce_in_chunks walks
struct Partials;  // the tag of reduce_in_chunks' per-thread partial results
struct Pieces;    // the tag of PieceReader's per-thread buffer

// Elements of a prologue evaluated at once by the chunked reductions: one evaluator set-up
// (cursors, per-channel patterns written out) per piece rather than per run of kRun, and
// pieces long enough for a channels-last per-channel operand to be read as a pattern.
constexpr int64_t kPiece = 16 * kRun;

// Reads an operand window by window, in order, over [begin, end): with a prologue, it is
// evaluated a piece of kPiece elements at a time into a per-thread buffer, which the windows
// then read. The windows, and so how runs are folded, are the same with or without one.
template <class T>
class PieceReader {
 public:
  PieceReader(const Operand<T>& x, int64_t end)
      : x_(x), end_(end),
        buf_(x.prologue ? thread_scratch<T, Pieces>(static_cast<std::size_t>(kPiece)) : nullptr) {}

  // Elements [pos, pos + len) (len <= kPiece), pos at or past the previous window's start.
  const T* window(int64_t pos, int64_t len) {
    if (!buf_) return x_.data + pos;
    if (pos < lo_ || pos + len > hi_) {
      lo_ = pos;
      hi_ = std::min(end_, pos + kPiece);
      x_.run(lo_, hi_ - lo_, buf_);
    }
    return buf_ + (pos - lo_);
  }

 private:
  const Operand<T>& x_;
  const int64_t end_;
  T* buf_;
  int64_t lo_ = 0, hi_ = 0;
};

// Odometer over dims: visits every multi-index in row-major order, tracking its offset.
class Odometer {
 public:
  explicit Odometer(const Dims& dims) : dims_(dims), idx_(dims.size(), 0) {}
  int64_t offset() const { return offset_; }
  void reset() {
    std::fill(idx_.begin(), idx_.end(), 0);
    offset_ = 0;
  }
  void next() {
    for (std::size_t d = dims_.size(); d-- > 0;) {
      offset_ += dims_[d].stride;
      if (++idx_[d] < dims_[d].size) return;
      offset_ -= idx_[d] * dims_[d].stride;
      idx_[d] = 0;
    }
  }

 private:
  const Dims& dims_;
  SmallVector<int64_t, 8> idx_;
  int64_t offset_ = 0;
};

int64_t count_of(const Dims& dims) {
  int64_t n = 1;
  for (auto& d : dims) n *= d.size;
  return n;
}

// Input offset of the output element `o`, whose multi-index runs over `kept`.
int64_t kept_offset(int64_t o, const Dims& kept) {
  int64_t off = 0;
  for (std::size_t d = kept.size(); d-- > 0;) {
    off += (o % kept[d].size) * kept[d].stride;
    o /= kept[d].size;
  }
  return off;
}

// The chunked reductions' frame: fold(c, part) folds chunk c into its own partial results
// (n_out of them, initialised), chunks in parallel; the partials are then combined in chunk
// order, so the result depends on the chunks (the shape) only, not on the thread count.
template <class T, class R, class Fold>
void fold_in_chunks(int64_t chunks, int64_t n_out, int64_t n_red, T* po, Fold fold) {
  using Acc = typename R::Acc;
  Acc* partial = thread_scratch<Acc, Partials>(static_cast<std::size_t>(chunks * n_out));
  parallel_range(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      Acc* part = partial + c * n_out;
      std::fill(part, part + n_out, R::init());
      fold(c, part);
    }
  });
  parallel_range(n_out, 64, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      Acc acc = partial[o];
      for (int64_t c = 1; c < chunks; ++c) R::combine(acc, partial[c * n_out + o]);
      po[o] = R::finish(acc, n_red);
    }
  });
}

// Few outputs, each a sum over much data with the reduced dimension innermost (BatchNorm's
// per-channel statistics over [N, C, H, W]): the operand is read in memory order, cut into
// fixed chunks of whole runs (`inner` contiguous elements, one output each), and a prologue
// is evaluated over whole blocks of a chunk rather than run by run (an 8x8 plane is a run of
// 64). Each chunk folds its runs into partial results per output; the chunks' partials are
// then combined in chunk order. Chunks depend on the shape only, so the result does not
// depend on the thread count, and runs are folded the same way with or without a prologue.
template <class T, class R>
void reduce_in_chunks(const Operand<T>& x, const Shape& shape, const std::vector<int64_t>& axes,
                      int64_t inner, int64_t n_out, T* po) {
  using Acc = typename R::Acc;
  // The dimensions outside the innermost run, and for each whether it is kept (then its
  // coordinate is part of the output index).
  SmallVector<int64_t, kMaxChunkRank> sizes;
  SmallVector<bool, kMaxChunkRank> kept;
  int64_t inner_dims = 1, runs = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    const bool r = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d));
    if (inner_dims < inner || (inner_dims == inner && shape[d] == 1 && r)) {
      inner_dims *= shape[d];
      continue;
    }
    sizes.insert_front(shape[d]);
    kept.insert_front(!r && shape[d] > 1);
    runs *= shape[d];
  }
  assert(inner_dims == inner && "reduce: the innermost run does not match the shape");
  const int64_t runs_per_chunk = std::max<int64_t>(1, kChunkElems / inner);
  const int64_t chunks = (runs + runs_per_chunk - 1) / runs_per_chunk;
  const int64_t n_red = runs / n_out * inner;
  fold_in_chunks<T, R>(chunks, n_out, n_red, po, [&](int64_t c, Acc* part) {
    const int64_t r0 = c * runs_per_chunk, r1 = std::min(runs, r0 + runs_per_chunk);
    // The output of run r0, then advanced run by run with an odometer over `sizes`.
    std::array<int64_t, kMaxChunkRank> idx{};
    int64_t rem = r0;
    for (std::size_t d = sizes.size(); d-- > 0;) {
      idx[d] = rem % sizes[d];
      rem /= sizes[d];
    }
    auto output_of = [&] {
      int64_t o = 0;
      for (std::size_t d = 0; d < sizes.size(); ++d)
        if (kept[d]) o = o * sizes[d] + idx[d];
      return o;
    };
    int64_t o = output_of();
    int64_t left = inner;  // elements of the current run still to fold
    const int64_t end = r1 * inner;
    PieceReader<T> reader(x, end);
    for (int64_t at = r0 * inner; at < end;) {
      const int64_t len = std::min(kRun, end - at);
      const T* v = reader.window(at, len);
      for (int64_t i = 0; i < len;) {
        const int64_t n = std::min(left, len - i);
        R::fold_run(part[o], v + i, n);
        i += n;
        left -= n;
        if (left == 0) {
          left = inner;
          for (std::size_t d = sizes.size(); d-- > 0;) {
            if (++idx[d] < sizes[d]) break;
            idx[d] = 0;
          }
          o = output_of();
        }
      }
      at += len;
    }
  });
}

// Rows a window of reduce_rows_in_chunks' float sums takes at other widths than fixed_rows'.
constexpr int64_t kSumRows = 8;
static_assert(kSumRows * kFewOutputs <= kPiece, "a window of whole rows fits a piece");

// Adds `rows` rows of `inner` floats at v into the double sums part[0, inner), each column's
// rows in order (part[c] + r0[c], then + r1[c], ...): the sequential fold's bits. A block of
// 16 columns keeps its sums in registers over the rows.
void add_rows_in_order(const float* v, int64_t rows, int64_t inner, double* part) {
  int64_t c = 0;
#if defined(__AVX2__)
  for (; c + 16 <= inner; c += 16) {
    __m256d s0 = _mm256_loadu_pd(part + c), s1 = _mm256_loadu_pd(part + c + 4);
    __m256d s2 = _mm256_loadu_pd(part + c + 8), s3 = _mm256_loadu_pd(part + c + 12);
    for (int64_t r = 0; r < rows; ++r) {
      const float* q = v + r * inner + c;
      s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm_loadu_ps(q)));
      s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm_loadu_ps(q + 4)));
      s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm_loadu_ps(q + 8)));
      s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm_loadu_ps(q + 12)));
    }
    _mm256_storeu_pd(part + c, s0);
    _mm256_storeu_pd(part + c + 4, s1);
    _mm256_storeu_pd(part + c + 8, s2);
    _mm256_storeu_pd(part + c + 12, s3);
  }
#endif
  for (; c < inner; ++c)
    for (int64_t r = 0; r < rows; ++r) part[c] += static_cast<double>(v[r * inner + c]);
}

// Few outputs, kept innermost, each a sum over many rows before them (a per-channel statistic
// over a channels-last [N,H,W,C]: N*H*W rows of C): the rows are cut into fixed chunks, each
// read in memory order over long runs (a prologue evaluated over whole blocks) and folded into
// partial results per output, which are then combined in chunk order. As in reduce_in_chunks,
// the result depends on the shape only, not on the thread count.
// The rows [at, end) of a chunk of W outputs each (W divides kRun, so every window holds whole
// rows), folded into accumulators that stay in registers, without the general loop's per-row
// bookkeeping and with no round trip through memory per row. Maxima fold row by row, as the
// general loop does. Float sums take the rows in groups of kGroupRows from the chunk's start
// (add_row_group, kernels_fused.h), the rows missing from a chunk's last group counting as +0.
template <class T, class R, int W>
void fold_fixed_rows(PieceReader<T>& reader, int64_t at, int64_t end, typename R::Acc* part) {
  static_assert(kRun % W == 0);
  typename R::Acc acc[W];
  for (int j = 0; j < W; ++j) acc[j] = part[j];
  constexpr bool kGrouped = std::is_same_v<T, float> && std::is_same_v<typename R::Acc, double>;
  static_assert(!kGrouped || kRun % (kGroupRows * W) == 0, "a window holds whole groups");
  while (at < end) {
    const int64_t len = std::min(kRun, end - at);
    const T* v = reader.window(at, len);
    if constexpr (kGrouped) {
      int64_t i = 0;
      for (; i + kGroupRows * W <= len; i += kGroupRows * W) add_row_group<W>(v + i, acc);
      if (i < len) {  // the chunk's last, short group, its missing rows +0
        float rows[kGroupRows * W] = {};
        std::copy(v + i, v + len, rows);
        add_row_group<W>(rows, acc);
      }
    } else {
      for (int64_t i = 0; i < len; i += W)
        for (int j = 0; j < W; ++j) R::fold(acc[j], v[i + j]);
    }
    at += len;
  }
  for (int j = 0; j < W; ++j) part[j] = acc[j];
}

template <class T, class R>
void fold_fixed_rows(PieceReader<T>& reader, int64_t inner, int64_t at, int64_t end,
                     typename R::Acc* part) {
  switch (inner) {
    case 8: return fold_fixed_rows<T, R, 8>(reader, at, end, part);
    case 16: return fold_fixed_rows<T, R, 16>(reader, at, end, part);
    case 32: return fold_fixed_rows<T, R, 32>(reader, at, end, part);
    case 64: return fold_fixed_rows<T, R, 64>(reader, at, end, part);
    default: LOOM_UNREACHABLE("fold_fixed_rows: not a fixed row width");
  }
}

// Rows [at, end) of operand x (a fixed_rows width), from a group's start, folded into part:
// a prologue whose code folds rows of this width (FusedCode::fold_rows) folds straight from the
// code's registers, through fold_fusion_rows, to the same bits as fold_fixed_rows.
template <class T, class R>
void fold_rows_of(const Operand<T>& x, int64_t inner, int64_t at, int64_t end,
                  typename R::Acc* part) {
  if constexpr (std::is_same_v<T, float> && std::is_same_v<typename R::Acc, double>) {
    if (x.prologue && x.code && x.code->fold_width() == inner)
      return fold_fusion_rows(*x.prologue, x.prologue_in, at, end - at, inner, part, x.code);
  }
  PieceReader<T> reader(x, end);
  fold_fixed_rows<T, R>(reader, inner, at, end, part);
}

// `xs` holds one operand, or (a stacked sum, compiler/stack_reductions.h) several of one
// shape, whose results go one after another to po. Several operands take fixed_rows widths:
// a chunk then goes piece by piece, each operand's prologue evaluated over the piece in turn,
// so what they load in common is read from memory once and from cache after. A piece is whole
// windows and groups of rows, so each operand folds exactly as it does alone. With `together`
// (float sums and means), the operands' rows are folded in one pass (fold_stacked_rows), the
// pieces taking over only where it stops.
template <class T, class R>
void reduce_rows_in_chunks(std::span<const Operand<T>> xs, int64_t rows, int64_t inner, T* po,
                           const StackedFold* together = nullptr) {
  using Acc = typename R::Acc;
  const int64_t rows_per_chunk = std::max<int64_t>(1, kChunkElems / inner);
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const auto n_ops = static_cast<int64_t>(xs.size());
  assert((n_ops == 1 || fixed_rows(inner)) && "reduce: operands stacked at a width not taken");
  fold_in_chunks<T, R>(chunks, n_ops * inner, rows, po, [&](int64_t c, Acc* part) {
    const int64_t end = std::min(rows, (c + 1) * rows_per_chunk) * inner;
    const int64_t begin = c * rows_per_chunk * inner;
    if (n_ops > 1) {
      static_assert(kPiece % (kGroupRows * 64) == 0 && kPiece % kRun == 0);
      int64_t from = begin;
      if constexpr (std::is_same_v<T, float> && std::is_same_v<Acc, double>) {
        if (together)
          from = fold_stacked_rows(*together, xs[0].prologue_in, begin, end - begin, inner, part);
      }
      for (int64_t at = from; at < end; at += kPiece) {
        const int64_t stop = std::min(end, at + kPiece);
        for (int64_t j = 0; j < n_ops; ++j)
          fold_rows_of<T, R>(xs[j], inner, at, stop, part + j * inner);
      }
      return;
    }
    if (fixed_rows(inner)) return fold_rows_of<T, R>(xs[0], inner, begin, end, part);
    PieceReader<T> reader(xs[0], end);
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Acc, double>) {
      // Float sums: kSumRows whole rows a window, each column block's sums kept in registers
      // over them (add_rows_in_order), where the loop below loads and stores every sum per row.
      for (int64_t at = begin; at < end;) {
        const int64_t len = std::min(kSumRows * inner, end - at);  // whole rows: end is a row end
        add_rows_in_order(reader.window(at, len), len / inner, inner, part);
        at += len;
      }
      return;
    }
    int64_t k = 0;  // the output of the element at `at`
    for (int64_t at = begin; at < end;) {
      const int64_t len = std::min(kRun, end - at);
      const T* v = reader.window(at, len);
      for (int64_t i = 0; i < len;) {
        const int64_t n = std::min(inner - k, len - i);
        for (int64_t j = 0; j < n; ++j) R::fold(part[k + j], v[i + j]);
        i += n;
        k += n;
        if (k == inner) k = 0;
      }
      at += len;
    }
  });
}

// A reduction's operand after simplifying: size-1 dimensions dropped and neighbours with the
// same reduced/kept status merged, the innermost dimension apart.
struct Layout {
  bool inner_reduced = true;
  int64_t inner = 1;  // the innermost dimension's size
  Dims kept, red;     // the outer dimensions, split by status
  int64_t n_red = 1;  // elements folded into each output
};

Layout layout_of(const Shape& shape, const std::vector<int64_t>& axes) {
  auto strides = contiguous_strides(shape);
  Dims dims;
  SmallVector<bool, 8> reduced;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool r = std::binary_search(axes.begin(), axes.end(), static_cast<int64_t>(d));
    if (!dims.empty() && reduced.back() == r) {
      dims.back().size *= shape[d];
      dims.back().stride = strides[d];
    } else {
      dims.push_back({shape[d], strides[d]});
      reduced.push_back(r);
    }
  }
  Layout l;
  l.inner_reduced = dims.empty() || reduced.back();
  l.inner = dims.empty() ? 1 : dims.back().size;
  if (!dims.empty()) {
    dims.pop_back();
    reduced.pop_back();
  }
  for (std::size_t d = 0; d < dims.size(); ++d) (reduced[d] ? l.red : l.kept).push_back(dims[d]);
  l.n_red = count_of(l.red) * (l.inner_reduced ? l.inner : 1);
  return l;
}

// Few outputs, kept innermost, over many contiguous rows of them (reduce_rows_in_chunks).
bool rows_in_chunks(const Layout& l) {
  return !l.inner_reduced && l.kept.empty() && l.red.size() == 1 && l.red[0].stride == l.inner &&
         l.inner <= kFewOutputs && l.n_red * l.inner >= kChunkElems;
}

template <class T, class R>
void reduce_typed(const Operand<T>& x, const Shape& shape, const std::vector<int64_t>& axes,
                  const TensorView& out) {
  using Acc = typename R::Acc;
  T* po = out.as<T>();
  const Layout layout = layout_of(shape, axes);
  const bool inner_reduced = layout.inner_reduced;
  const int64_t inner = layout.inner;
  const Dims& kept = layout.kept;
  const Dims& red = layout.red;
  const int64_t n_out = out.numel();
  const int64_t n_red = layout.n_red;
  if (n_out == 0) return;

  // Also where the runs are short but there are many of them: per-channel statistics over
  // small NCHW planes ([32, 512, 4, 4]: runs of 16), which the per-output loop below would read
  // run by run, evaluating a prologue 16 elements at a time (1 MB took 350 us with one, 90 in
  // chunks).
  const bool short_runs = !red.empty() && inner < kRun && n_out * n_red >= kChunkElems;
  if (inner_reduced && n_out <= kFewOutputs && shape.size() <= kMaxChunkRank &&
      (n_red >= kChunkElems || short_runs)) {
    reduce_in_chunks<T, R>(x, shape, axes, inner, n_out, po);
    return;
  }
  if (inner_reduced && red.empty()) {
    // Each output folds one contiguous row (a softmax's row maximum and sum): a task reads its
    // rows in order, a prologue evaluated over pieces of many rows rather than run by run.
    const int64_t grain = std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(n_red, 1));
    parallel_range(n_out, grain, [&](int64_t b, int64_t e) {
      PieceReader<T> reader(x, e * inner);
      for (int64_t o = b; o < e; ++o) {
        Acc acc = R::init();
        for (int64_t i = 0; i < inner; i += kRun) {
          const int64_t len = std::min(kRun, inner - i);
          R::fold_run(acc, reader.window(o * inner + i, len), len);
        }
        po[o] = R::finish(acc, n_red);
      }
    });
    return;
  }
  if (inner_reduced) {
    const int64_t grain = std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(n_red, 1));
    parallel_range(n_out, grain, [&](int64_t b, int64_t e) {
      Odometer od(red);
      std::array<T, kRun> tmp;
      const int64_t outer_count = n_red == 0 ? 0 : count_of(red);
      for (int64_t o = b; o < e; ++o) {
        const int64_t base = kept_offset(o, kept);
        Acc acc = R::init();
        od.reset();
        for (int64_t k = 0; k < outer_count; ++k, od.next()) {
          for (int64_t i = 0; i < inner; i += kRun) {
            const int64_t len = std::min(kRun, inner - i);
            R::fold_run(acc, x.run(base + od.offset() + i, len, tmp.data()), len);
          }
        }
        po[o] = R::finish(acc, n_red);
      }
    });
    return;
  }

  if (rows_in_chunks(layout)) {
    reduce_rows_in_chunks<T, R>(std::span(&x, 1), n_red, inner, po);
    return;
  }

  // Kept innermost, each prefix's reduced rows one contiguous span (a global average pool over
  // a channels-last [N, H, W, C]) and the operand a prologue: a task reads a prefix's rows in
  // order through a PieceReader, so the prologue is evaluated over many rows at once rather
  // than row by row. Each output folds its rows in the same order as the loop below.
  const bool rows_contiguous =
      red.size() == 1 && red[0].stride == inner &&
      (kept.empty() || (kept.size() == 1 && kept[0].stride == n_red * inner));
  if (x.prologue && rows_contiguous && inner <= kBlock) {
    const int64_t prefixes = n_out / inner;
    const int64_t span = n_red * inner;
    const int64_t grain = std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(span, 1));
    parallel_range(prefixes, grain, [&](int64_t b, int64_t e) {
      std::array<Acc, kBlock> acc;
      for (int64_t prefix = b; prefix < e; ++prefix) {
        PieceReader<T> reader(x, (prefix + 1) * span);
        std::fill(acc.begin(), acc.begin() + inner, R::init());
        for (int64_t r = 0; r < n_red; ++r) {
          const T* row = reader.window(prefix * span + r * inner, inner);
          for (int64_t k = 0; k < inner; ++k) R::fold(acc[k], row[k]);
        }
        T* dst = po + prefix * inner;
        for (int64_t k = 0; k < inner; ++k) dst[k] = R::finish(acc[k], n_red);
      }
    });
    return;
  }

  // Kept innermost: output o = prefix * inner + k; a task folds a block of k for one prefix.
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  const int64_t tasks = (n_out / inner) * blocks;
  const int64_t grain =
      std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(n_red * kBlock, 1));
  parallel_range(tasks, grain, [&](int64_t b, int64_t e) {
    Odometer od(red);
    std::array<Acc, kBlock> acc;
    std::array<T, kBlock> tmp;
    for (int64_t t = b; t < e; ++t) {
      const int64_t prefix = t / blocks;
      const int64_t k0 = (t % blocks) * kBlock;
      const int64_t kn = std::min(kBlock, inner - k0);
      const int64_t base = kept_offset(prefix, kept) + k0;
      std::fill(acc.begin(), acc.begin() + kn, R::init());
      od.reset();
      for (int64_t r = 0; r < n_red; ++r, od.next()) {
        const T* row = x.run(base + od.offset(), kn, tmp.data());
        for (int64_t k = 0; k < kn; ++k) R::fold(acc[k], row[k]);
      }
      T* dst = po + prefix * inner + k0;
      for (int64_t k = 0; k < kn; ++k) dst[k] = R::finish(acc[k], n_red);
    }
  });
}

template <class T>
void argmax_typed(int64_t outer, int64_t size, int64_t inner, const T* px, int64_t* po) {
  // Blocks of neighbouring inner positions advance together so rows are read in order.
  const int64_t block = std::min(inner, kBlock);
  const int64_t blocks = (inner + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / (size * block));
  parallel_range(outer * blocks, grain, [&](int64_t b, int64_t e) {
    std::array<T, kBlock> best;
    std::array<int64_t, kBlock> arg;
    for (int64_t t = b; t < e; ++t) {
      const int64_t o = t / blocks, k0 = (t % blocks) * block;
      const int64_t kn = std::min(block, inner - k0);
      const T* base = px + o * size * inner + k0;
      std::copy(base, base + kn, best.begin());
      std::fill(arg.begin(), arg.begin() + kn, 0);
      for (int64_t r = 1; r < size; ++r) {
        const T* row = base + r * inner;
        for (int64_t k = 0; k < kn; ++k) {
          // Strictly greater, so the first maximum wins; a NaN counts as the maximum, as in
          // torch.argmax, and the first NaN stays.
          if (!is_nan(best[k]) && (is_nan(row[k]) || row[k] > best[k])) {
            best[k] = row[k];
            arg[k] = r;
          }
        }
      }
      std::copy(arg.begin(), arg.begin() + kn, po + o * inner + k0);
    }
  });
}

// Runs reduction `op` over `x` of dtype `dtype`: Sum and Max on every numeric dtype, Mean on
// floating point.
void reduce_operand(Op op, const ir::Attr& attr, DType dtype, const Shape& shape,
                    const void* data, const ir::Fusion* prologue,
                    std::span<const TensorView> prologue_in, const TensorView& out,
                    const FusedCode* code = nullptr) {
  const auto& axes = attr.get<ir::AxesAttr>().axes;
  assert(std::is_sorted(axes.begin(), axes.end()) && "reduce: axes must be sorted");
  auto run = [&](auto tag, auto reducer) {
    using T = typename decltype(tag)::type;
    using R = typename decltype(reducer)::type;
    Operand<T> x{static_cast<const T*>(data), prologue, prologue_in, code};
    reduce_typed<T, R>(x, shape, axes, out);
  };
  switch (op) {
    case Op::Sum:
      return visit_numeric("sum", dtype, [&](auto tag) {
        run(tag, TypeTag<SumOp<typename decltype(tag)::type>>{});
      });
    case Op::Mean:
      return visit_float("mean", dtype, [&](auto tag) {
        run(tag, TypeTag<MeanOp<typename decltype(tag)::type>>{});
      });
    case Op::Max:
      return visit_numeric("amax", dtype, [&](auto tag) {
        run(tag, TypeTag<MaxOp<typename decltype(tag)::type>>{});
      });
    // run_kernel sends only the three reductions above (ArgMax has argmax_kernel).
    case Op::DeviceData: case Op::Constant: case Op::Iota: case Op::RandUniform:
    case Op::RandNormal: case Op::Neg: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt:
    case Op::Abs: case Op::Relu: case Op::Sigmoid: case Op::Tanh: case Op::Silu: case Op::Gelu:
    case Op::GeluTanh: case Op::Erf: case Op::Sin: case Op::Cos: case Op::LogicalNot:
    case Op::Cast: case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow:
    case Op::Maximum: case Op::Minimum: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le:
    case Op::Gt: case Op::Ge: case Op::Where: case Op::ArgMax: case Op::Reshape:
    case Op::Permute: case Op::Slice: case Op::Expand: case Op::Pad: case Op::Concat:
    case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Im2col: case Op::Gather: case Op::IndexSelect:
    case Op::ScatterAdd: case Op::OneHot: case Op::Count_:
      break;
  }
  LOOM_UNREACHABLE("reduce_kernel: not a reduction");
}

}  // namespace

void reduce_kernel(Op op, const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  reduce_operand(op, attr, x.dtype, x.shape, x.data, nullptr, {}, out);
}

void fused_reduce_kernel(Op op, const ir::Attr& attr, const ir::Fusion& prologue,
                         std::span<const TensorView> in, const TensorView& out,
                         const FusedCode* code) {
  reduce_operand(op, attr, prologue.compute, prologue.shape, nullptr, &prologue, in, out, code);
}

// Where reduce_rows_in_chunks takes several operands together.
bool stacks(const Layout& l) { return rows_in_chunks(l) && fixed_rows(l.inner); }

bool reads_stacked(const Shape& shape, const std::vector<int64_t>& axes) {
  return stacks(layout_of(shape, axes));
}

int rows_fold_width(const Shape& shape, const std::vector<int64_t>& axes) {
  const Layout l = layout_of(shape, axes);
  return rows_in_chunks(l) && fixed_rows(l.inner) ? static_cast<int>(l.inner) : 0;
}

void stacked_reduce_kernel(Op op, const ir::Attr& attr,
                           std::span<const ir::Fusion* const> prologues,
                           std::span<const FusedCode* const> codes,
                           std::span<const TensorView> in, const TensorView& out,
                           const StackedFold* fold) {
  assert(!prologues.empty() && codes.size() == prologues.size());
  const ir::Fusion& first = *prologues[0];
  const auto& axes = attr.get<ir::AxesAttr>().axes;
  const auto k = static_cast<int64_t>(prologues.size());
  auto run = [&](auto tag, auto reducer) {
    using T = typename decltype(tag)::type;
    using R = typename decltype(reducer)::type;
    SmallVector<Operand<T>, 4> xs;  // no allocation in a steady step
    for (int64_t j = 0; j < k; ++j) xs.push_back({nullptr, prologues[j], in, codes[j]});
    const Layout l = layout_of(first.shape, axes);
    if (stacks(l) && out.numel() > 0) {
      reduce_rows_in_chunks<T, R>(std::span<const Operand<T>>(xs.begin(), xs.end()), l.n_red,
                                  l.inner, out.as<T>(), fold);
      return;
    }
    // Elsewhere one after another, each into its row of the result.
    const Shape row(out.shape.begin() + 1, out.shape.end());
    const int64_t n = shape_numel(row);
    for (int64_t j = 0; j < k; ++j)
      reduce_typed<T, R>(xs[j], first.shape, axes, {out.as<T>() + j * n, out.dtype, row});
  };
  visit_float(ir::op_name(op), first.compute, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (op == Op::Sum) run(tag, TypeTag<SumOp<T>>{});
    else if (op == Op::Mean) run(tag, TypeTag<MeanOp<T>>{});
    else LOOM_UNREACHABLE("stacked_reduce_kernel: only sums and means are stacked");
  });
}

void argmax_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  auto axis = static_cast<std::size_t>(attr.get<ir::DimAttr>().dim);
  const int64_t outer = dims_product(x.shape, 0, axis);
  const int64_t size = x.shape[axis];
  const int64_t inner = dims_product(x.shape, axis + 1, x.shape.size());
  if (outer * inner == 0 || size == 0) return;  // shape inference rejects an empty axis
  visit_numeric("argmax", x.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    argmax_typed<T>(outer, size, inner, x.as<const T>(), out.as<int64_t>());
  });
}

}  // namespace loom::runtime
