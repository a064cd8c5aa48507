// Private to the CPU kernels: oneDNN (the oneAPI Deep Neural Network Library) as the CPU
// backend's convolution and matmul, in float32 and bfloat16.
//
//   onednn::conv2d(ConvPass::kForward, g, DType::BFloat16, onednn::Layout::kBlocked, x, w, out);
//   onednn::matmul({.batch = 1, .m = m, .n = n, .k = k}, DType::Float32, a, b, c, {bias, true});
//
// One engine for the CPU; per calling thread a stream and a cache of primitives keyed by
// everything a primitive is built from (pass, dtype, geometry, layout, epilogue, thread
// count), so a steady training step creates none (primitives_created() counts them). Each
// primitive runs with a user-managed scratchpad, and the blocked layouts' copies of the
// operands live in per-thread buffers that grow to the largest call and are kept, so a
// steady step asks the heap for nothing on loom's side. oneDNN itself still allocates inside
// each execute (its argument maps): those allocations are counted apart, as
// ExecuteHeapAllocLibrary (heap_count.h's LibraryHeapScope), not as ExecuteHeapAlloc.
//
// oneDNN runs on OpenMP (libgomp) threads, the kernels around it on TBB's: each call first
// sets OpenMP's thread count to loom's (TBB's limit), and the programs set
// OMP_WAIT_POLICY=passive (loom/openmp.h) so that libgomp's workers sleep, rather than spin
// on the cores, while TBB runs. oneDNN's results depend on its thread count wherever it
// splits a sum across threads (the weight gradient, a GEMM split along k):
// conv_algorithm (conv/conv_algorithm.h) keeps those passes on loom's kernels when
// deterministic algorithms are asked for (loom::use_deterministic_algorithms).
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <loom/dtype.h>

#include <cstdint>

namespace loom::runtime::onednn {

// How a conv's tensors reach oneDNN. kPlain: as loom stores them ([N,C,H,W] and
// [O,C/g,kh,kw]), where oneDNN runs im2col and its own JIT GEMM. kBlocked: reordered into the
// layouts its direct JIT kernels take (channels in blocks of 16: nChw16c, OIhw16i16o, ...),
// and the result reordered back; the reorders cost a pass over each operand. kChannelsLast:
// the activations are stored channels-last ([N,H,W,C], the layout the compiler's
// channels_last pass gives the convs' activations) and oneDNN's direct kernels take them as
// they are; only the weights, still [O,C/g,kh,kw], are reordered into its blocked layout.
// kChannelsLastBlocked: channels-last activations reordered into the blocked layouts and the
// result back, for the passes whose blocked kernels beat the channels-last ones by more than
// the reorders cost (channels_last_layout).
enum class Layout { kPlain, kBlocked, kChannelsLast, kChannelsLastBlocked };

// The layout a conv pass over channels-last activations runs in: kChannelsLast, or
// kChannelsLastBlocked where oneDNN's blocked kernels win with the reorders counted (the
// measurements are in onednn.cpp).
Layout channels_last_layout(const ConvGeometry& g, ConvPass pass, DType dtype);

// Whether oneDNN's effective ISA reaches AVX512_CORE (ONEDNN_MAX_CPU_ISA caps it): its float32
// kernels are then the 16-lane ones that most of the conv choices were measured against;
// below, on an AVX2-only CPU, some choices differ (channels_last_layout, conv_algorithm.cpp).
bool avx512_core();

// Whether oneDNN computes in bfloat16 on this CPU with bfloat16 instructions (AVX512_BF16 or
// AMX), rather than emulating them: then the CPU target keeps bfloat16 convs and matmuls in
// bfloat16 (cpu_backend.cpp), and oneDNN runs them with float32 accumulation. oneDNN's
// ONEDNN_MAX_CPU_ISA (e.g. AVX512_CORE) turns this off for testing the widened path.
bool native_bfloat16();

// Whether oneDNN has bfloat16 convs, matmuls and JIT reorders on this CPU at all: from
// AVX512_CORE on (emulated there without AVX512_BF16). Below, on an AVX2-only CPU, it creates
// no bfloat16 conv or matmul ("could not create a primitive descriptor iterator") and its
// bfloat16 reorder is the reference one, which changes bits (a signalling NaN comes back
// quiet, a subnormal as zero); the kernels then run bfloat16 on loom's own code (widened for
// convs and matmuls), whatever a target or LOOM_CONV asks.
bool bfloat16_supported();

// Whether oneDNN runs bfloat16 convs and matmuls on AMX tiles here (Sapphire Rapids and later;
// oneDNN's effective ISA, so ONEDNN_MAX_CPU_ISA caps it too). Then its bfloat16 convs run
// several times faster than loom's own vdpbf16ps kernels (kernel_bench, 2026-11-24: Winograd
// forward and input gradient 3.2 to 6.7x, weight gradient 1.3 to 6.6x but 0.84x at
// ResNet-18's strided 256-to-512 shape), and the conv choice leaves them to oneDNN.
bool amx_bfloat16();

// What a conv or matmul adds to its result, per output channel (conv) or column (matmul),
// and whether it then applies relu: as oneDNN post-ops, after the whole sum, so the bits are
// those of the separate add and relu. The bias is float32 (epilogues are float32 only). No
// residual add (oneDNN's sum post-op): the compiler folds none into a conv, and in a ResNet a
// batch norm sits between the conv and the add.
struct Epilogue {
  const float* bias = nullptr;
  bool relu = false;
};

// One pass of the conv `g`, its operands in loom's layouts and `dtype` (Float32 or BFloat16;
// the result in `dtype` too):
//   kForward:    a = x [N,C,H,W],        b = w [O,C/g,kh,kw],  out = y [N,O,Ho,Wo]
//   kGradInput:  a = grad_y [N,O,Ho,Wo], b = w,                out = grad_x [N,C,H,W]
//   kGradWeight: a = x,                  b = grad_y,           out = grad_w [O,C/g,kh,kw]
// (x, y and their gradients [N,H,W,C] and [N,Ho,Wo,O] for kChannelsLast).
// The epilogue applies to the forward only.
void conv2d(ConvPass pass, const ConvGeometry& g, DType dtype, Layout layout, const void* a,
            const void* b, void* out, Epilogue epilogue = {});

// c [batch, m, n] = a [batch, m, k] x b [batch, k, n], a stored [batch, k, m] when ta and b
// [batch, n, k] when tb, all dense; Float32 or BFloat16, c in the same dtype.
struct MatmulShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
};
void matmul(const MatmulShape& s, DType dtype, const void* a, const void* b, void* c,
            Epilogue epilogue = {});

