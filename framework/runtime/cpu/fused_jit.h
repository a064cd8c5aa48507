// A fusion's per-element steps as machine code (x86-64, AVX-512 or AVX2), made once per compiled
// program with Xbyak: one loop over a sub-block in which every value stays in a vector
// register, where the block evaluator (kernels_fused.cpp) runs each step as its own loop over
// the sub-block and keeps the values between steps in L1. A chain of steps then costs what its
// loads and its store cost, and it runs at the memory's speed instead of the evaluator's.
//
//   auto code = FusedCode::compile(fusion, loads, out);  // nullptr: the evaluator runs it
//   code->run(values, out, n);  // per sub-block: values[v] points at value v's elements
//
// The code computes what run_step computes, bit for bit: one IEEE operation per arithmetic
// step (never contracted into an FMA), the same NaN and signed-zero rules for comparisons,
// maximum, minimum, relu and where, the same rounding to bfloat16. Steps the code does not
// take (pow, and transcendental functions such as tanh, log and erf, whose bits come from
// Eigen's and libm's approximations; exp, sigmoid and silu where fused_code_takes_exp says
// the evaluator runs this code's polynomial; sqrt and rsqrt are taken) leave the whole
// fusion to the evaluator. Steps whose operands are all
// splats (constants, per-channel values) are computed by the evaluator, once per sub-block,
// and read by the code as one value each.
//
// With AVX-512 (F and VL) the code works on 16 lanes, with AVX2 on 8. It reads bfloat16
// operands and writes a bfloat16 result itself (a widening is a shift; a rounding leaves a
// bfloat16 in the top half of each float, and is one instruction where the CPU has
// AVX512_BF16), so a channels-last bfloat16 batch norm reads and writes each element once, with
// no conversion pass in between; it reads bool operands and writes a bool result (a mask)
// itself too.
#pragma once

#include "ir/program.h"

#include <cstdint>
#include <memory>
#include <vector>

namespace loom::runtime {

// The instruction sets the code is generated for. Avx512Bf16 is AVX-512 that also rounds to
// bfloat16 with the AVX512_BF16 conversion (vcvtneps2bf16, with AVX512_DQ's vfpclassps to find
// the subnormal lanes it flushes, which take the integer rounding instead: the same bits).
enum class FusedIsa { Avx2, Avx512, Avx512Bf16 };

// Whether the code on isa works on 16 lanes with AVX-512 (reads bfloat16 and bool operands,
// writes bfloat16 and bool results itself).
inline bool is_avx512(FusedIsa isa) { return isa != FusedIsa::Avx2; }

// The floats in one of the code's vectors on isa (a fold's row width is a multiple of it).
inline int fused_lanes(FusedIsa isa) { return is_avx512(isa) ? 16 : 8; }

const char* fused_isa_name(FusedIsa isa);

// The instruction sets this CPU runs fused code in, the best last; empty: no code (a CPU without
// AVX2, another architecture, or LOOM_FUSED_JIT=0). LOOM_FUSED_JIT=avx2 keeps AVX2 only, and
// LOOM_FUSED_JIT=avx512 leaves out Avx512Bf16 (for measurements). Read once.
const std::vector<FusedIsa>& fused_isas();

// Whether there is any fused code here (fused_isas() is not empty).
bool fused_jit_available();

// Whether the code on isa takes exp, sigmoid and silu: where its polynomials are those the
// evaluator runs in this build (Eigen's AVX-512 exp with AVX-512, its generic 8-lane exp in a
// build for AVX2 below AVX-512); elsewhere those fusions stay on the evaluator.
bool fused_code_takes_exp(FusedIsa isa);

class FusedCode {
 public:
  // How the code reads one of the fusion's loads over a sub-block.
  enum class Load : uint8_t {
    Elements,          // float32 elements (in place, or converted into a register first)
    Splat,             // one value (the evaluator's splat)
    BFloat16Elements,  // bfloat16 elements, in place
    BoolElements,      // bool elements (bytes 0 or 1), in place
  };

