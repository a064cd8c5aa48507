// Compute kernels: batched matmul, conv2d, and direct-loop pooling.
// matmul runs on oneDNN from 128^3 multiply-adds on (matmul_on_onednn below), on Eigen's GEMM
// below that, in float64 and with deterministic algorithms. conv2d picks its algorithm by pass,
// dtype and shape (conv_algorithm, conv/conv_algorithm.h): oneDNN (onednn.h) for most strided
// convs, bfloat16 and ResNet-18's 4x4 planes; loom's float32 kernels for the stride-1 3x3 convs
// (Winograd F(2x2, 3x3) from 64 channels, conv_winograd.h; the direct AVX-512 kernels below,
// conv_direct.h) and the narrowest strided 1x1 convs (the direct kernels by phases);
// im2col + Eigen GEMM for the rest (float64, dilations, builds without AVX-512), whose 1x1
// stride-1 convs skip the im2col. A bfloat16 op that does not go to oneDNN runs on the
// float32 kernels on widened operands (run_widened, kernels_impl.h). Eigen runs
// single-threaded (conv_common.h); TBB splits the work above it: (batch, row block, column
// block) for matmul, (image, group, column block) for conv2d, (image, channel) for pooling;
// oneDNN runs on its own OpenMP threads. A bias/activation epilogue (compiler/fuse_epilogue.h)
// runs on each matmul block right after its GEMM, on each conv output plane after the conv,
// and as post-ops (bias, relu) on oneDNN.
#include "runtime/cpu/kernels_impl.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/conv/conv_common.h"
#include "runtime/cpu/conv/conv_direct.h"
#include "runtime/cpu/conv/conv_tuning.h"
#include "runtime/cpu/conv/conv_winograd.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/kernels_fused.h"
#include "runtime/cpu/onednn.h"

#include <loom/lazy.h>