// The row strides (in elements) oneDNN's matmul reads a and b with, as stored (a [k, m] when
// ta, else [m, k]; b [n, k] when tb, else [k, n]): their widths, or a width padded past a
// stride that slowed oneDNN's GEMM down where it was measured (onednn.cpp), an operand then
// copied into a per-thread buffer at each call (at most 32 MB an operand).
struct MatmulStrides {
  int64_t a = 0, b = 0;
};
MatmulStrides matmul_read_strides(const MatmulShape& s, DType dtype);

// dst = src, element for element, for a tensor of up to 4 dims that the two store with
// different strides (a permuted copy, such as a conv weight [O,C,kh,kw] stored [O,kh,kw,C]);
// Float32 or BFloat16. oneDNN's reorder, its JIT kernels vectorise the transposes: for the
// conv weights of conv_matmul.h, ResNet-18's bfloat16 512-channel 4x4 conv took 2.4 to 2.5 ms
// forward and 2.1 to 2.2 ms weight gradient with it, against 3.4 to 3.8 and 3.2 to 3.3 ms
// with loom's permute_kernel (kernel_bench ConvMatmul, alternated twice, 2026-11-24).
struct Strided {
  int64_t dims[4] = {1, 1, 1, 1};
  int64_t src[4] = {0, 0, 0, 0};
  int64_t dst[4] = {0, 0, 0, 0};
};
void reorder(const Strided& s, DType dtype, const void* src, void* dst);

// The layout oneDNN runs pass `pass` of `g` in, where conv_algorithm picks oneDNN: the one
// kernel_bench measured faster at that shape (onednn.cpp says which).
Layout conv_layout(const ConvGeometry& g, ConvPass pass, DType dtype);

// Primitives created so far (all threads): a cached shape creates none.
int64_t primitives_created();

// The implementation oneDNN picked for a pass ("jit:avx512_core", "x64:gemm:jit",
// "jit_bf16:avx512_core_bf16", ...), creating its primitive if needed: for tests and
// benchmarks' labels.
const char* conv2d_implementation(ConvPass pass, const ConvGeometry& g, DType dtype,
                                  Layout layout);

}  // namespace loom::runtime::onednn
