// Gradient kernels for the compute ops (kernels_compute.cpp), each the exact adjoint of its
// forward kernel under the same conventions (padding, dilation, groups; the max pool's
// winner; the avg pool's divisor). The conv gradients run on oneDNN where conv_algorithm
// (conv/conv_algorithm.h) picks it, and otherwise:
//   conv2d input:  float32 strided convs on the direct kernels by phases (conv_direct.h)
//                  where direct_chosen says they win; otherwise, with stride 1, a transposed
//                  conv on conv2d_forward (which chooses among loom's own algorithms,
//                  Winograd included); else per (image, group) cols = W_g^T * grad_out_g
//                  (Eigen GEMM), then col2im.
//   conv2d weight: bfloat16 channels-last on loom's vdpbf16ps kernel where
//                  bf16_weight_grad_chosen (conv/conv_weight_bf16.h); float32 as
//                  own_conv_algorithm says: Winograd's adjoint (conv_winograd.h)
//                  for 3x3 stride-1 convs with 64 channels and more, the direct kernels where
//                  they win (narrow channels; strided convs by phases, conv_strided.cpp);
//                  otherwise grad_W_g = the sum over images of (im2col(input)_g *
//                  grad_out_g^T)^T (Eigen GEMM, images side by side).
//   max pool:      each output's gradient goes to the element the forward picked.
//   avg pool:      each output's gradient / the forward's divisor goes to its window.
// loom's kernels' results do not depend on the thread count: work is split by the shapes only
// (never by max_concurrency), every output element is written by one task, and partial sums
// over images are combined in a fixed order. oneDNN's weight gradient splits its sum over
// images by the thread count; deterministic algorithms keep that pass on loom's kernels.
#include "runtime/cpu/kernels_impl.h"

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/conv/conv_common.h"
#include "runtime/cpu/conv/conv_direct.h"
#include "runtime/cpu/conv/conv_matmul.h"
#include "runtime/cpu/conv/conv_tuning.h"
#include "runtime/cpu/conv/conv_weight_bf16.h"
#include "runtime/cpu/conv/conv_winograd.h"
#include "runtime/cpu/conv/conv_winograd_bf16.h"
#include "runtime/cpu/conv/conv_winograd_f32.h"
#include "runtime/cpu/gemm.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cpu/small_vector.h"

#include <loom/error.h>
#include <loom/lazy.h>

