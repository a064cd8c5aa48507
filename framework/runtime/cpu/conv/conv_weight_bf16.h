// Private to the CPU conv kernels: the weight gradient of a bfloat16 channels-last conv on the
// processor's bfloat16 dot products (AVX512_BF16), for 3-wide kernels at any stride.
//
//   if (bf16_weight_grad_applies(g)) conv2d_grad_weight_bf16(g, x, grad_out, grad_w);
//
// x is [N,H,W,C] and grad_out [N,Ho,Wo,O], both bfloat16; grad_w is [O,C,kh,kw] bfloat16, each
// element a float32 sum rounded once. Why it exists: oneDNN 2.6's bfloat16 weight gradient
// runs well below its forward conv's speed at ResNet-20's narrow channels and at strided convs;
// this kernel is 1.15 to 2.5x faster there (kernel_bench's Bf16WeightGrad rows compare the two
// in one run; conv_algorithm.cpp has the figures and the choice). The sums run over image
// pairs, the pair being what one vdpbf16ps multiplies, so no operand is transposed: pieces of
// image pairs are staged interleaved (pixel by pixel, in blocks of 16 channels), the padding as
// zeros, in per-thread buffers. The work is split by the shape only and partial sums are added
// in a fixed order, so results do not depend on the thread count.
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
