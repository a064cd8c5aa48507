// Private to fused_jit.cpp and fused_jit_steps.cpp: FusedCode's generator (fused_jit.h), its
// registers and labels. fused_jit.cpp has its loops (plan, emit, fold_loop, the loads and the
// stores) and FusedCode::compile; fused_jit_steps.cpp the instructions of each step (compute)
// and the roundings and polynomials they use.
#pragma once

#if defined(__x86_64__)
#include "runtime/cpu/fused_jit.h"

#include <xbyak/xbyak.h>

#include <array>
#include <bit>
#include <cassert>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <vector>

namespace loom::runtime {
namespace fused_jit {

// vcmpps predicates (quiet: NaN operands raise no flag, which changes no result).
constexpr uint8_t kEq = 0x00, kLt = 0x11, kLe = 0x12, kNe = 0x04, kGe = 0x1D, kGt = 0x1E,
                  kUnordered = 0x03;

// Thrown while generating where the fusion does not fit the code (registers); compile then
// returns nullptr.
struct DoesNotFit {};

}  // namespace fused_jit

struct FusedCode::Generator : Xbyak::CodeGenerator {
  static constexpr int kZero = 30;  // AVX-512: a zero vector throughout
  // fold_rows: the partial sums of a group of rows, three per folded result, take zmm31 and
  // then zmm27, zmm26, ... down (AVX-512), or ymm15 (the tail's mask, which folds have no use
  // for) and then ymm12, ymm11, ... down (AVX2); values keep the registers below them.
  static constexpr int kMaxFolded = 6;
  int fold_partial(int k) const {
    if (wide_) return k == 0 ? 31 : 28 - k;
    return k == 0 ? 15 : 13 - k;
  }
  // The vector registers values take: zmm0-zmm27 or ymm0-ymm12, less the folds' partials.
  static int value_registers(bool wide, int fold_width, std::size_t folded) {
    const int partials = fold_width ? 3 * static_cast<int>(folded) - 1 : 0;
    return (wide ? 28 : 13) - partials;
  }

  // The code for fusion f on isa, its loads read as `loads` say, its result stored as out
  // (Float32 or BFloat16); or, with fold_width (a multiple of the lanes), values `folded` (the
  // last value where empty) folded in rows of that many values (FusedCode::fold_rows) instead.
  Generator(const ir::Fusion& f, const std::vector<bool>& before, const std::vector<Load>& loads,
            FusedIsa isa, DType out, int fold_width = 0, std::vector<int> folded = {})
      : Xbyak::CodeGenerator(4096, Xbyak::AutoGrow), f_(f), before_(before), loads_(loads),
        wide_(is_avx512(isa)), bf16_(isa == FusedIsa::Avx512Bf16), lanes_(fused_lanes(isa)),
        folded_(fold_width && folded.empty()
                    ? std::vector<int>{static_cast<int>(f.loads.size() + f.steps.size()) - 1}
                    : std::move(folded)),
        value_regs_(value_registers(wide_, fold_width, folded_.size())),
        narrow_out_(out == DType::BFloat16), bool_out_(out == DType::Bool),
        fold_width_(fold_width),
        n_loads_(static_cast<int>(f.loads.size())),
        n_values_(n_loads_ + static_cast<int>(f.steps.size())) {
    assert(fold_width % lanes_ == 0 && "fused code: a fold it cannot do");
    if (static_cast<int>(folded_.size()) > kMaxFolded || value_regs_ < 1)
      throw fused_jit::DoesNotFit{};
    plan();
    emit();
  }

 private:
  // Which general register holds each element load's pointer, and the last step (as a value
  // index) that reads each value.
  void plan();

  // AVX2's tail with bfloat16 or bool operands or result: n % 8 (rdx) and the operands' last
  // elements staged on the stack (fused_jit.cpp); the byte offset of slot i from rsp.
  void stage_tail();
  static int tail_at(int slot) { return 16 * (slot + 1); }
  void copy_tail(int size, const Xbyak::RegExp& source, const Xbyak::RegExp& destination);
  void store_packed(const Xbyak::Xmm& x, int size, bool masked);

  // Vector register r at the code's width.
  Xbyak::Xmm vec(int r) const {
    if (wide_) return Xbyak::Zmm(r);
    return Xbyak::Ymm(r);
  }

  void emit();

  // Constants, a vector each, then (AVX2) the tail masks (entry j: the first j lanes set).
  void emit_constants(Xbyak::Label& consts);