#include <Eigen/Core>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace loom::runtime {
namespace {

// Multiply-adds per TBB task below which splitting costs more than it saves.
constexpr int64_t kMinTaskFlops = 1 << 18;
// Tasks to aim for when splitting a conv gradient (a fixed number, not the thread count, so
// that results are the same on any machine).
constexpr int64_t kTargetTasks = 64;
// Tasks to aim for in the weight gradient (blocks of channels, then chunks of images, each
// chunk a partial sum): fewer than kTargetTasks, as each chunk's partial sum is read again,
// and enough to keep a few threads busy.
constexpr int64_t kWeightChunks = 16;
// The weight gradient's GEMMs take images side by side until their inner dimension reaches
// kMinInner positions, with at most kMaxBatchElems elements of im2col at once.
constexpr int64_t kMinInner = 512;
constexpr int64_t kMaxBatchElems = int64_t{1} << 20;
// The GEMM's channel-block dimension is kept at least this wide when splitting channels: in
// the input gradient, and in the weight gradient, which splits images instead below that.
constexpr int64_t kMinBlockRows = 32;
constexpr int64_t kMinWeightBlockRows = 128;
// Upper bound on the elements of per-chunk partial weight gradients.
constexpr int64_t kMaxPartialElems = int64_t{1} << 24;

// Channels per block when splitting a group's cg channels so that `units` independent units
// give about `target` tasks, keeping each block's GEMM dimension >= min_rows.
int64_t channels_per_block(int64_t cg, int64_t taps, int64_t units, int64_t target,
                           int64_t min_rows) {
  int64_t blocks = std::max<int64_t>(1, ceil_div(target, std::max<int64_t>(1, units)));
  blocks = std::min({blocks, cg, std::max<int64_t>(1, cg * taps / min_rows)});
  return ceil_div(cg, std::max<int64_t>(1, blocks));
}

// grad_in [N,C,H,W] from grad_out [N,O,Ho,Wo] and weight [O,C/g,kh,kw]. On the GEMM path,
// tasks are (image, group, block of input channels); each writes its own input channels.
template <class T>
void conv2d_grad_input_typed(const ConvGeometry& g, const T* pgo, const T* pw, T* pgi) {
  if constexpr (std::is_same_v<T, float>)
    if (conv2d_grad_input_strided(g, pgo, pw, pgi)) return;
  if (conv2d_grad_input_stride1(g, pgo, pw, pgi)) return;
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t taps = g.kh * g.kw;
  const int64_t rows = cg * taps;
  const int64_t positions = g.oh * g.ow;
  const int64_t cpb = channels_per_block(cg, taps, g.n * g.groups, kTargetTasks, kMinBlockRows);
  const int64_t blocks = ceil_div(cg, cpb);
  const int64_t task_flops = std::max<int64_t>(1, cpb * taps * og * positions);
  const int64_t grain = std::max<int64_t>(1, kMinTaskFlops / task_flops);
  parallel_range(g.n * g.groups * blocks, grain, [&](int64_t s, int64_t e) {
    for (int64_t t = s; t < e; ++t) {
      const int64_t img = t / (g.groups * blocks);
      const int64_t grp = (t / blocks) % g.groups;
      const int64_t c0 = (t % blocks) * cpb, cn = std::min(cpb, cg - c0);
      T* gi = pgi + img * g.c * g.h * g.w;
      std::fill(gi + (grp * cg + c0) * g.h * g.w, gi + (grp * cg + c0 + cn) * g.h * g.w, T(0));
      if (positions == 0 || og == 0) continue;
      T* col = scratch<T>(cn * taps * positions, Scratch::kTaskInput);
      // W_g is [og, rows]; this block is its columns [c0*taps, (c0+cn)*taps).
      gemm(true, false, cn * taps, positions, og, pw + grp * og * rows + c0 * taps, rows,
           pgo + (img * g.o + grp * og) * positions, positions, col, positions, false);
      col2im_add(col, g, grp * cg + c0, cn, gi);
    }
  });
}

// grad_w [O,C/g,kh,kw] from input [N,C,H,W] and grad_out [N,O,Ho,Wo]. On the GEMM path, a
// task owns a block of input channels of one group and accumulates its block of the gradient,
// transposed: im2col(input) * grad_out^T, which Eigen runs faster than grad_out * im2col^T for
// these shapes. Images go in batches of `batch` side by side, so that the GEMM's inner
// dimension is long even where the planes are small (16 positions at 4x4: a GEMM per image
// would run at a third of the rate). Channel blocks come first; only where they leave threads
// idle are the images also split into chunks, each writing a partial sum that a second pass
// adds up in chunk order.
template <class T>
void conv2d_grad_weight_typed(const ConvGeometry& g, const T* px, const T* pgo, T* pgw) {
  if (g.n == 0 || g.oh * g.ow == 0) {  // an empty sum
    std::fill(pgw, pgw + g.o * (g.c / g.groups) * g.kh * g.kw, T(0));
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    switch (own_conv_algorithm(g, ConvPass::kGradWeight)) {
      case ConvAlgorithm::kWinograd:
        if (conv2d_grad_weight_winograd(g, px, pgo, pgw)) return;
        break;
      case ConvAlgorithm::kDirect:
        if (conv2d_grad_weight_direct(g, px, pgo, pgw)) return;
        break;
      case ConvAlgorithm::kGemm:
      case ConvAlgorithm::kOneDnn: break;  // never among loom's own
    }
    if (conv2d_grad_weight_strided(g, px, pgo, pgw)) return;
  }
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t taps = g.kh * g.kw;
  const int64_t rows = cg * taps;
  const int64_t positions = g.oh * g.ow;
  const int64_t wsize = g.o * rows;
  const int64_t cpb = channels_per_block(cg, taps, g.groups, kWeightChunks, kMinWeightBlockRows);
  const int64_t blocks = ceil_div(cg, cpb);
  const int64_t units = g.groups * blocks;
  int64_t chunks = std::min(g.n, ceil_div(kWeightChunks, units));
  chunks = std::min(chunks, std::max<int64_t>(1, g.n * og * rows * positions / kMinTaskFlops));
  chunks = std::max<int64_t>(1, std::min(chunks, kMaxPartialElems / std::max<int64_t>(1, wsize)));
  const int64_t per_chunk = ceil_div(g.n, chunks);
  chunks = ceil_div(g.n, per_chunk);
  const int64_t batch = std::clamp<int64_t>(
      std::min(ceil_div(kMinInner, positions), kMaxBatchElems / (cpb * taps * positions)), 1,
      per_chunk);
  const int64_t width = batch * positions;  // the GEMM's inner dimension, at most
  const int64_t image_flops = std::max<int64_t>(1, og * cpb * taps * positions);

  T* partial = scratch<T>(chunks > 1 ? chunks * wsize : 0, Scratch::kPartial);
  const int64_t grain = std::max<int64_t>(1, kMinTaskFlops / (image_flops * per_chunk));
  parallel_range(chunks * units, grain, [&](int64_t s, int64_t e) {
    for (int64_t t = s; t < e; ++t) {
      const int64_t chunk = t / units;
      const int64_t grp = (t / blocks) % g.groups;
      const int64_t c0 = (t % blocks) * cpb, cn = std::min(cpb, cg - c0);
      Map<T> acc(scratch<T>(cn * taps * og, Scratch::kTaskAcc), cn * taps, og);
      acc.setZero();
      T* col = scratch<T>(cn * taps * width, Scratch::kTaskInput);
      T* go = scratch<T>(og * width, Scratch::kTaskGrad);
      const int64_t i0 = chunk * per_chunk, i1 = std::min(g.n, i0 + per_chunk);
      for (int64_t b0 = i0; b0 < i1; b0 += batch) {
        const int64_t nb = std::min(batch, i1 - b0), cols = nb * positions;
        for (int64_t k = 0; k < nb; ++k) {
          const int64_t img = b0 + k;
          im2col(px + img * g.c * g.h * g.w, g, grp * cg + c0, cn, 0, positions,
                 col + k * positions, cols);
          const T* src = pgo + (img * g.o + grp * og) * positions;
          for (int64_t o = 0; o < og; ++o)
            std::copy(src + o * positions, src + (o + 1) * positions,
                      go + o * cols + k * positions);
        }
        gemm(false, true, cn * taps, og, cols, col, cols, go, cols, acc.data(), og, true);
      }
      T* dst = chunks > 1 ? partial + chunk * wsize : pgw;
      StridedMap<T>(dst + grp * og * rows + c0 * taps, og, cn * taps, Eigen::OuterStride<>(rows)) =
          acc.transpose();
    }
  });
  if (chunks > 1)
    parallel_range(wsize, kGrainElementwise, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        T acc = partial[i];
        for (int64_t c = 1; c < chunks; ++c) acc += partial[c * wsize + i];
        pgw[i] = acc;
      }
    });
}

