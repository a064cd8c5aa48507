// Private to the CPU conv kernels: Winograd F(4x4, 3x3) and F(2x2, 3x3) for float32
// channels-last convs on 8-lane AVX2 and FMA, for CPUs below AVX-512, and F(3x3, 4x4) and
// F(3x3, 2x2) for their weight gradients.
//
//   if (f32_winograd_chosen(g, pass))
//     return conv2d_winograd_f32(g, pass, f32_winograd_tile(g, pass), in, w, out, bias, relu);
//
// The forward and the input gradient of a 3x3 stride-1 conv (the input gradient is itself such
// a conv: of grad_out, with the kernel flipped, its channels swapped and the padding 2 - p), the
// design of conv_winograd_bf16.h in float32: channels-last, each tile's transformed values are
// vectors of channels, so the transforms are vector loops and the GEMMs per block of tiles
// need no transposes. Why it exists: below AVX-512 oneDNN 2.6 has no Winograd and its direct
// 8-lane kernels reach about 80 to 150 GFLOP/s on ResNet's convs (a 190 GFLOP/s FMA peak on the
// AVX2 EPYC measured), while a 4x4 block of outputs here takes 36 multiplies per channel pair
// instead of 144 (a 2x2 block 16 instead of 36). kernel_bench's F32Winograd rows compare the
// tile sizes and oneDNN in one run; conv_algorithm.cpp has the choice and its figures.
//
// Precision: the transformed input (sums of up to 36 inputs weighted 1 to 25 for 4x4 tiles,
// 4 inputs for 2x2) and kernel (of up to nine taps, weighted 1/576 to 1) are float32 sums
// rounded like any other, and an output adds 36 (16) products per input channel weighted up to
// 64 (1), so its error is tens of float32 roundings of the operands' scale with 4x4 tiles and
// a few with 2x2 (conv_winograd_f32_test.cpp: within 1e-4 and 1e-5 of it), not the one
// rounding per product of a direct conv. LOOM_F32_WINOGRAD=2x2 chooses the 2x2 tiles, =0 turns
// the kernel off. Results depend on the shapes and the tile only, never on the thread count.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

namespace loom::runtime {

// Whether this build has the kernel (compiled with AVX2 and FMA) and it takes both passes of
// the conv `g`: a 3x3 kernel, stride 1, no dilation, one group, padding 0 to 2, input and
// output channels multiples of 8.
bool f32_winograd_applies(const ConvGeometry& g);

// Pass `pass` (kForward or kGradInput) of the channels-last conv `g`, all float32, in output
// tiles of `tile` x `tile` (4: F(4x4, 3x3), or 2: F(2x2, 3x3)):
//   kForward:   out [N,Ho,Wo,O] = conv(in = x [N,H,W,C], w [O,C,3,3]), then + bias[o] (null:
//               none) and relu (when `relu`);
//   kGradInput: out = grad_x [N,H,W,C] from in = grad_out [N,Ho,Wo,O] (bias null, relu false).
void conv2d_winograd_f32(const ConvGeometry& g, ConvPass pass, int tile, const float* in,
                         const float* w, float* out, const float* bias, bool relu);

// The weight gradient of the channels-last conv `g` (f32_winograd_applies must hold): out =
// grad_w [O,C,3,3] from x [N,H,W,C] and grad (of the output) [N,Ho,Wo,O], by F(3x3, tile x
// tile), whose transforms are the forward's. The tiles are summed in fixed groups of 4096
// output positions (f32_winograd_weight_grad_groups of them), each group's sums kept apart and
// the groups added in order, so the bits depend on the shapes and the tile only.
void conv2d_grad_weight_winograd_f32(const ConvGeometry& g, int tile, const float* x,
                                     const float* grad, float* out);
int64_t f32_winograd_weight_grad_groups(const ConvGeometry& g, int tile);

}  // namespace loom::runtime
