// Private to the CPU conv kernels: direct float32 AVX-512 convolution for stride-1 convs, the
// bulk of a CIFAR ResNet's work. im2col + GEMM spends as long copying as multiplying when a
// conv has few channels (im2col writes kh*kw copies of the input, then the GEMM packs them
// again); these kernels read each padded input plane in place instead.
//
//   if (!conv2d_direct(g, x, w, out)) conv2d_forward(g, x, w, out);  // the general path
//
// Both return false, doing nothing, where they do not apply: a build without AVX-512, a
// stride other than 1, or padding beyond the kernel's reach (the input gradient's transposed
// conv always fits: its padding is the reach minus the forward's). Callers ask conv_algorithm
// (conv_algorithm.h) first.
#pragma once

#include "runtime/cpu/conv/conv_algorithm.h"
#include "runtime/cpu/conv/conv_common.h"

#include <cstdint>

namespace loom::runtime {

// out [N,O,Ho,Wo] = conv2d(x [N,C,H,W], w [O,C/g,kh,kw]). With `used` (used[c * kh*kw + t]
// for the input channels of a group), only the marked taps are summed: the others' weights
// are known to be zero.
bool conv2d_direct(const ConvGeometry& g, const float* x, const float* w, float* out,
                   const uint8_t* used = nullptr);

// grad_w [O,C/g,kh,kw] from x [N,C,H,W] and grad_out [N,O,Ho,Wo]. The result depends on the
// shapes only, never on the thread count. With `used`, unmarked taps get zero.
bool conv2d_grad_weight_direct(const ConvGeometry& g, const float* x, const float* grad_out,
                               float* grad_w, const uint8_t* used = nullptr);

// Whether the two above apply to `g` (the flat layout fits it).
bool direct_applies(const ConvGeometry& g);

// Strided convs (conv_strided.cpp): a conv of stride s is a stride-1 conv over the input's
// s x s phases (x[s*y + a][s*x + b] for each offset (a, b)), with the taps regrouped by phase
// into a smaller kernel; these run that on the direct kernels. They return false where that
// does not apply (dilation, strides above 4, or a stride-1 conv) or is not chosen for the phased
// conv.
bool conv2d_strided(const ConvGeometry& g, const float* x, const float* w, float* out);
bool conv2d_grad_input_strided(const ConvGeometry& g, const float* grad_out, const float* w,
                               float* grad_in);
bool conv2d_grad_weight_strided(const ConvGeometry& g, const float* x, const float* grad_out,
                                float* grad_w);

}  // namespace loom::runtime