// Calls f(plane) for each (image, channel) plane index, in parallel.
template <class F>
void for_each_plane(const PoolGeometry& g, F f) {
  const int64_t grain = std::max<int64_t>(1, kGrainElementwise / std::max<int64_t>(1, g.h * g.w));
  parallel_range(g.planes, grain, [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) f(p);
  });
}

}  // namespace

namespace {

struct ChannelsFirstX;  // thread_scratch tags of the deterministic weight gradient's copies
struct ChannelsFirstGrad;

// The [N,C,H,W] shape of a channels-last [N,H,W,C] one, in a per-thread Shape per `Tag`, so
// a steady step allocates nothing.
template <class Tag>
const Shape& channels_first(const Shape& s) {
  thread_local Shape out(4);
  out[0] = s[0], out[1] = s[3], out[2] = s[1], out[3] = s[2];
  return out;
}

// `v` ([N,H,W,C]) copied to [N,C,H,W] in the calling thread's scratch.
template <class Tag>
TensorView channels_first_copy(const TensorView& v) {
  const std::size_t bytes = static_cast<std::size_t>(v.numel()) * dtype_size(v.dtype);
  TensorView out{thread_scratch<double, Tag>((bytes + 7) / 8), v.dtype, channels_first<Tag>(v.shape)};
  static const ir::Attr to_first = ir::PermuteAttr{{0, 3, 1, 2}};
  permute_kernel(to_first, v, out);
  return out;
}

}  // namespace

