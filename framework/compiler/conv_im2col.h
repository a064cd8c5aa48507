// Convolutions as one GEMM: where the target asks (Target::conv_as_matmul), a forward Conv2d
// of one group over [N,C,H,W] becomes the Matmul of its weight, read as [O, C*kh*kw], by the
// Im2col of its input, [C*kh*kw, N*Ho*Wo]:
//
//   %3 = Conv2d f32[1,512,4,4] (%1 [1,512,4,4], %2 [512,512,3,3]) [padding=1]
//     →  %a = Im2col f32[4608,16] (%1); %b = Reshape f32[512,4608] (%2)
//        %c = Matmul f32[512,16] (%b, %a); %3 = Reshape f32[1,512,4,4] (%c)
//
// (with N > 1 the product is [O, N*Ho*Wo], and a Permute puts the images first). The case it
// is for: a conv with fewer output positions than output channels, as ResNet-18's last stages
// at batch 1 on a GPU, where the library's conv kernels tile the few output positions and
// leave most of the device idle, while the GEMM library splits the long inner dimension
// (C*kh*kw) over it. The gradients (Conv2dGradInput, Conv2dGradWeight) keep their kernels.
// The values are the conv's up to the order of the sums.
#pragma once

#include "ir/program.h"
#include "ir/target.h"

namespace loom::compiler {

ir::Program convs_as_matmuls(ir::Program p, const ir::Target& target);

using ConvRule = decltype(ir::Target::conv_as_matmul);

// Rules a target may take as its conv_as_matmul; both ask for one group over [N,C,H,W] (the
// pass checks that too).
// Fewer output positions N*Ho*Wo than output channels O (the CUDA target's).
bool tiny_plane_conv(DType dtype, const ir::Conv2dAttr& attr, const Shape& input,
                     const Shape& weight, const Shape& output);
// At most kSmallConvOutput output elements N*O*Ho*Wo: every conv of a ResNet-18 (CIFAR)
// evaluation at batch 1, whose largest output, 64 channels of 32x32, is 65,536 elements.
constexpr int64_t kSmallConvOutput = int64_t{1} << 17;
bool small_output_conv(DType dtype, const ir::Conv2dAttr& attr, const Shape& input,
                       const Shape& weight, const Shape& output);

// The rule by LOOM_CONV_IM2COL (read once): "auto" (the default) `device_default`, "off" none,
// "tiny_plane" or "small_output" that rule, on every device.
ConvRule conv_im2col_rule(ConvRule device_default);

}  // namespace loom::compiler