#include <Eigen/Core>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace loom::runtime {
namespace {

// Multiply-adds per TBB task below which splitting costs more than it saves.
constexpr int64_t kMinTaskFlops = 1 << 18;
// A matmul's tasks under deterministic algorithms, whatever the thread count (matmul_typed).
constexpr int64_t kDeterministicTasks = 8;

int64_t thread_count() { return std::max(1, tbb::this_task_arena::max_concurrency()); }

// c [rows, cols] (rows n apart) = rows [r0, r0+rows) of A [m, k] times columns
// [c0, c0+cols) of B [k, n], where A is stored transposed ([k, m]) when ta, B when tb: Eigen
// packs a transposed view at the cost of a plain one.
template <class T>
void gemm_block(bool ta, bool tb, const T* pa, const T* pb, T* pc, int64_t m, int64_t k,
                int64_t n, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  gemm(ta, tb, rows, cols, k, pa + (ta ? r0 : r0 * k), ta ? m : k, pb + (tb ? c0 * k : c0),
       tb ? k : n, pc + r0 * n + c0, n, false);
}

// c [rows, cols] (rows ld apart) = act(c + bias), act Count_ for none, bias (if any) read at
// r * bias_row + j * bias_col: the epilogue of a GEMM or conv (compiler/fuse_epilogue.h) on a
// block it has just written. The add and then the activation, per element, as the elementwise
// kernels would do them, so folding the epilogue in changes no bits.
template <class T>
void apply_epilogue(T* c, int64_t rows, int64_t cols, int64_t ld, const T* bias, int64_t bias_row,
                    int64_t bias_col, ir::Op act) {
  alignas(64) T buf[kFusedBlock];
  for (int64_t r = 0; r < rows; ++r) {
    T* row = c + r * ld;
    const T* b = bias ? bias + r * bias_row : nullptr;
    for (int64_t j0 = 0; j0 < cols; j0 += kFusedBlock) {
      const int64_t len = std::min(kFusedBlock, cols - j0);
      T* x = row + j0;
      if (act == ir::Op::Count_) {
        if (b)
          for (int64_t j = 0; j < len; ++j) x[j] += b[(j0 + j) * bias_col];
        continue;
      }
      if (b) {
        for (int64_t j = 0; j < len; ++j) buf[j] = x[j] + b[(j0 + j) * bias_col];
      } else {
        std::copy(x, x + len, buf);
      }
      unary_step<T>(act, buf, x, len);
    }
  }
}

// MatmulAttr: whether an operand is stored transposed (compiler/fold_transpose.cpp). With a bias (n values) or an activation, each task applies
// them to its block of the result right after its GEMM wrote it, while the block is in cache.
template <class T>
void matmul_typed(const ir::Attr& attr, const TensorView& a, const TensorView& b,
                  const TensorView& out, const T* bias = nullptr,
                  ir::Op act = ir::Op::Count_) {
  const bool epilogue = bias || act != ir::Op::Count_;
  const bool ta = attr.get<ir::MatmulAttr>().transpose_a;
  const bool tb = attr.get<ir::MatmulAttr>().transpose_b;
  const std::size_t r = a.shape.size();
  const int64_t m = a.shape[r - (ta ? 1 : 2)], k = a.shape[r - (ta ? 2 : 1)];
  const int64_t n = b.shape[r - (tb ? 2 : 1)];
  const int64_t batch = dims_product(a.shape, 0, r - 2);
  const T* pa = a.as<const T>();
  const T* pb = b.as<const T>();
  T* pc = out.as<T>();
  if (batch * m * n == 0) return;
  if (k == 0) {
    std::fill(pc, pc + batch * m * n, T(0));
    if (epilogue) apply_epilogue(pc, batch * m, n, n, bias, 0, 1, act);
    return;
  }
  // Tasks are (batch, block of rows, block of columns): two per thread (one with a single
  // thread), none below kMinTaskFlops. Each task is its own Eigen GEMM, which packs its block
  // of A and of B, so the split is the one that packs the fewest elements: rows for a wide B,
  // columns for a tall A, both for a large square product. Which of Eigen's micro-kernels sums
  // an element (three, two or one vector of rows at a time; the one-vector kernel sums even and
  // odd k apart) depends on where the element falls in its block, so under deterministic
  // algorithms the blocks are cut for kDeterministicTasks whatever the thread count (on AVX2 a
  // [512, 384] product by 2048 gave other bits on one thread than on two).
  const int64_t flops = batch * m * k * n;
  const int64_t threads = thread_count();
  const int64_t most = are_deterministic_algorithms_enabled() ? kDeterministicTasks
                       : threads == 1                         ? 1
                                                              : threads * 2;
  const int64_t want = std::clamp<int64_t>(flops / kMinTaskFlops, 1, most);
  const int64_t per_batch = (want + batch - 1) / batch;
  int64_t row_blocks = 1, col_blocks = 1;
  double best = -1;
  for (int64_t rb = 1; rb <= std::min(per_batch, std::max<int64_t>(1, m / 8)); ++rb) {
    const int64_t cb =
        std::clamp<int64_t>((per_batch + rb - 1) / rb, 1, std::max<int64_t>(1, n / 128));
    const double packed = double(rb) * double(k * n) + double(cb) * double(m * k);
    if (best < 0 || packed < best) {
      best = packed;
      row_blocks = rb;
      col_blocks = cb;
    }
  }
  const int64_t rows_per = (m + row_blocks - 1) / row_blocks;
  const int64_t cols_per = (n + col_blocks - 1) / col_blocks;
  const int64_t grain = std::max<int64_t>(1, kMinTaskFlops / (rows_per * k * cols_per));
  parallel_range(batch * row_blocks * col_blocks, grain, [&](int64_t s, int64_t e) {
    for (int64_t t = s; t < e; ++t) {
      const int64_t bi = t / (row_blocks * col_blocks);
      const int64_t r0 = (t / col_blocks % row_blocks) * rows_per;
      const int64_t c0 = (t % col_blocks) * cols_per;
      const int64_t rows = std::min(rows_per, m - r0), cols = std::min(cols_per, n - c0);
      if (rows <= 0 || cols <= 0) continue;
      gemm_block(ta, tb, pa + bi * m * k, pb + bi * k * n, pc + bi * m * n, m, k, n, r0, rows,
                 c0, cols);
      if (epilogue)
        apply_epilogue(pc + bi * m * n + r0 * n + c0, rows, cols, n, bias ? bias + c0 : nullptr,
                       0, 1, act);
    }
  });
}

// Calls f(plane_in, plane_out) for each (image, channel) plane, in parallel.
template <class T, class F>
void for_each_plane(const PoolGeometry& g, const TensorView& x, const TensorView& out, F f) {
  const T* px = x.as<const T>();
  T* po = out.as<T>();
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(1, g.h * g.w));
  parallel_range(g.planes, grain, [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) f(px + p * g.h * g.w, po + p * g.oh * g.ow);
  });
}

}  // namespace

