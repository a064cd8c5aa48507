// Layout assignment for convolutions: channels-last activations.
//
// A conv whose dtype the target lists in Target::channels_last_convs, and which
// Target::channels_last_conv (where set) accepts by its geometry (the CPU: bfloat16 ones where
// oneDNN's direct kernels take [N,H,W,C] as it is and would otherwise reorder [N,C,H,W] in and
// out at every call; float32 ones except those loom's Winograd runs faster in [N,C,H,W],
// cpu_backend.cpp), is rewritten to read and write its activations channels-last
// (Conv2dAttr::channels_last); the three passes of one conv are asked the same question, so
// they agree. The layout then spreads to every instruction that does not care about it, so
// that batch norm, relu and the residual adds run on the convs' layout:
//   elementwise ops    if an operand exists only channels-last, all operands are taken so;
//   sum, mean, max     over an operand that exists only channels-last: axes renumbered;
//   expand, constants  rebuilt in the layout a reader asks for (a per-channel [1,C,1,1] is
//                      reshaped to [1,1,1,C], never transposed);
// and everything else (pooling, reshapes, matmuls, outputs, a conv left [N,C,H,W]) reads the
// [N,C,H,W] it was traced with, made by a Permute where it is needed, or by a Reshape where the
// transpose moves only dimensions of size 1 (a [N,C,1,1] pooled result). Each value is
// converted at most once per direction. Parameters and checkpoints never change layout:
// weights stay [O,C/g,kh,kw].
//
// Runs after fuse_epilogue (a conv's bias and activation stay on it: the bias is a vector,
// which no layout changes) and before the fusion passes, which then fuse the channels-last
// chains (a per-channel operand becomes a broadcast load with period C).
#pragma once

#include "ir/program.h"
#include "ir/target.h"

#include <string>

namespace loom::compiler {

ir::Program assign_channels_last(ir::Program p, const ir::Target& target);

// LOOM_CONV_LAYOUT, read once: "auto" (unset), "nchw" or "channels_last"; throws loom::Error
// naming the accepted values otherwise. Each backend maps it to its target's
// channels_last_convs (the CPU in cpu_backend.cpp, CUDA in cuda_target.cpp).
const std::string& conv_layout_setting();

}  // namespace loom::compiler
