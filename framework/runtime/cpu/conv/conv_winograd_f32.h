// Private to the CPU conv kernels: Winograd F(2x2, 3x3) for float32 channels-last convs on
// 8-lane AVX2 and FMA, for CPUs below AVX-512, and F(3x3, 2x2) for their weight gradients.
//
//   if (f32_winograd_chosen(g, pass)) return conv2d_winograd_f32(g, pass, in, w, out, bias, relu);
//
// The forward and the input gradient of a 3x3 stride-1 conv (the input gradient is itself such
// a conv: of grad_out, with the kernel flipped, its channels swapped and the padding 2 - p), the
// design of conv_winograd_bf16.h in float32: channels-last, each tile's 16 transformed values
// are vectors of channels, so the transforms are vector loops and the 16 GEMMs per block of
// tiles need no transposes. Why it exists: below AVX-512 oneDNN 2.6 has no Winograd and its
// direct 8-lane kernels reach about 80 to 150 GFLOP/s on ResNet's convs (a 190 GFLOP/s FMA
// peak on the AVX2 EPYC measured), while a 2x2 block of outputs here takes 16 multiplies per
// channel pair instead of 36 (kernel_bench's F32Winograd rows compare the two in one run;
// conv_algorithm.cpp has the choice and its figures).
//
// Precision: the transformed input (sums of up to four inputs) and kernel (of up to nine taps,
// weighted 1/4 to 1) are float32 sums rounded like any other, and an output adds 16 products
// per input channel with the signs of A^T: its error stays within a few float32 roundings of
// the operands' scale (conv_winograd_f32_test.cpp), not the one rounding per product of a direct
// conv. LOOM_F32_WINOGRAD=0 turns it off. Results depend on the shapes only, never on the
// thread count.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

namespace loom::runtime {

// Whether this build has the kernel (compiled with AVX2 and FMA) and it takes both passes of
// the conv `g`: a 3x3 kernel, stride 1, no dilation, one group, padding 0 to 2, input and
// output channels multiples of 8.
bool f32_winograd_applies(const ConvGeometry& g);

// Pass `pass` (kForward or kGradInput) of the channels-last conv `g`, all float32:
//   kForward:   out [N,Ho,Wo,O] = conv(in = x [N,H,W,C], w [O,C,3,3]), then + bias[o] (null:
//               none) and relu (when `relu`);
//   kGradInput: out = grad_x [N,H,W,C] from in = grad_out [N,Ho,Wo,O] (bias null, relu false).
void conv2d_winograd_f32(const ConvGeometry& g, ConvPass pass, const float* in, const float* w,
                         float* out, const float* bias, bool relu);

// The weight gradient of the channels-last conv `g` (f32_winograd_applies must hold): out =
// grad_w [O,C,3,3] from x [N,H,W,C] and grad (of the output) [N,Ho,Wo,O], by F(3x3, 2x2), whose
// 4x4 transforms are the forward's. The 2x2 output tiles are summed in fixed groups of 1024
// (f32_winograd_weight_grad_groups of them), each group's sums kept apart and the groups added
// in order, so the bits depend on the shapes only.
void conv2d_grad_weight_winograd_f32(const ConvGeometry& g, const float* x, const float* grad,
                                     float* out);
int64_t f32_winograd_weight_grad_groups(const ConvGeometry& g);

}  // namespace loom::runtime