namespace {

// Runs pass `pass` of the channels-last conv `g` on `kernel` (the float32 and bfloat16
// kernels with their operands in those dtypes, as conv2d_channels_last checked); false where
// the kernel declined the shape (loom's Winograd weight gradient).
bool run_channels_last(ConvKernel kernel, ConvPass pass, const ConvGeometry& g,
                       const ir::Conv2dAttr& first, const TensorView& a, const TensorView& b,
                       const TensorView& out, const float* bias, bool relu) {
  switch (kernel) {
    case ConvKernel::kF32Winograd:
      if (pass == ConvPass::kGradWeight)
        conv2d_grad_weight_winograd_f32(g, f32_winograd_tile(g, pass), a.as<const float>(),
                                        b.as<const float>(), out.as<float>());
      else
        conv2d_winograd_f32(g, pass, f32_winograd_tile(g, pass), a.as<const float>(),
                            b.as<const float>(), out.as<float>(), bias, relu);
      return true;
    case ConvKernel::kMatmul:
      conv2d_matmul(g, pass, out.dtype, a.data, b.data, out.data, bias, relu);
      return true;
    case ConvKernel::kBf16Winograd:
      conv2d_winograd_bf16(g, pass, a.as<const bfloat16>(), b.as<const bfloat16>(),
                           out.as<bfloat16>(), bias, relu);
      return true;
    case ConvKernel::kBf16WeightGrad:
      conv2d_grad_weight_bf16(g, a.as<const bfloat16>(), b.as<const bfloat16>(),
                              out.as<bfloat16>());
      return true;
    case ConvKernel::kWinogradWeightGrad: {
      const TensorView x = channels_first_copy<ChannelsFirstX>(a);
      const TensorView grad = channels_first_copy<ChannelsFirstGrad>(b);
      return conv2d_grad_weight_winograd(g, x.as<const float>(), grad.as<const float>(),
                                         out.as<float>());
    }
    case ConvKernel::kOwn: {  // the weight gradient on loom's [N,C,H,W] kernels
      assert(pass == ConvPass::kGradWeight);
      const TensorView x = channels_first_copy<ChannelsFirstX>(a);
      const TensorView grad = channels_first_copy<ChannelsFirstGrad>(b);
      conv2d_grad_weight_kernel(ir::Conv2dGradAttr{first, {out.shape[2], out.shape[3]}}, x, grad,
                                out);
      return true;
    }
    case ConvKernel::kOneDnn:
      onednn::conv2d(pass, g, out.dtype, onednn::channels_last_layout(g, pass, out.dtype), a.data,
                     b.data, out.data, {bias, relu});
      return true;
  }
  return false;
}

// The rules' kernel for pass `pass` of the channels-last conv `g` (conv_algorithm.h), the
// first that is chosen of: a Winograd or im2col + matmul, loom's bfloat16 kernels, loom's
// Winograd weight gradient, and, for the weight gradient under deterministic algorithms,
// loom's [N,C,H,W] kernels; oneDNN otherwise.
ConvKernel channels_last_rule(ConvPass pass, const ConvGeometry& g, DType a, DType b, DType out) {
  const bool f32 = a == DType::Float32 && b == DType::Float32 && out == DType::Float32;
  const bool bf16 = a == DType::BFloat16 && b == DType::BFloat16 && out == DType::BFloat16;
  if (f32 && f32_winograd_chosen(g, pass)) return ConvKernel::kF32Winograd;
  if (a == out && b == out && conv_matmul_chosen(g, pass, out)) return ConvKernel::kMatmul;
  if (pass != ConvPass::kGradWeight && bf16 && bf16_winograd_chosen(g, pass))
    return ConvKernel::kBf16Winograd;
  if (pass == ConvPass::kGradWeight && out == DType::BFloat16 && bf16_weight_grad_chosen(g))
    return ConvKernel::kBf16WeightGrad;
  if (pass == ConvPass::kGradWeight && a == DType::Float32 && b == DType::Float32 &&
      winograd_weight_grad_chosen(g, out))
    return ConvKernel::kWinogradWeightGrad;
  if (pass == ConvPass::kGradWeight && are_deterministic_algorithms_enabled())
    return ConvKernel::kOwn;
  return ConvKernel::kOneDnn;
}

// The kernels a tuned choice times for that pass: each of the above that applies (whatever
// the rules say), and oneDNN.
SmallVector<ConvKernel, 6> channels_last_candidates(ConvPass pass, const ConvGeometry& g,
                                                    DType a, DType b, DType out) {
  const bool f32 = a == DType::Float32 && b == DType::Float32 && out == DType::Float32;
  const bool bf16 = a == DType::BFloat16 && b == DType::BFloat16 && out == DType::BFloat16;
  const bool weight = pass == ConvPass::kGradWeight;
  SmallVector<ConvKernel, 6> kernels;
  if (f32 && f32_winograd_available(g)) kernels.push_back(ConvKernel::kF32Winograd);
  if (a == out && b == out && conv_matmul_available(g, pass, out))
    kernels.push_back(ConvKernel::kMatmul);
  if (bf16 && bf16_winograd_available(g, pass)) kernels.push_back(ConvKernel::kBf16Winograd);
  if (weight && bf16 && bf16_weight_grad_applies(g)) kernels.push_back(ConvKernel::kBf16WeightGrad);
  if (weight && f32 && winograd_applies(g)) kernels.push_back(ConvKernel::kWinogradWeightGrad);
  kernels.push_back(ConvKernel::kOneDnn);
  return kernels;
}

}  // namespace

