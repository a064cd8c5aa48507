// Private to the CPU conv kernels: which algorithm runs each pass of a conv, by dtype and
// shape, from kernel_bench's measurements (conv_algorithm.cpp gives the figures).
//
//   switch (conv_algorithm(g, ConvPass::kForward, DType::Float32)) { ... }
//
// The algorithms: oneDNN (onednn.h: its direct JIT kernels on blocked layouts, or its im2col
// + JIT GEMM on loom's layouts), loom's direct AVX-512 kernels (conv_direct.h; the weight
// gradient of strided convs by phases), Winograd F(2x2, 3x3) (conv_winograd.h; on channels-last
// activations conv_winograd_bf16.h and conv_winograd_f32.h) and im2col + Eigen GEMM (the general
// path, and float64's only one: oneDNN has no float64). LOOM_CONV=onednn|direct|gemm|winograd
// forces one wherever it applies (read once; for measurements); elsewhere the choice stands.
// LOOM_CONV=tuned keeps these rules for the layouts and times the kernels of each pass's
// layout instead (conv_tuning.h).
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <loom/dtype.h>

namespace loom::runtime {

enum class ConvAlgorithm { kOneDnn, kDirect, kGemm, kWinograd };

// Which algorithm runs pass `pass` of the conv `g` in `dtype` (Float32 or BFloat16; Float64
// always takes im2col + GEMM and does not ask). A bfloat16 conv that does not go to oneDNN
// (forced, or the weight gradient under deterministic algorithms) runs on loom's float32
// kernels, its operands widened and its result rounded once. With deterministic algorithms
// (loom::use_deterministic_algorithms) the weight gradient never goes to oneDNN, whose sums
// over images are split by the thread count.
ConvAlgorithm conv_algorithm(const ConvGeometry& g, ConvPass pass, DType dtype);

// The same among loom's own kernels only (never kOneDnn): for the float32 paths that run on
// them, including the input gradient of a stride-1 conv as a transposed forward conv.
ConvAlgorithm own_conv_algorithm(const ConvGeometry& g, ConvPass pass);

// Whether loom's direct kernels should run pass `pass` of the stride-1 conv `g` (for a strided
// conv, `g` is its phased geometry) when loom's own kernels run it: they apply and win over
// im2col + GEMM at this shape, or LOOM_CONV=direct forces them (LOOM_CONV=gemm forbids them).
bool direct_chosen(const ConvGeometry& g, ConvPass pass);

// Whether loom's bfloat16 weight-gradient kernel (conv_weight_bf16.h) runs the channels-last
// conv `g`: where it applies and beats oneDNN's (strided convs, and stride-1 ones up to 64
// channels on each side; everywhere it applies under deterministic algorithms, as it splits
// its sums by the shape only), unless LOOM_CONV=onednn forces oneDNN.
bool bf16_weight_grad_chosen(const ConvGeometry& g);

// Whether the float32 weight gradient of the channels-last conv `g` runs on loom's Winograd
// (conv2d_grad_weight_winograd_channels_last, which copies its operands to [N,C,H,W]) rather
// than oneDNN's: where Winograd applies and wins, on output planes up to 4x4 with 512 channels
// or more on both sides in batches of 16 or more (ResNet-18's last stage in training), unless
// LOOM_CONV forces another algorithm (LOOM_CONV=winograd: wherever it applies).
bool winograd_weight_grad_chosen(const ConvGeometry& g, DType dtype);

// Whether loom's bfloat16 Winograd (conv_winograd_bf16.h) runs pass `pass` (kForward or
// kGradInput) of the channels-last conv `g`: where it applies and beats oneDNN's direct
// kernels (from 64 channels on both sides; the input gradient on planes over 4x4), or
// LOOM_CONV=winograd forces it wherever it applies; never with LOOM_BF16_WINOGRAD=0 or another
// LOOM_CONV.
bool bf16_winograd_chosen(const ConvGeometry& g, ConvPass pass);

// Whether loom's float32 Winograd on AVX2 (conv_winograd_f32.h) runs pass `pass` of the
// channels-last conv `g`: where it applies and beats oneDNN's kernels and im2col + matmul, on a
// CPU below AVX-512 and planes (the pass's output; the weight gradient's: the conv's output) of
// 4x4 or more, also under deterministic algorithms (its sums depend on the shapes only), or
// LOOM_CONV=winograd forces it wherever it applies; never with LOOM_F32_WINOGRAD=0 or another
// LOOM_CONV.
bool f32_winograd_chosen(const ConvGeometry& g, ConvPass pass);

// The float32 Winograd's output tile side for pass `pass` of `g`: 4 (F(4x4, 3x3): 1.1 to 2.1x
// faster at ResNet's planes from 8x8, its error tens of float32 roundings of the operands'
// scale), or 2 (F(2x2, 3x3): a few roundings) on planes of 4x4, where the two are even.
// LOOM_F32_WINOGRAD=4x4 or =2x2 gives those tiles everywhere.
int f32_winograd_tile(const ConvGeometry& g, ConvPass pass);

// Whether im2col + one oneDNN matmul (conv_matmul.h) runs pass `pass` of the channels-last
// conv `g` in `dtype`: where it applies (one group; float32, or bfloat16 on AMX; the input
// gradient at stride 1) and beats oneDNN's direct kernels (the small planes of ResNet-18's last
// stages; in bfloat16 also the strided convs' weight gradients and the strided 1x1
// projections) with an im2col buffer of at most 32 MiB, or LOOM_CONV=gemm forces it wherever
// it applies; never under deterministic algorithms or another LOOM_CONV.
bool conv_matmul_chosen(const ConvGeometry& g, ConvPass pass, DType dtype);

// Whether LOOM_CONV forces one of loom's own algorithms (direct, gemm or winograd): then the
// CPU's layout choice (cpu_backend.cpp) keeps float32 convs [N,C,H,W], where they run.
bool own_algorithm_forced();

// Whether LOOM_CONV=tuned (conv_tuning.h; conv_tuning_enabled also asks deterministic
// algorithms).
bool conv_tuning_requested();

// The candidates of a tuned choice (conv_tuning.h), each where its kernel applies and no
// setting rules it out, whatever the rules above would choose: the channels-last float32
// Winograd (not with LOOM_F32_WINOGRAD=0), the bfloat16 one (its forward and input gradient;
// not with LOOM_BF16_WINOGRAD=0), and im2col + one oneDNN matmul (with an im2col buffer of at
// most 32 MiB).
bool f32_winograd_available(const ConvGeometry& g);
bool bf16_winograd_available(const ConvGeometry& g, ConvPass pass);
bool conv_matmul_available(const ConvGeometry& g, ConvPass pass, DType dtype);

}  // namespace loom::runtime
