// Private to the CPU conv kernels: Winograd F(2x2, 3x3) convolution in float32, for 3x3 convs
// of stride 1, dilation 1 and one group (any padding). A 2x2 block of outputs of one (output,
// input) channel pair takes 16 multiplies instead of 36, so where the GEMMs it leaves run near
// the machine's peak (ResNet-18's 64 to 512 channels) it beats the direct and im2col kernels,
// which already do.
//
//   if (winograd_applies(g) && conv2d_winograd(g, x, w, out)) return;
//
// The input gradient of such a conv is itself one (conv2d_grad_input_stride1), so it runs on
// conv2d_winograd. Both return false, doing nothing, where they do not apply; callers ask
// conv_algorithm (conv_algorithm.h) first.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

namespace loom::runtime {

// Whether the kernels below apply to `g`: a 3x3 kernel, stride 1, dilation 1, one group,
// padding >= 0, and at least one output.
bool winograd_applies(const ConvGeometry& g);

// out [N,O,Ho,Wo] = conv2d(x [N,C,H,W], w [O,C,3,3]).
bool conv2d_winograd(const ConvGeometry& g, const float* x, const float* w, float* out);

// grad_w [O,C,3,3] from x [N,C,H,W] and grad_out [N,O,Ho,Wo], the exact adjoint of the forward's
// transforms. The result depends on the shapes only, never on the thread count.
bool conv2d_grad_weight_winograd(const ConvGeometry& g, const float* x, const float* grad_out,
                                 float* grad_w);

}  // namespace loom::runtime