// On the GEMM path, tasks are (image, group, block of output positions):
// out_g = W_g * im2col(input_g), the im2col skipped where the input already is that matrix.
template <class T>
void conv2d_forward(const ConvGeometry& g, const T* px, const T* pw, T* po, ConvPass pass) {
  if constexpr (std::is_same_v<T, float>) {
    switch (own_conv_algorithm(g, pass)) {
      case ConvAlgorithm::kWinograd:
        if (conv2d_winograd(g, px, pw, po)) return;
        break;
      case ConvAlgorithm::kDirect:
        if (conv2d_direct(g, px, pw, po)) return;
        break;
      case ConvAlgorithm::kGemm:
      case ConvAlgorithm::kOneDnn: break;  // never among loom's own
    }
    if (conv2d_strided(g, px, pw, po)) return;
  }
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t rows = cg * g.kh * g.kw;  // the GEMM's inner dimension
  const int64_t positions = g.oh * g.ow;
  // Split output positions into column blocks only when images x groups leave threads idle.
  const int64_t units = g.n * g.groups;
  int64_t blocks = std::max<int64_t>(1, (thread_count() * 2 + units - 1) / units);
  blocks = std::min(blocks, std::max<int64_t>(1, positions / 64));
  const int64_t cols_per = (positions + blocks - 1) / blocks;
  parallel_range(units * blocks, 1, [&](int64_t s, int64_t e) {
    for (int64_t t = s; t < e; ++t) {
      const int64_t img = t / (g.groups * blocks);
      const int64_t grp = (t / blocks) % g.groups;
      const int64_t p0 = (t % blocks) * cols_per, p1 = std::min(positions, p0 + cols_per);
      if (p0 >= p1) continue;
      const T* in = px + (img * g.c + grp * cg) * g.h * g.w;
      const T* col = in + p0;
      int64_t col_stride = positions;
      if (!pointwise(g)) {
        T* buf = scratch<T>(rows * (p1 - p0), Scratch::kTaskInput);
        im2col(px + img * g.c * g.h * g.w, g, grp * cg, cg, p0, p1, buf);
        col = buf;
        col_stride = p1 - p0;
      }
      gemm(false, false, og, p1 - p0, rows, pw + grp * og * rows, rows, col, col_stride,
           po + (img * g.o + grp * og) * positions + p0, positions, false);
    }
  });
}

template void conv2d_forward<float>(const ConvGeometry&, const float*, const float*, float*,
                                    ConvPass);
template void conv2d_forward<double>(const ConvGeometry&, const double*, const double*, double*,
                                     ConvPass);

