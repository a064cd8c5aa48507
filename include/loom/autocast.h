// Mixed precision: matmuls and convolutions in bfloat16, everything else in float32.
//
//   loom::Tensor loss;
//   {
//     loom::Autocast bf16(loom::Precision::BFloat16);
//     loss = loom::nn::functional::cross_entropy(net->forward(x), y);
//   }
//   loss.backward();                                      // backward GEMMs in bfloat16 too
//   loom::optim::optimizer_step(opt, /*barrier=*/true);   // float32 weights and state
//
// Inside a scope on this thread, matmul (so linear layers and attention) and conv2d cast
// their float32 operands to bfloat16 inside the graph, where fusion absorbs the casts; the
// product accumulates in float32 and is rounded once to bfloat16, as PyTorch's
// torch.autocast("cpu", torch.bfloat16) does, and the result comes back as float32. So
// losses, softmax, normalisation and its statistics, reductions, residual adds and the
// optimizer keep computing in float32, parameters and checkpoints stay float32, and no loss
// scaling is needed (bfloat16 has float32's exponent range). The gradients follow the casts
// back: each matmul and convolution of the backward pass runs in bfloat16 and the gradients
// reaching float32 tensors are float32.
//
// A device that has no bfloat16 kernels computes the same rounding in float32
// (compiler/widen.h): the results are those of bfloat16, the speed that of float32.
// Scopes nest; Autocast(Precision::Float32) turns it off inside another. A captured step
// (compile.h) is replayed only under the precision it was captured with.
#pragma once

#include <loom/dtype.h>

#include <string_view>

namespace loom {

enum class Precision { Float32, BFloat16 };

// "fp32" or "bf16" (also "float32", "bfloat16"); throws naming the accepted spellings.
Precision parse_precision(std::string_view text);
const char* precision_name(Precision p);  // "fp32", "bf16"

// This thread's precision: Float32 outside every Autocast scope.
Precision autocast_precision();

class Autocast {
 public:
  explicit Autocast(Precision p = Precision::BFloat16);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  Precision previous_;
};

}  // namespace loom
