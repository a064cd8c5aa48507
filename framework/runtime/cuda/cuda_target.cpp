#include "runtime/cuda/cuda_target.h"

#include "compiler/channels_last.h"
#include "compiler/conv_im2col.h"

#include <string>

namespace loom::runtime::cuda {

namespace {

// Which convs run on channels-last activations (compiler/channels_last.h), by
// LOOM_CONV_LAYOUT as the CPU reads it: "auto" (the default) bfloat16 ones, whose tensor-core
// kernels in cuDNN read [N,H,W,C] (in [N,C,H,W] a ResNet-20 bf16 step at batch 1024 on an
// H100 spent 72 ms in convs against 30 in float32); "nchw" none; "channels_last" float32 ones
// too.
uint8_t channels_last_convs() {
  constexpr auto bit = [](DType t) { return static_cast<uint8_t>(1u << static_cast<int>(t)); };
  const std::string& layout = compiler::conv_layout_setting();
  if (layout == "auto") return bit(DType::BFloat16);
  if (layout == "nchw") return 0;
  return bit(DType::Float32) | bit(DType::BFloat16);  // channels_last
}

}  // namespace

ir::Target cuda_target() {
  ir::Target t;
  t.name = "cuda";
  t.run_everything();
  for (ir::Op op : {ir::Op::Conv2d, ir::Op::Conv2dGradInput, ir::Op::Conv2dGradWeight,
                    ir::Op::Matmul})
    t.run_bfloat16(op);
  t.fuse_epilogue = t.fuse_elementwise = t.fuse_reduce_prologue = true;
  t.fold_transpose = t.plan_memory = true;
  // An H100 does about 20 float operations in the time it moves a byte: an exp recomputed
  // from 2-byte logits is cheaper than a 4-byte copy written and read back.
  t.recompute_costly_steps = true;
  t.channels_last_convs = channels_last_convs();
  // Small convs as one GEMM over their im2col matrix. ResNet-18's 512-channel convs on 4x4
  // planes at batch 1 took 168 us each in cuDNN (0.45 TFLOP/s, an H100, 2026-11-24): its
  // kernels tile the 16 output positions. As one GEMM the inner dimension (C*kh*kw = 4608) is
  // long enough for cuBLASLt to split over the device. Taking every conv of at most
  // kSmallConvOutput output elements, not only those with fewer positions than channels
  // (tiny_plane_conv), made ResNet-18's captured batch-1 evaluation 345 and 351 us against
  // 510 and 512 (an H200, 2026-11-28, tools/gpu-run.sh ab-infer, two rounds; 1.22 and 1.27 ms
  // with none). Training batches have larger outputs and keep their conv kernels.
  t.conv_as_matmul = compiler::conv_im2col_rule(compiler::small_output_conv);
  return t;
}

}  // namespace loom::runtime::cuda