namespace {

// Whether a matmul runs on oneDNN rather than Eigen: LOOM_MATMUL=onednn|eigen forces it (read
// once; for measurements); by default oneDNN from kMinOneDnnMatmul multiply-adds on, where
// kernel_bench (BM_Matmul, the decoder's products; 2-core AMD EPYC shared with other jobs)
// measured it 1.19 to 1.45x faster than Eigen in float32 and 2.5 to 3.3x in bfloat16 (against
// Eigen on widened operands), and 1.17x (2x in bfloat16) at 128^3. Below, oneDNN's ~10 us per
// call (waking its OpenMP team) loses: 64^3 and the ResNets' classifiers run 1.5 to 4x faster
// on Eigen. Deterministic algorithms keep Eigen: oneDNN's GEMM splits k across threads where
// m x n is small (onednn_test's DeterministicMatmulIndependentOfThreadCount). Below AVX-512
// oneDNN has no bfloat16 GEMM (onednn::bfloat16_supported): Eigen runs it on widened operands.
// On an AVX2 CPU (2-core EPYC Zen 3, 2026-11-28; a shared machine whose kernel timings moved
// 20-30% between runs) three alternatives to oneDNN's float32 GEMM were measured at the
// decoder's products and not kept: a packed GEMM of loom's own (a 6 x 16 register tile of FMAs
// over B packed in 16-column panels), at the FMA loop's rate on one core with its operands in
// L1 but 0.86 to 1.1x oneDNN over whole products on two cores (with A read in place or
// packed, whichever was better per shape); Debian's OpenBLAS 0.3.21
// (OpenMP build), within noise of oneDNN except the q/k/v/o weight gradient; and copying a
// transposed A untransposed first (oneDNN's reorder), no faster on two cores. That weight
// gradient, [512, 2048]^T x [2048, 512] (kernel_bench's row; A's stored rows 2 KB apart), is
// oneDNN's weak shape there: 45-50 GFLOP/s on one core against 78 at m = 520, 67-89 on two
// against 115-140 for the decoder's other products (OpenBLAS: 114). Both operands' strides
// matter there: onednn::matmul_read_strides pads them (a copy of each), 12.4-13.5 -> 9.1-10.1 ms.
// A fourth, Debian's BLIS 0.9 (libblis-openmp-dev, its zen3 kernels, bli_sgemm on two OpenMP
// threads; a standalone driver alternating it with oneDNN's matmul call by call, medians of 10,
// 2026-11-29, two runs): even with oneDNN from 640 x 512 outputs on (0.92 to 1.05: the
// SwiGLU and vocabulary products, 2048^3), 1.09 to 1.13x on the [2048, 512] x [512, 512]
// projections and 1.37 to 1.46x on their weight gradient as stored (which the padding above
// already takes). About 1% of a decoder step: not worth a fourth library and thread pool.
constexpr int64_t kMinOneDnnMatmul = int64_t{1} << 21;  // 128^3

enum class MatmulChoice { kDefault, kOneDnn, kEigen };

MatmulChoice forced_matmul() {
  static const MatmulChoice forced = [] {
    const char* v = std::getenv("LOOM_MATMUL");
    if (!v) return MatmulChoice::kDefault;
    if (std::strcmp(v, "onednn") == 0) return MatmulChoice::kOneDnn;
    if (std::strcmp(v, "eigen") == 0) return MatmulChoice::kEigen;
    throw Error(std::string("LOOM_MATMUL: expected onednn or eigen, got '") + v + "'");
  }();
  return forced;
}

bool matmul_on_onednn(const onednn::MatmulShape& s, DType dtype) {
  if (are_deterministic_algorithms_enabled()) return false;
  if (dtype == DType::BFloat16 && !onednn::bfloat16_supported()) return false;
  switch (forced_matmul()) {
    case MatmulChoice::kOneDnn: return true;
    case MatmulChoice::kEigen: return false;
    case MatmulChoice::kDefault: break;
  }
  return s.batch * s.m * s.n * s.k >= kMinOneDnnMatmul;
}

onednn::MatmulShape matmul_shape(const ir::Attr& attr, const TensorView& a, const TensorView& b) {
  const auto& m = attr.get<ir::MatmulAttr>();
  const std::size_t r = a.shape.size();
  return {.batch = dims_product(a.shape, 0, r - 2),
          .m = a.shape[r - (m.transpose_a ? 1 : 2)],
          .n = b.shape[r - (m.transpose_b ? 2 : 1)],
          .k = a.shape[r - (m.transpose_a ? 2 : 1)],
          .ta = m.transpose_a,
          .tb = m.transpose_b};
}

// A matmul on oneDNN, with the bias and relu of its epilogue as post-ops and another
// activation applied after, as the Eigen path would (the bias then already added).
void matmul_onednn(const onednn::MatmulShape& s, const TensorView& a, const TensorView& b,
                   const TensorView& out, const float* bias, ir::Op act) {
  const bool relu = act == ir::Op::Relu;
  onednn::matmul(s, out.dtype, a.data, b.data, out.data, {bias, relu});
  if (act != ir::Op::Count_ && !relu)
    apply_epilogue<float>(out.as<float>(), s.batch * s.m, s.n, s.n, nullptr, 0, 0, act);
}

// The conv's bias and activation as one parallel pass over the result, one (image, channel)
// plane at a time.
template <class T>
void conv_epilogue(const TensorView& out, const T* bias, ir::Op act) {
  const int64_t channels = out.shape[1], plane = out.shape[2] * out.shape[3];
  const int64_t planes = out.shape[0] * channels;
  if (planes * plane == 0) return;
  T* po = out.as<T>();
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / plane);
  parallel_range(planes, grain, [&](int64_t s, int64_t e) {
    for (int64_t q = s; q < e; ++q)
      apply_epilogue(po + q * plane, 1, plane, plane, bias ? bias + q % channels : nullptr, 0, 0,
                     act);
  });
}