// Channels-last activations go to oneDNN as they are (bfloat16 ones widened to float32 where
// oneDNN has no bfloat16 convs: onednn::bfloat16_supported), except the passes that
// channels_last_rule gives to loom's kernels or to im2col + a matmul: a Winograd
// (f32_winograd_chosen below AVX-512, bf16_winograd_chosen), conv_matmul_chosen, a bfloat16
// weight gradient that loom's vdpbf16ps kernel takes (conv_weight_bf16.h, where
// bf16_weight_grad_chosen). A float32 weight gradient that loom's Winograd takes (where
// winograd_weight_grad_chosen: two small copies next to its sums), and another one under
// use_deterministic_algorithms (oneDNN's splits its sum by the thread count), copy their
// operands to [N,C,H,W] for loom's kernels. With LOOM_CONV=tuned the kernel is the fastest
// of channels_last_candidates, timed at the pass's first call at this shape (conv_tuning.h).
void conv2d_channels_last(ConvPass pass, const ir::Conv2dAttr& attr, const TensorView& a,
                          const TensorView& b, const TensorView& out, const float* bias,
                          bool relu) {
  if (out.numel() == 0) return;
  if (a.dtype != DType::Float32 && a.dtype != DType::BFloat16)
    throw Error(std::string("conv2d: channels-last activations in float32 or bfloat16 only, got ") +
                dtype_name(a.dtype));
  ir::Conv2dAttr first = attr;
  first.channels_last = false;
  ConvGeometry g;
  switch (pass) {
    case ConvPass::kForward:
      g = conv_geometry(first, channels_first<ChannelsFirstX>(a.shape), b.shape,
                        channels_first<ChannelsFirstGrad>(out.shape));
      break;
    case ConvPass::kGradInput:
      g = conv_geometry(first, channels_first<ChannelsFirstX>(out.shape), b.shape,
                        channels_first<ChannelsFirstGrad>(a.shape));
      break;
    case ConvPass::kGradWeight:
      g = conv_geometry(first, channels_first<ChannelsFirstX>(a.shape), out.shape,
                        channels_first<ChannelsFirstGrad>(b.shape));
      break;
  }
  if (a.numel() == 0 || b.numel() == 0) {  // an empty sum
    std::memset(out.data, 0, static_cast<std::size_t>(out.numel()) * dtype_size(out.dtype));
    return;
  }
  if (a.dtype == DType::BFloat16 && b.dtype == DType::BFloat16 && out.dtype == DType::BFloat16 &&
      !onednn::bfloat16_supported()) {
    // No bfloat16 convs in oneDNN below AVX-512: the float32 conv on widened copies, rounded
    // once, as the compiler's widening would have run it.
    const auto f32 = [](const float* p, const Shape& shape) {
      return TensorView{const_cast<float*>(p), DType::Float32, shape};
    };
    return run_widened(a, b, out, [&](const float* pa, const float* pb, float* po) {
      conv2d_channels_last(pass, attr, f32(pa, a.shape), f32(pb, b.shape), f32(po, out.shape),
                           bias, relu);
    });
  }
  const auto run = [&](ConvKernel kernel) {
    return run_channels_last(kernel, pass, g, first, a, b, out, bias, relu);
  };
  if (conv_tuning_enabled()) {
    const auto candidates = channels_last_candidates(pass, g, a.dtype, b.dtype, out.dtype);
    const ConvTuningKey key{g, static_cast<int>(pass), out.dtype, true, bias || relu};
    if (const auto kernel = tuned_conv_choice(key, {candidates.data(), candidates.size()}, run);
        kernel && run(*kernel))
      return;
  }
  if (run(channels_last_rule(pass, g, a.dtype, b.dtype, out.dtype))) return;
  run(pass == ConvPass::kGradWeight && are_deterministic_algorithms_enabled()
          ? ConvKernel::kOwn
          : ConvKernel::kOneDnn);
}

