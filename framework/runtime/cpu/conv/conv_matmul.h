// Private to the CPU conv kernels: a channels-last conv as im2col and one oneDNN matmul, in
// float32 or bfloat16 (the latter where oneDNN's bfloat16 matmul runs on AMX tiles).
//
//   if (conv_matmul_chosen(g, pass, dtype)) return conv2d_matmul(g, pass, dtype, a, b, out);
//
// Why it exists: oneDNN 2.6's direct convs run far below its matmul on small planes with many
// channels. On a Sapphire Rapids core its bfloat16 matmul reaches 1.4 to 1.7 TFLOP/s at
// ResNet-18's last stages' shapes, while its bfloat16 512-channel 3x3 weight gradient on 4x4
// planes stays at 0.28 TFLOP/s; in float32 its 4x4 forward and weight gradient run at half the
// FMA peak. Channels-last, im2col is a copy of whole channel vectors per tap, and the weights'
// reorders are oneDNN's (onednn::reorder):
//   col [N*Ho*Wo, kh*kw*C]  (row = output position, column = (tap, input channel))
//   forward:      y [N*Ho*Wo, O] = col(x) * w_r^T,  w_r [O, kh*kw*C]  (+ bias, relu)
//   input grad:   stride 1 only, as the forward conv of grad_y with each weight transposed
//                 (in <-> out channels) and flipped, padding d*(k-1) - p (as conv_common.h's
//                 conv2d_grad_input_stride1): grad_x [N*H*W, C] = col_r(grad_y) * w_t^T,
//                 w_t [C, kh*kw*O] the weight transposed, and the flip done by im2col, which
//                 writes the taps of col_r in reverse order
//   weight grad:  grad_w_r [O, kh*kw*C] = grad_y^T * col(x), reordered to [O, C, kh, kw]
// Every result element is one float32 sum (rounded once to bfloat16 in bfloat16). The weight
// reorders cost a pass over the weight (a small share at these shapes); a 1x1 stride-1
// unpadded conv reads its input in place, and a 1x1 weight needs no reorder. A forward conv
// with fewer output positions than output channels (inference at batch 1, where the weight is
// most of the traffic) writes im2col's columns in the weight's own order, (channel, tap), and
// reads the weight as it is: ResNet-18's 512-channel 4x4 conv at batch 1, 1.18 to 0.55 ms.
// oneDNN's matmul may split a sum across its threads, so the choice (conv_algorithm.h) leaves
// this path under deterministic algorithms. The figures behind the choice are in
// conv_algorithm.cpp.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <loom/dtype.h>

namespace loom::runtime {

// Whether the path runs conv `g` in `dtype`: one group; Float32, or BFloat16 where oneDNN's
// bfloat16 matmul runs on AMX; strided convs have no input gradient on this path.
bool conv_matmul_applies(const ConvGeometry& g, ConvPass pass, DType dtype);

// im2col of a float32 weight gradient's images at most this size: a larger batch runs as one
// matmul per group of images, each group's products added to the first group's in image order
// (fixed by the shape; the bfloat16 one stays one matmul, rounded once).
constexpr int64_t kWeightGradColumnBytes = int64_t{32} << 20;
// The images in each of those matmuls (g.n: one matmul), for an im2col budget of
// `column_bytes`.
int64_t weight_grad_images(const ConvGeometry& g, DType dtype,
                           int64_t column_bytes = kWeightGradColumnBytes);

// Pass `pass` of conv `g` in `dtype` (conv_matmul_applies must hold), its operands as
// onednn::conv2d's with Layout::kChannelsLast: kForward a = x, b = w, out = y (+ bias per
// output channel, then relu); kGradInput a = grad_y, b = w, out = grad_x; kGradWeight a = x,
// b = grad_y, out = grad_w [O, C, kh, kw]. The epilogue applies to the forward only.
void conv2d_matmul(const ConvGeometry& g, ConvPass pass, DType dtype, const void* a,
                   const void* b, void* out, const float* bias = nullptr, bool relu = false);

// conv2d_matmul's weight gradient (x, grad_y -> grad_w [O, C, kh, kw]) with im2col's budget
// per matmul given (the tests take a small one to split a small batch).
void conv2d_matmul_grad_weight(const ConvGeometry& g, DType dtype, const void* x,
                               const void* grad_y, void* out,
                               int64_t column_bytes = kWeightGradColumnBytes);

}  // namespace loom::runtime