// conv2d forward in any dtype: oneDNN where nchw_conv_kernel picks it (with the bias and relu of
// an epilogue as post-ops), loom's kernels otherwise (bfloat16 widened to them); an epilogue
// that oneDNN did not take runs after, as conv_epilogue.
void conv2d_dispatch(const ir::Attr& attr, const TensorView& x, const TensorView& w,
                     const TensorView& out, const TensorView* bias, ir::Op act) {
  const float* pb = bias ? bias->as<const float>() : nullptr;
  const bool post_ops = act == ir::Op::Relu || act == ir::Op::Count_;  // what oneDNN takes
  if (attr.get<ir::Conv2dAttr>().channels_last) {  // [N,Ho,Wo,O]: the bias runs along rows
    conv2d_channels_last(ConvPass::kForward, attr.get<ir::Conv2dAttr>(), x, w, out,
                         post_ops ? pb : nullptr, act == ir::Op::Relu);
    if (!post_ops) {
      const int64_t channels = out.shape[3], rows = out.numel() / std::max<int64_t>(1, channels);
      const int64_t grain = std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(1, channels));
      parallel_range(rows, grain, [&](int64_t s, int64_t e) {
        apply_epilogue(out.as<float>() + s * channels, e - s, channels, channels, pb, 0, 1, act);
      });
    }
    return;
  }
  const ConvGeometry g = conv_geometry(attr.get<ir::Conv2dAttr>(), x.shape, w.shape, out.shape);
  if (out.numel() == 0) return;
  const auto run = [&](ConvKernel kernel) {
    if (kernel == ConvKernel::kOneDnn) {
      onednn::conv2d(ConvPass::kForward, g, out.dtype,
                     onednn::conv_layout(g, ConvPass::kForward, out.dtype), x.data, w.data,
                     out.data,
                     post_ops ? onednn::Epilogue{pb, act == ir::Op::Relu} : onednn::Epilogue{});
      if (!post_ops) conv_epilogue<float>(out, pb, act);
    } else if (out.dtype == DType::BFloat16) {  // epilogues are float (fuse_epilogue.h)
      run_widened(x, w, out, [&](const float* px, const float* pw, float* po) {
        conv2d_forward<float>(g, px, pw, po, ConvPass::kForward);
      });
    } else {
      visit_float("conv2d", out.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        conv2d_forward<T>(g, x.as<const T>(), w.as<const T>(), out.as<T>(), ConvPass::kForward);
        if (bias || act != ir::Op::Count_)
          conv_epilogue<T>(out, bias ? bias->as<const T>() : nullptr, act);
      });
    }
    return true;
  };
  run(nchw_conv_kernel(g, ConvPass::kForward, out.dtype, true, bias || act != ir::Op::Count_,
                       run));
}

}  // namespace

