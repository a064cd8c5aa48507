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
// their float32 operands (and a bfloat16 one with a float32 one) to bfloat16 inside the graph, where fusion absorbs the casts; the
// product accumulates in float32 and is rounded once to bfloat16, as PyTorch's
// torch.autocast("cpu", torch.bfloat16) does, and the result comes back as float32. So
// losses, softmax, normalisation and its statistics, reductions, residual adds and the
// optimizer keep computing in float32 (a model may still store a result in bfloat16, see
// autocast_round below), parameters and checkpoints stay float32, and no loss
// scaling is needed (bfloat16 has float32's exponent range). The gradients follow the casts
// back: each matmul and convolution of the backward pass runs in bfloat16 and the gradients
// reaching float32 tensors are float32.
//
// A device that has no bfloat16 kernels computes the same rounding in float32
// (compiler/widen.h): the results are those of bfloat16, the speed that of float32.
// Scopes nest; Autocast(Precision::Float32) turns it off inside another. A captured step
// (compile.h) is replayed only under the precision it was captured with.
//
// autocast_round(x) is where a model stores an activation in bfloat16: inside a bfloat16
// scope it rounds a float32 x to bfloat16 and widens it back, so the compiled step keeps the
// 2-byte value and its readers widen it as they load it (inside their fused kernels). The
// ResNets call it on each residual block's sum and on the stem's batch norm, the tensors
// read by the next block's conv, its skip path and the backward pass: this is the precision
// PyTorch's autocast stores them in (its batch norm and residual add run on the convs'
// bfloat16 outputs), at half the memory traffic of float32. The gradient flowing back
// through it is rounded to bfloat16 likewise, as in PyTorch.
#pragma once

#include <loom/dtype.h>

#include <string_view>

namespace loom {

class Tensor;

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

// Inside a bfloat16 scope, a float32 x rounded to bfloat16 and widened back (still float32,
// bfloat16's values); elsewhere, or for another dtype, x itself. See above.
Tensor autocast_round(const Tensor& x);

}  // namespace loom
