// What the CUDA device runs and which rewrites its kernels take (ir/target.h); apart from the
// backend so that the kernels of a program can be generated and compiled without a GPU.
#pragma once

#include "ir/target.h"

namespace loom::runtime::cuda {

// Every op at every dtype, bfloat16 arithmetic widened to float32 (the generated kernels
// compute in float registers and load and store bfloat16); Matmul and the convolutions run
// in bfloat16 on the tensor cores, accumulating in float32. Every rewrite the CPU takes
// but stack_reductions (codegen_reduce.cpp has no stacked sum); channels-last activations
// for bfloat16 convolutions (LOOM_CONV_LAYOUT changes which).
ir::Target cuda_target();

}  // namespace loom::runtime::cuda