void matmul_kernel(const ir::Attr& attr, const TensorView& a, const TensorView& b,
                   const TensorView& out) {
  if (out.dtype != DType::Float64) {
    const onednn::MatmulShape s = matmul_shape(attr, a, b);
    if (s.batch * s.m * s.n != 0 && s.k != 0 && matmul_on_onednn(s, out.dtype))
      return matmul_onednn(s, a, b, out, nullptr, ir::Op::Count_);
    if (out.dtype == DType::BFloat16)
      return run_widened(a, b, out, [&](const float* pa, const float* pb, float* pc) {
        matmul_typed<float>(attr, {const_cast<float*>(pa), DType::Float32, a.shape},
                            {const_cast<float*>(pb), DType::Float32, b.shape},
                            {pc, DType::Float32, out.shape});
      });
  }
  visit_float("matmul", out.dtype, [&](auto tag) {
    matmul_typed<typename decltype(tag)::type>(attr, a, b, out);
  });
}

void conv2d_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& w,
                   const TensorView& out) {
  conv2d_dispatch(attr, x, w, out, nullptr, ir::Op::Count_);
}

// Epilogues are float32 or float64 (compiler/fuse_epilogue.h). The conv's runs as a second
// parallel pass over the result (conv_epilogue) rather than inside each algorithm's tiling,
// except on oneDNN, which takes a bias and relu as post-ops.
void epilogue_kernel(ir::Op op, const ir::Attr& attr, const ir::Epilogue& epilogue,
                     std::span<const TensorView> in, const TensorView& out) {
  const TensorView* bias = epilogue.bias >= 0 ? &in[epilogue.bias] : nullptr;
  const ir::Op act = epilogue.activation;
  if (op == ir::Op::Conv2d) return conv2d_dispatch(attr, in[0], in[1], out, bias, act);
  assert(op == ir::Op::Matmul && "epilogue_kernel: a Matmul or a Conv2d");
  if (out.dtype == DType::Float32) {
    const onednn::MatmulShape s = matmul_shape(attr, in[0], in[1]);
    if (s.batch * s.m * s.n != 0 && s.k != 0 && matmul_on_onednn(s, out.dtype))
      return matmul_onednn(s, in[0], in[1], out, bias ? bias->as<const float>() : nullptr, act);
  }
  visit_float(ir::op_name(op), out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    matmul_typed<T>(attr, in[0], in[1], out, bias ? bias->as<const T>() : nullptr, act);
  });
}

void max_pool2d_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  const PoolGeometry g = pool_geometry(attr.get<ir::Pool2dAttr>(), x.shape, out.shape);
  visit_float("max_pool2d", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_plane<T>(g, x, out, [&](const T* in, T* o) {
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          // Padding is skipped, never read as a value, so it cannot win.
          const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
          T best = -std::numeric_limits<T>::infinity();
          for (int64_t y = std::max<int64_t>(y0, 0); y < std::min(y0 + g.kh, g.h); ++y)
            for (int64_t xx = std::max<int64_t>(x0, 0); xx < std::min(x0 + g.kw, g.w); ++xx) {
              const T v = in[y * g.w + xx];
              // NaN propagates as in PyTorch: once best is NaN, v > best is false.
              if (v > best || std::isnan(v)) best = v;
            }
          o[oy * g.ow + ox] = best;
        }
    });
  });
}

void avg_pool2d_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& out) {
  const auto& a = attr.get<ir::Pool2dAttr>();
  const PoolGeometry g = pool_geometry(a, x.shape, out.shape);
  const bool count_include_pad = a.count_include_pad;
  visit_float("avg_pool2d", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_plane<T>(g, x, out, [&](const T* in, T* o) {
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const auto win = avg_window(g, oy, ox, count_include_pad);
          double sum = 0;
          for (int64_t y = win.y0; y < win.y1; ++y)
            for (int64_t xx = win.x0; xx < win.x1; ++xx) sum += in[y * g.w + xx];
          const int64_t count = win.divisor;
          o[oy * g.ow + ox] = count > 0 ? static_cast<T>(sum / static_cast<double>(count)) : T(0);
        }
    });
  });
}

}  // namespace loom::runtime