  // The code for float32 fusion `f` over loads read as `loads` says, writing its result in
  // `out` (Float32; BFloat16 when the last step rounds to bfloat16, or Bool, both stored by the
  // code itself, see run_narrow; the code also writes float32, see run); nullptr where it does
  // not apply: another compute type, a step it does not take, more live values than
  // registers, isa not in fused_isas(). With fold_width (a fixed row width, 8, 16, 32 or 64,
  // that is a multiple of the isa's lanes: 8 from AVX2, 16 from AVX-512) the code can also fold
  // its result in rows of that width (fold_rows), where its registers allow.
  static std::unique_ptr<const FusedCode> compile(const ir::Fusion& f, const std::vector<Load>& loads,
                                                  DType out, FusedIsa isa, int fold_width = 0);
  // Code that only folds (fold_rows, not run): values `folded` of f (several prologues'
  // results, merged into one fusion by stacked reductions), folded together in rows of `width`
  // (as compile's fold_width), value folded[j] into sums + j * width. nullptr where it does
  // not apply (as compile; a folded value computed before; too many registers).
  static std::unique_ptr<const FusedCode> compile_fold(const ir::Fusion& f,
                                                       const std::vector<Load>& loads,
                                                       FusedIsa isa, int width,
                                                       const std::vector<int>& folded);
  ~FusedCode();
  FusedCode(const FusedCode&) = delete;
  FusedCode& operator=(const FusedCode&) = delete;

  // Per value of the fusion (loads, then steps): computed before run, by the evaluator, as one
  // value (a splat load, or a step on splats only). The code reads these and the other loads
  // and computes the remaining steps.
  const std::vector<bool>& before() const { return before_; }
  // How each load is read (compile's `loads`, with BFloat16Elements and BoolElements only
  // where the code takes them).
  const std::vector<Load>& loads() const { return loads_; }
  FusedIsa isa() const { return isa_; }
  // Whether run_narrow writes the result in narrow_dtype() (BFloat16 or Bool).
  bool narrows() const { return narrow_ != nullptr; }
  DType narrow_dtype() const { return narrow_dtype_; }

  // out[0, n) = the fusion's last value over one sub-block, as float32. values[v], for each
  // value v that before() marks or that is a load, points at its one value (a splat) or at its n
  // elements (bfloat16 or bool ones where loads() says so).
  void run(const void* const* values, float* out, int64_t n) const { fn_(values, out, n); }
  // The same, stored as narrow_dtype() (narrows() only): bfloat16 (the rounded floats' top
  // halves), or bool (1 where the value is not 0, NaN included, else 0).
  void run_narrow(const void* const* values, void* out, int64_t n) const { narrow_(values, out, n); }

  // The row width fold_rows takes; 0: the code does not fold.
  int fold_width() const { return fold_width_; }
  // For a column sum over rows of fold_width() values (a channels-last per-channel statistic),
  // n elements (a multiple of 8 * fold_width(), the first at a row group's start) folded
  // straight from registers, nothing stored: per group of 8 rows and per column, the rows'
  // values added in float as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), which is
  // widened and added to sums[column] (double); code from compile_fold folds each of its values
  // so, into sums + j * fold_width(). kernels_reduce.cpp's fold_fixed_rows folds the same groups
  // the same way, to the bit. values as for run.
  void fold_rows(const void* const* values, double* sums, int64_t n) const {
    fold_(values, sums, n);
  }

 private:
  struct Generator;
  using Fn = void (*)(const void* const*, void*, int64_t);
  using FoldFn = void (*)(const void* const*, double*, int64_t);
  FusedCode() = default;

  std::unique_ptr<Generator> gen_, narrow_gen_, fold_gen_;
  Fn fn_ = nullptr, narrow_ = nullptr;
  FoldFn fold_ = nullptr;
  int fold_width_ = 0;
  std::vector<bool> before_;
  std::vector<Load> loads_;
  FusedIsa isa_ = FusedIsa::Avx2;
  DType narrow_dtype_ = DType::Float32;
};

}  // namespace loom::runtime
