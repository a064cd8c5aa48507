// The autocast scope (include/loom/autocast.h): a thread-local precision that matmul and
// conv2d (ops_compute.cpp) read through lazy::autocasts, and autocast_round.
#include "lazy/ops_util.h"

#include <loom/autocast.h>
#include <loom/error.h>
#include <loom/tensor.h>

#include <string>

namespace loom {
namespace {
thread_local Precision current = Precision::Float32;
}  // namespace

Precision parse_precision(std::string_view text) {
  if (text == "fp32" || text == "float32") return Precision::Float32;
  if (text == "bf16" || text == "bfloat16") return Precision::BFloat16;
  throw Error("unknown precision '" + std::string(text) + "' (expected fp32, bf16, float32 or bfloat16)");
}

const char* precision_name(Precision p) { return p == Precision::BFloat16 ? "bf16" : "fp32"; }

Precision autocast_precision() { return current; }

Autocast::Autocast(Precision p) : previous_(current) { current = p; }
Autocast::~Autocast() { current = previous_; }

Tensor autocast_round(const Tensor& x) {
  if (current != Precision::BFloat16 || !x.defined() || x.dtype() != DType::Float32) return x;
  return x.to(DType::BFloat16).to(DType::Float32);
}

namespace lazy {

bool autocasts(const Tensor& a, const Tensor& b) {
  // A float32 operand with a float32 or bfloat16 one (PyTorch casts both; two bfloat16
  // operands make the plain bfloat16 op, its result bfloat16).
  auto eligible = [](DType d) { return d == DType::Float32 || d == DType::BFloat16; };
  return current == Precision::BFloat16 && eligible(a.dtype()) && eligible(b.dtype()) &&
         (a.dtype() == DType::Float32 || b.dtype() == DType::Float32);
}

}  // namespace lazy
}  // namespace loom