// Both gradients: oneDNN where nchw_conv_kernel picks it, loom's kernels otherwise (bfloat16
// widened to them).
void conv2d_grad_input_kernel(const ir::Attr& attr, const TensorView& grad_out,
                              const TensorView& w, const TensorView& out) {
  if (const auto& conv = attr.get<ir::Conv2dGradAttr>().conv; conv.channels_last)
    return conv2d_channels_last(ConvPass::kGradInput, conv, grad_out, w, out);
  const ConvGeometry g =
      conv_geometry(attr.get<ir::Conv2dGradAttr>().conv, out.shape, w.shape, grad_out.shape);
  if (out.numel() == 0) return;
  const auto run = [&](ConvKernel kernel) {
    if (kernel == ConvKernel::kOneDnn)
      onednn::conv2d(ConvPass::kGradInput, g, out.dtype,
                     onednn::conv_layout(g, ConvPass::kGradInput, out.dtype), grad_out.data,
                     w.data, out.data);
    else if (out.dtype == DType::BFloat16)
      run_widened(grad_out, w, out, [&](const float* pgo, const float* pw, float* pgi) {
        conv2d_grad_input_typed<float>(g, pgo, pw, pgi);
      });
    else
      visit_float("conv2d_grad_input", out.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        conv2d_grad_input_typed<T>(g, grad_out.as<const T>(), w.as<const T>(), out.as<T>());
      });
    return true;
  };
  run(nchw_conv_kernel(g, ConvPass::kGradInput, out.dtype, grad_out.numel() > 0, false, run));
}