  // The constants' addresses (emit's table order).
  Xbyak::Address constant(int index) { return ptr[rip + *consts_ + 4 * lanes_ * index]; }
  Xbyak::Address one() { return constant(0); }
  Xbyak::Address sign_bit() { return constant(1); }
  Xbyak::Address magnitude() { return constant(2); }
  Xbyak::Address int_one() { return constant(3); }
  Xbyak::Address round_half() { return constant(4); }
  Xbyak::Address high_half() { return constant(5); }
  Xbyak::Address infinity_bits() { return constant(6); }
  Xbyak::Address quiet_bit() { return constant(7); }
  // The constants of Eigen 3.4's pexp<Packet16f> (Eigen/src/Core/arch/AVX512/MathFunctions.h),
  // after the table above.
  static constexpr float kPolynomialConstants[] = {
      88.3762626647950f,      // exp_hi
      -88.3762626647949f,     // exp_lo
      0.5f,                   // half
      1.44269504088896341f,   // cephes_LOG2EF
      -0.6931471805599453f,   // nln2
      1.9875691500E-4f,       // cephes_exp_p0 .. p5
      1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f,
      127.0f,
      // Eigen 3.4's generic pexp_float (GenericPacketMathFunctions.h), which Packet8f runs,
      // where it differs from the above: its clamp, ln 2 in two parts, and pldexp_generic's
      // exponent bound and bias (the bias an integer).
      88.723f, -88.723f,                    // cst_exp_hi, cst_exp_lo
      -0.693359375f, 2.12194440e-4f,        // cst_cephes_exp_C1, C2
      278.0f, -278.0f,                      // max_exponent, its negation
      std::bit_cast<float>(127u),           // bias
      88.72283172607422f};                  // exp_overflow_bound (fused_steps.h)
  // vpshufb's selection of each float's upper half, packed in the low 8 bytes of each 128-bit
  // lane (round_to_words), after the polynomials' constants.
  static constexpr uint32_t kHighWords[] = {0x07060302u, 0x0f0e0b0au, 0x80808080u, 0x80808080u};
  Xbyak::Address high_words() {
    return constant(8 + static_cast<int>(std::size(kPolynomialConstants)));
  }
  // The same halves packed in the high 8 bytes of each lane (pair_loop's second vector).
  static constexpr uint32_t kHighWordsUp[] = {0x80808080u, 0x80808080u, 0x07060302u, 0x0f0e0b0au};
  Xbyak::Address high_words_up() {
    return constant(9 + static_cast<int>(std::size(kPolynomialConstants)));
  }
  Xbyak::Address exp_constant(int index) { return constant(8 + index); }
  Xbyak::Address generic_exp_constant(int index) { return constant(8 + 12 + index); }
  Xbyak::Address exp_overflow() { return constant(8 + 12 + 7); }

  // d = exp(x) with the bits of the exp the evaluator's vector_map runs on every element:
  // Eigen's pexp<Packet16f> (AVX-512) or its generic pexp_float over Packet8f (AVX2), the same
  // operations on the same operands in the same order, each min/max with Eigen's operand order
  // (it decides NaN) and each pmadd one fused multiply-add.
  // Six temporaries from the value registers (DoesNotFit when they are taken), never x's,
  // which the final max reads again; d may be x's register (the max writes it last).
  void exp(const Xbyak::Xmm& d, const Xbyak::Xmm& x);

  // d = 1 / (1 + exp(-x)) (sigmoid), or x / (1 + exp(-x)) (silu, times_x), with the bits of
  // the evaluator's logistic (fused_steps.h): exp above, one add, one division. d may be x's
  // register.
  void logistic(const Xbyak::Xmm& d, const Xbyak::Xmm& x, bool times_x);

  int allocate();

  // The register of operand value u at step v, loading an element load at its first use.
  Xbyak::Xmm operand(int u, bool masked);

  // d = (x predicate y) ? 1 : 0.
  void set_if(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Xmm& y, uint8_t predicate);

  // d = mask ? t : f, mask being k2 (AVX-512) or s1's sign bits (AVX2).
  void select(const Xbyak::Xmm& d, const Xbyak::Xmm& t, const Xbyak::Xmm& f, const Xbyak::Xmm& s1);

  // d = x & y and d = x | y on 32-bit lanes (EVEX forms under AVX-512, for zmm16-zmm31).
  void bits_and(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y);
  void bits_or(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y);

  // A zero vector: AVX-512's zmm30, zeroed once on entry; under AVX2 s, zeroed here.
  Xbyak::Xmm zero(const Xbyak::Xmm& s);

  // Whether step v's second operand u is read straight from memory by the arithmetic
  // instruction (a float32 element load that nothing else reads, in the full vectors only).
  bool folds(const ir::FusedStep& s, int v, bool masked) const;

  // d = a rounded to bfloat16 (bfloat16::round_bits: (u + 0x7fff + (u >> 16 & 1)) &
  // 0xffff0000, and a NaN, its magnitude above infinity's bits, keeps its upper half with the
  // quiet bit set), a float32 whose low half is zero; integer steps on s1 and s2.
  void round_bits(const Xbyak::Xmm& d, const Xbyak::Xmm& a);

