// Private to the CPU conv kernels: the weight gradient of a bfloat16 channels-last conv on the
// processor's bfloat16 dot products (AVX512_BF16), for 3-wide kernels at any stride.
//
//   if (bf16_weight_grad_applies(g)) conv2d_grad_weight_bf16(g, x, grad_out, grad_w);
//
// x is [N,H,W,C] and grad_out [N,Ho,Wo,O], both bfloat16; grad_w is [O,C,kh,kw] bfloat16, each
// element a float32 sum rounded once. Why it exists: oneDNN 2.6's bfloat16 weight gradient runs
// at 60-80% of the speed of its forward conv at the ResNet shapes (kernel_bench's
// Bf16WeightGrad rows compare the two in one run). The sums run over image pairs, the pair
// being what one vdpbf16ps multiplies, so no operand is transposed: each pair of images is
// staged interleaved (pixel by pixel, channel by channel) in L2-sized pieces, with the padding
// as zeros. The work is split by the shape only and partial sums are added in a fixed order,
// so results do not depend on the thread count.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <loom/bfloat16.h>

namespace loom::runtime {

// Whether this build has the kernel (compiled with AVX512_BF16) and it takes the conv `g`:
// groups 1, no dilation, a kernel 3 wide, input and output channels multiples of 16.
bool bf16_weight_grad_applies(const ConvGeometry& g);

// grad_w = the weight gradient of conv `g` (bf16_weight_grad_applies(g) must hold).
void conv2d_grad_weight_bf16(const ConvGeometry& g, const bfloat16* x, const bfloat16* grad_out,
                             bfloat16* grad_w);

}  // namespace loom::runtime