void conv2d_grad_weight_kernel(const ir::Attr& attr, const TensorView& x,
                               const TensorView& grad_out, const TensorView& out) {
  if (const auto& conv = attr.get<ir::Conv2dGradAttr>().conv; conv.channels_last)
    return conv2d_channels_last(ConvPass::kGradWeight, conv, x, grad_out, out);
  const ConvGeometry g =
      conv_geometry(attr.get<ir::Conv2dGradAttr>().conv, x.shape, out.shape, grad_out.shape);
  if (out.numel() == 0) return;
  const auto run = [&](ConvKernel kernel) {
    if (kernel == ConvKernel::kOneDnn)
      onednn::conv2d(ConvPass::kGradWeight, g, out.dtype,
                     onednn::conv_layout(g, ConvPass::kGradWeight, out.dtype), x.data,
                     grad_out.data, out.data);
    else if (out.dtype == DType::BFloat16)
      run_widened(x, grad_out, out, [&](const float* px, const float* pgo, float* pgw) {
        conv2d_grad_weight_typed<float>(g, px, pgo, pgw);
      });
    else
      visit_float("conv2d_grad_weight", out.dtype, [&](auto tag) {
        using T = typename decltype(tag)::type;
        conv2d_grad_weight_typed<T>(g, x.as<const T>(), grad_out.as<const T>(), out.as<T>());
      });
    return true;
  };
  run(nchw_conv_kernel(g, ConvPass::kGradWeight, out.dtype, grad_out.numel() > 0, false, run));
}

void max_pool2d_grad_kernel(const ir::Attr& attr, const TensorView& x, const TensorView& grad_out,
                            const TensorView& out) {
  const PoolGeometry g = pool_geometry(attr.get<ir::Pool2dAttr>(), x.shape, grad_out.shape);
  visit_float("max_pool2d_grad", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.as<const T>();
    const T* pg = grad_out.as<const T>();
    T* po = out.as<T>();
    for_each_plane(g, [&](int64_t p) {
      const T* in = px + p * g.h * g.w;
      const T* go = pg + p * g.oh * g.ow;
      T* gi = po + p * g.h * g.w;
      std::fill(gi, gi + g.h * g.w, T(0));
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          // The forward's scan: padding is skipped; the first strict maximum wins, a NaN
          // replaces it (so the last NaN wins); an all -inf window picks its first element.
          const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
          int64_t best_i = -1;
          T best = -std::numeric_limits<T>::infinity();
          for (int64_t y = std::max<int64_t>(y0, 0); y < std::min(y0 + g.kh, g.h); ++y)
            for (int64_t xx = std::max<int64_t>(x0, 0); xx < std::min(x0 + g.kw, g.w); ++xx) {
              const T v = in[y * g.w + xx];
              if (best_i < 0 || v > best || std::isnan(v)) {
                best = v;
                best_i = y * g.w + xx;
              }
            }
          if (best_i >= 0) gi[best_i] += go[oy * g.ow + ox];
        }
    });
  });
}

void avg_pool2d_grad_kernel(const ir::Attr& attr, const TensorView& grad_out,
                            const TensorView& out) {
  const auto& a = attr.get<ir::Pool2dGradAttr>().pool;
  const PoolGeometry g = pool_geometry(a, out.shape, grad_out.shape);
  const bool count_include_pad = a.count_include_pad;
  visit_float("avg_pool2d_grad", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = grad_out.as<const T>();
    T* po = out.as<T>();
    for_each_plane(g, [&](int64_t p) {
      const T* go = pg + p * g.oh * g.ow;
      T* gi = po + p * g.h * g.w;
      std::fill(gi, gi + g.h * g.w, T(0));
      for (int64_t oy = 0; oy < g.oh; ++oy)
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const auto win = avg_window(g, oy, ox, count_include_pad);
          const int64_t count = win.divisor;
          if (count <= 0) continue;
          const T v = static_cast<T>(static_cast<double>(go[oy * g.ow + ox]) /
                                     static_cast<double>(count));
          for (int64_t y = win.y0; y < win.y1; ++y)
            for (int64_t xx = win.x0; xx < win.x1; ++xx) gi[y * g.w + xx] += v;
        }
    });
  });
}

}  // namespace loom::runtime