  // The AVX512_BF16 rounding of a's 16 lanes into the words of `words` (a ymm): vcvtneps2bf16
  // rounds as round_bits does except in subnormal lanes, which it flushes to zero. A vector
  // with such a lane (rare: below 1.2e-38) jumps out of the loop to cold code that rounds as
  // round_bits into d and narrows that into words, then comes back.
  void convert_bf16(const Xbyak::Ymm& words, const Xbyak::Xmm& d, const Xbyak::Xmm& a);

  // AVX2, a bfloat16 result: a rounded as round_bits rounds, its 8 upper halves packed into
  // the low 16 bytes of d as the words to store (store_packed), in fewer steps than
  // round_bits and a narrowing: no masking of the low halves, which the packing drops, and
  // NaN lanes found by an unordered compare.
  void round_to_words(const Xbyak::Xmm& d, const Xbyak::Xmm& a);

  // round_to_words' rounding, d = a (d may be a) with each upper half rounded as round_bits
  // rounds it (the lower halves are left over); without_nan: for lanes known not to be NaN
  // (the add alone).
  void round_upper(const Xbyak::Xmm& d, const Xbyak::Xmm& a, bool without_nan);

  // AVX2, a bfloat16 result: the full vectors two at a time (16 elements), from rax up to rcx
  // (a multiple of 16). The two vectors' values are computed unrounded (defer_rounding_), one
  // unordered compare over both finds whether either has a NaN lane, and only then does the
  // rounding take round_to_words' NaN steps (cold code); the two packs of words are blended
  // and stored as one 32-byte store: after the steps, 21 instructions a pair where body and
  // its loop take 26.
  void pair_loop();

  // d = a rounded to bfloat16, as round_bits; the AVX512_BF16 conversion where the code has it
  // (full vectors only), widened back.
  void round_to_bfloat16(const Xbyak::Xmm& d, const Xbyak::Xmm& a, bool masked);

  // fold_rows' loop (rsi: the double sums, rdx: n, a multiple of 8 * width): rows of `width`
  // values taken in groups of 8 from element 0; per group, per folded value and per column the
  // 8 values are added in float as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), that sum
  // widened to double and added to the column's sum (folded value j's at rsi + j * width), as
  // kernels_reduce.cpp's fold_fixed_rows does, to the bit. A group is computed a column vector
  // (16 or 8 columns, the lanes) at a time, its 8 rows one after another, so each tree needs
  // three partials; rcx is the group's first element and rax the vector's (the body's index).
  void fold_loop();

  // One vector (rax: its first element) of every step, the result stored.
  void body(bool masked);

  // Computes the steps for one vector (rax: its first element); returns the last value's
  // register. A bfloat16 result of full vectors with AVX512_BF16 also leaves its words in s2's
  // ymm, and one on AVX2 leaves them in the register returned (result_words_); store stores
  // them.
  Xbyak::Xmm compute(bool masked);

  // Stores the result vector as the code's result type.
  void store(const Xbyak::Xmm& result, bool masked);

  // Frees the registers of the steps' values, leaving only the values computed before.
  void release();

  const ir::Fusion& f_;  // read while generating only
  const std::vector<bool> before_;
  const std::vector<Load> loads_;
  const bool wide_;         // AVX-512: zmm registers, k masks
  const bool bf16_;         // AVX512_BF16 roundings (convert_bf16)
  const int lanes_;         // floats per vector
  const std::vector<int> folded_;  // the values fold_rows folds (value_regs_ counts them)
  const int value_regs_;    // vector registers for values: 0 .. value_regs_ - 1
  const bool narrow_out_;   // the result is stored as bfloat16
  const bool bool_out_;     // the result is stored as bool
  const int fold_width_;    // fold_rows' row width; 0: the result is stored
  const int n_loads_, n_values_;
  std::vector<int> last_use_;
  std::vector<int> uses_;  // per value: the operands that read it, counted per step
  std::vector<Xbyak::Reg64> pointer_;
  std::vector<bool> has_pointer_;
  std::vector<Xbyak::Reg64> saved_;
  std::array<bool, 28> free_{};
  std::vector<int> register_of_;  // per value: its vector register now, -1: none
  Xbyak::Label* consts_ = nullptr;
  std::deque<Xbyak::Label> labels_;            // convert_bf16's, which cold_ refers to
  std::vector<std::function<void()>> cold_;  // emitted after the function's ret
  Xbyak::Label masks_;
  std::vector<int> tail_slot_;  // per load: its stack slot in AVX2's tail, -1: none
  int out_slot_ = -1;           // a bfloat16 or bool result's slot there
  int tail_bytes_ = 0;          // the stack the tail takes; 0: none
  bool result_words_ = false;   // compute left the result as words (round_to_words)
  bool defer_rounding_ = false; // AVX2: compute leaves the bfloat16 result unrounded (pair_loop)
};

}  // namespace loom::runtime

#endif  // defined(__x86_64__)
