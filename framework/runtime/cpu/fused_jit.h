// A fusion's per-element steps as machine code (x86-64, AVX2), made once per compiled program
// with Xbyak: one loop over a sub-block in which every value stays in a vector register, where
// the block evaluator (kernels_fused.cpp) runs each step as its own loop over the sub-block and
// keeps the values between steps in L1. A chain of steps then costs what its loads and its
// store cost, and it runs at the memory's speed instead of the evaluator's.
//
//   auto code = FusedCode::compile(fusion, splat_loads);  // nullptr: the evaluator runs it
//   code->run(values, out, n);  // per sub-block: values[v] points at value v's elements
//
// The code computes what run_step computes, bit for bit: one IEEE operation per arithmetic
// step (never contracted into an FMA), the same NaN and signed-zero rules for comparisons,
// maximum, minimum, relu and where, the same rounding to bfloat16. Steps the code does not
// take (transcendental functions, sqrt, pow: their bits come from Eigen's and libm's
// approximations) leave the whole fusion to the evaluator. Steps whose operands are all
// splats (constants, per-channel values) are computed by the evaluator, once per sub-block,
// and read by the code as one value each.
#pragma once

#include "ir/program.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace loom::runtime {

class FusedCode {
 public:
  // The code for float32 fusion `f`, whose loads k with splat_loads[k] are read as one value
  // (the evaluator's splats) and the others as contiguous elements; nullptr where it does not
  // apply: another compute type, a step it does not take, more live values than registers, a
  // CPU without AVX2, or LOOM_FUSED_JIT=0 (read once; for measurements and bisection).
  static std::unique_ptr<const FusedCode> compile(const ir::Fusion& f,
                                                  const std::vector<bool>& splat_loads);
  ~FusedCode();
  FusedCode(const FusedCode&) = delete;
  FusedCode& operator=(const FusedCode&) = delete;

  // Per value of the fusion (loads, then steps): computed before run, by the evaluator, as one
  // value (a splat load, or a step on splats only). The code reads these and the other loads
  // and computes the remaining steps.
  const std::vector<bool>& before() const { return before_; }

  // out[0, n) = the fusion's last value over one sub-block. values[v], for each value v that
  // before() marks or that is a load, points at its one value (a splat) or at its n elements.
  void run(const float* const* values, float* out, int64_t n) const { fn_(values, out, n); }

 private:
  struct Generator;
  using Fn = void (*)(const float* const*, float*, int64_t);
  FusedCode() = default;

  std::unique_ptr<Generator> gen_;
  Fn fn_ = nullptr;
  std::vector<bool> before_;
};

// Whether FusedCode::compile makes code here (AVX2, and LOOM_FUSED_JIT is not 0).
bool fused_jit_available();

}  // namespace loom::runtime
