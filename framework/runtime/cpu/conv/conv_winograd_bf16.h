// Private to the CPU conv kernels: Winograd F(2x2, 3x3) for bfloat16 channels-last convs, its
// 16 GEMMs per tile on the processor's bfloat16 dot products (AVX512_BF16).
//
//   if (bf16_winograd_applies(g)) conv2d_winograd_bf16(g, pass, in, w, out, bias, relu);
//
// The forward and the input gradient of a 3x3 stride-1 conv: the input gradient is itself such
// a conv (of grad_out, with the kernel flipped, its channels swapped and the padding 2 - p),
// so both run the same loop. Why it exists: a 2x2 block of outputs takes 16 multiplies per
// channel pair instead of 36, and from 64 channels on the GEMMs that remain run near the dot
// products' peak, where oneDNN 2.6's direct bfloat16 kernels do all 36 (kernel_bench's
// Bf16Winograd rows compare the two in one run; conv_algorithm.cpp has the choice).
//
// Precision: the transformed input (sums of up to four inputs) and the transformed kernel are
// rounded to bfloat16 before they are multiplied, where a direct conv multiplies the bfloat16
// operands themselves; the products are summed in float32 and the result rounded once. So the
// error is a few bfloat16 roundings of the operands' scale, not one of the result: about 1% of
// the result's rms at worst (conv_winograd_bf16_test.cpp), more than the op harness's 1e-2
// relative tolerance allows an element that a sum cancels to near zero. LOOM_BF16_WINOGRAD=0
// turns it off (conv_algorithm.h). Results depend on the shapes only, never on the thread
// count.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <loom/bfloat16.h>

namespace loom::runtime {

// Whether this build has the kernel (compiled with AVX512_BF16) and it takes both passes of
// the conv `g`: a 3x3 kernel, stride 1, no dilation, one group, padding 0 to 2, input and
// output channels multiples of 16.
bool bf16_winograd_applies(const ConvGeometry& g);

// Pass `pass` (kForward or kGradInput) of the channels-last conv `g`, all bfloat16:
//   kForward:   out [N,Ho,Wo,O] = conv(in = x [N,H,W,C], w [O,C,3,3]), then + bias[o] (float32,
//               null: none) and relu, in float32 before the rounding;
//   kGradInput: out = grad_x [N,H,W,C] from in = grad_out [N,Ho,Wo,O] (bias null, relu false).
void conv2d_winograd_bf16(const ConvGeometry& g, ConvPass pass, const bfloat16* in,
                          const bfloat16* w, bfloat16* out, const float* bias, bool relu);

}  // namespace loom::runtime
