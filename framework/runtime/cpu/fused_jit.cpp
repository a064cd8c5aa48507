// FusedCode (fused_jit.h): the loop a fusion's per-element steps compile to.
//
// The generated function, for n elements and L lanes (16 with AVX-512, 8 with AVX2):
//
//   load the pointers of the element loads into general registers; broadcast each value
//   computed before (splats) into a vector register of its own
//   for i in [0, n rounded down to L) step L:  each step on L lanes, operands loaded at their
//       first use (a bfloat16 one widened by a shift), registers freed after their last; the
//       last value stored to out + i (as float32, its top halves as bfloat16, or bool bytes)
//   if n % L: the same body once more with masked loads and stores (masked lanes are never
//       read or written, so nothing is touched beyond the operands)
//   return; then the cold code of the roundings to bfloat16 (Avx512Bf16: a vector with a
//       subnormal lane jumps there, is rounded with integer steps, and jumps back)
//
// Registers: rdi: the value pointers, rsi: out, rdx: n, rax: the index of the current element,
// rcx: the end of the full vectors; up to 10 element loads get a register each (r8-r11, rbx,
// rbp, r12-r15, the last six saved and restored). AVX-512: zmm0-zmm27 hold values, zmm28-zmm29
// are scratch for the steps that take two instructions or more, zmm30 is zero, k1 is the tail's
// lane mask and k2-k3 hold comparisons. AVX2: ymm0-ymm12 hold values, ymm13-ymm14 are scratch, ymm15 is the
// tail's lane mask. A fusion needing more at once is left to the evaluator (there are no spills).
// An arithmetic step's second operand, when it is a float32 load nothing else reads, is read
// straight from memory by the instruction in the full vectors.
#include "runtime/cpu/fused_jit.h"

#include "ir/unreachable.h"

#if defined(__x86_64__)
#include <xbyak/xbyak.h>
#include <xbyak/xbyak_util.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <stdexcept>

namespace loom::runtime {

#if defined(__x86_64__)
namespace {

using ir::Op;

// vcmpps predicates (quiet: NaN operands raise no flag, which changes no result).
constexpr uint8_t kEq = 0x00, kLt = 0x11, kLe = 0x12, kNe = 0x04, kGe = 0x1D, kGt = 0x1E,
                  kUnordered = 0x03;

// Whether the evaluator's exp and logistic are Eigen's AVX-512 float polynomials
// (pexp<Packet16f>, scalar_logistic_op<float> with FMA), which the AVX-512 code reproduces
// instruction for instruction (Generator::exp, Generator::logistic).
#if defined(__AVX512F__) && defined(__FMA__)
constexpr bool kEigenAvx512Exp = true;
#else
constexpr bool kEigenAvx512Exp = false;
#endif

// Whether the code takes step op on isa (as a per-element step; Constant is always computed
// before).
bool takes(const ir::FusedStep& s, FusedIsa isa) {
  if (s.op == Op::Exp || s.op == Op::Sigmoid || s.op == Op::Silu)
    return kEigenAvx512Exp && is_avx512(isa);
  switch (s.op) {
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Maximum: case Op::Minimum:
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Where:
    case Op::Neg: case Op::Abs: case Op::Relu: case Op::LogicalNot: case Op::Cast:
    case Op::Sqrt: case Op::Rsqrt:
      return true;
    default:
      return false;
  }
}

// Thrown while generating where the fusion does not fit the code (registers); compile then
// returns nullptr.
struct DoesNotFit {};

}  // namespace

struct FusedCode::Generator : Xbyak::CodeGenerator {
  static constexpr int kZero = 30;  // AVX-512: a zero vector throughout
  // fold_rows: the partial sums of a group of rows, three per folded result, take zmm31 and
  // then zmm27, zmm26, ... down; values keep the registers below them.
  static constexpr int kMaxFolded = 6;
  static int fold_partial(int k) { return k == 0 ? 31 : 28 - k; }

  // The code for fusion f on isa, its loads read as `loads` say, its result stored as out
  // (Float32 or BFloat16); or, with fold_width (AVX-512 only), values `folded` (the last
  // value where empty) folded in rows of that many values (FusedCode::fold_rows) instead.
  Generator(const ir::Fusion& f, const std::vector<bool>& before, const std::vector<Load>& loads,
            FusedIsa isa, DType out, int fold_width = 0, std::vector<int> folded = {})
      : Xbyak::CodeGenerator(4096, Xbyak::AutoGrow), f_(f), before_(before), loads_(loads),
        wide_(is_avx512(isa)), bf16_(isa == FusedIsa::Avx512Bf16), lanes_(wide_ ? 16 : 8),
        folded_(fold_width && folded.empty()
                    ? std::vector<int>{static_cast<int>(f.loads.size() + f.steps.size()) - 1}
                    : std::move(folded)),
        value_regs_(wide_ ? 28 - (fold_width ? 3 * static_cast<int>(folded_.size()) - 1 : 0) : 13),
        narrow_out_(out == DType::BFloat16), bool_out_(out == DType::Bool),
        fold_width_(fold_width),
        n_loads_(static_cast<int>(f.loads.size())),
        n_values_(n_loads_ + static_cast<int>(f.steps.size())) {
    assert((!fold_width || (wide_ && fold_width % 16 == 0)) && "fused code: a fold it cannot do");
    if (static_cast<int>(folded_.size()) > kMaxFolded) throw DoesNotFit{};
    plan();
    emit();
  }

 private:
  // Which general register holds each element load's pointer, and the last step (as a value
  // index) that reads each value.
  void plan() {
    last_use_.assign(n_values_, -1);
    uses_.assign(n_values_, 0);
    for (int v = n_loads_; v < n_values_; ++v) {
      if (before_[v]) continue;
      const auto& s = f_.steps[v - n_loads_];
      for (int u : {s.a, s.b, s.c})
        if (u >= 0) {
          last_use_[u] = v;
          ++uses_[u];
        }
    }
    static const Xbyak::Reg64 kPointerRegs[] = {r8, r9, r10, r11, rbx, rbp, r12, r13, r14, r15};
    pointer_.assign(n_loads_, Xbyak::Reg64());
    has_pointer_.assign(n_loads_, false);
    int used = 0;
    for (int k = 0; k < n_loads_; ++k) {
      if (before_[k] || last_use_[k] < 0) continue;
      if (used == static_cast<int>(std::size(kPointerRegs))) throw DoesNotFit{};
      pointer_[k] = kPointerRegs[used++];
      has_pointer_[k] = true;
    }
    saved_.clear();
    for (int i = 4; i < used; ++i) saved_.push_back(kPointerRegs[i]);
  }

  // Vector register r at the code's width.
  Xbyak::Xmm vec(int r) const {
    if (wide_) return Xbyak::Zmm(r);
    return Xbyak::Ymm(r);
  }

  void emit() {
    Xbyak::Label loop, tail, done, consts;
    consts_ = &consts;
    for (const auto& r : saved_) push(r);
    for (int k = 0; k < n_loads_; ++k)
      if (has_pointer_[k]) mov(pointer_[k], ptr[rdi + 8 * k]);
    // The values computed before, one register each for the whole run.
    free_.fill(true);
    register_of_.assign(n_values_, -1);
    for (int v = 0; v < n_values_; ++v) {
      if (!before_[v] || last_use_[v] < 0) continue;
      const int r = allocate();
      mov(rcx, ptr[rdi + 8 * v]);
      vbroadcastss(vec(r), ptr[rcx]);
      register_of_[v] = r;
    }
    if (wide_) vpxord(Xbyak::Zmm(kZero), Xbyak::Zmm(kZero), Xbyak::Zmm(kZero));
    const auto invariant_free = free_;
    const auto invariant_regs = register_of_;
    if (fold_width_) {
      fold_loop();
      vzeroupper();
      for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) pop(*it);
      ret();
      for (auto& cold : cold_) cold();
      emit_constants(consts);
      return;
    }

    mov(rcx, rdx);
    and_(rcx, ~int64_t{lanes_ - 1});
    xor_(eax, eax);
    test(rcx, rcx);
    jz(tail, T_NEAR);
    L(loop);
    body(false);
    add(rax, lanes_);
    cmp(rax, rcx);
    jb(loop, T_NEAR);
    L(tail);
    and_(rdx, lanes_ - 1);
    jz(done, T_NEAR);
    if (wide_) {  // k1 = the first n % 16 lanes
      mov(rcx, rdx);
      mov(edx, 1);
      shl(edx, cl);
      dec(edx);
      kmovw(k1, edx);
    } else {
      shl(rdx, 5);
      lea(rcx, ptr[rip + masks_]);
      vmovups(ymm15, ptr[rcx + rdx]);
    }
    free_ = invariant_free;
    register_of_ = invariant_regs;
    body(true);
    L(done);
    vzeroupper();
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) pop(*it);
    ret();
    // The roundings' subnormal lanes, out of the loop (round_to_bfloat16).
    for (auto& cold : cold_) cold();
    emit_constants(consts);
  }

  // Constants, a vector each, then (AVX2) the tail masks (entry j: the first j lanes set).
  void emit_constants(Xbyak::Label& consts) {
    align(64);
    L(consts);
    for (uint32_t c : {0x3f800000u, 0x80000000u, 0x7fffffffu, 1u, 0x7fffu, 0xffff0000u,
                       0x7f800000u, 0x00400000u})
      for (int lane = 0; lane < lanes_; ++lane) dd(c);
    for (float c : kPolynomialConstants)
      for (int lane = 0; lane < lanes_; ++lane) dd(std::bit_cast<uint32_t>(c));
    if (!wide_) {
      L(masks_);
      for (int j = 0; j < 8; ++j)
        for (int lane = 0; lane < 8; ++lane) dd(lane < j ? 0xffffffffu : 0u);
    }
  }

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
  // The constants of Eigen 3.4's pexp<Packet16f> (Eigen/src/Core/arch/AVX512/MathFunctions.h)
  // and float logistic, after the table above.
  static constexpr float kPolynomialConstants[] = {
      88.3762626647950f,      // exp_hi
      -88.3762626647949f,     // exp_lo
      0.5f,                   // half
      1.44269504088896341f,   // cephes_LOG2EF
      -0.6931471805599453f,   // nln2
      1.9875691500E-4f,       // cephes_exp_p0 .. p5
      1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f,
      127.0f,
      // scalar_logistic_op<float> (Eigen/src/Core/functors/UnaryFunctors.h), with FMA:
      15.7243833541870117f,   // cutoff_upper
      -9.0f,                  // cutoff_lower
      2.48287947061529e-01f, 8.51377133304701e-03f, 6.08574864600143e-05f,  // alpha_1, 3, 5
      1.15627324459942e-07f, 4.37031012579801e-11f,                         // alpha_7, 9
      9.93151921023180e-01f, 1.16817656904453e-01f, 1.70198817374094e-03f,  // beta_0, 2, 4
      6.29106785017040e-06f, 5.76102136993427e-09f, 6.10247389755681e-13f};  // beta_6, 8, 10
  Xbyak::Address exp_constant(int index) { return constant(8 + index); }
  Xbyak::Address logistic_constant(int index) { return constant(8 + 12 + index); }

  // d = exp(x) with the bits of Eigen's pexp<Packet16f>, which the evaluator's vector_map
  // runs on every element: the same operations on the same operands in the same order, each
  // min/max with Eigen's operand order (it decides NaN) and each pmadd one fused multiply-add.
  // Six temporaries from the value registers (DoesNotFit when they are taken), never x's,
  // which the final max reads again; d may be x's register (the max writes it last).
  void exp(const Xbyak::Xmm& d, const Xbyak::Xmm& x) {
    const bool x_was_free = free_[static_cast<std::size_t>(x.getIdx())];
    free_[static_cast<std::size_t>(x.getIdx())] = false;
    int regs[6];
    for (int& r : regs) r = allocate();
    free_[static_cast<std::size_t>(x.getIdx())] = x_was_free;
    const Xbyak::Xmm t0 = vec(regs[0]), m = vec(regs[1]), r2 = vec(regs[2]), r3 = vec(regs[3]),
                     y = vec(regs[4]), y1 = vec(regs[5]);
    vmovups(t0, exp_constant(0));
    vminps(t0, t0, x);                       // pmin(_x, exp_hi) = min_ps(exp_hi, _x)
    vmovups(m, exp_constant(1));
    vmaxps(t0, m, t0);                       // pmax(., exp_lo) = max_ps(exp_lo, .)
    vmovups(m, exp_constant(2));
    vfmadd231ps(m, t0, exp_constant(3));     // x * LOG2EF + half
    vrndscaleps(m, m, 0x01);                 // floor
    vfmadd231ps(t0, m, exp_constant(4));     // r = m * nln2 + x
    vmulps(r2, t0, t0);                      // r2 = r * r
    vmulps(r3, r2, t0);                      // r3 = r2 * r
    vmovups(y, exp_constant(6));
    vfmadd231ps(y, t0, exp_constant(5));     // y = p0 * r + p1
    vmovups(y1, exp_constant(9));
    vfmadd231ps(y1, t0, exp_constant(8));    // y1 = p3 * r + p4
    vfmadd213ps(y, t0, exp_constant(7));     // y = y * r + p2
    vfmadd213ps(y1, t0, exp_constant(10));   // y1 = y1 * r + p5
    vaddps(t0, t0, one());                   // y2 = r + 1
    vfmadd213ps(y, r3, y1);                  // y = y * r3 + y1
    vfmadd213ps(y, r2, t0);                  // y = y * r2 + y2
    vaddps(m, m, exp_constant(11));          // m + 127
    vcvttps2dq(m, m);
    vpslld(m, m, 23);                        // 2^m
    vmulps(y, y, m);
    vmaxps(d, x, y);                         // pmax(y * 2^m, _x) = max_ps(_x, .)
    for (int r : regs) free_[r] = true;
  }

  // d = logistic(x), or x * logistic(x) (silu), with the bits of Eigen's float logistic: a
  // rational polynomial over x clamped above, and exp(x) in the lanes below -9, which Eigen
  // computes only when some lane of the vector is there (as here: a branch per vector, each
  // lane's value the same either way).
  void logistic(const Xbyak::Xmm& d, const Xbyak::Xmm& x, bool times_x) {
    const bool x_was_free = free_[static_cast<std::size_t>(x.getIdx())];
    free_[static_cast<std::size_t>(x.getIdx())] = false;
    int regs[4];
    for (int& r : regs) r = allocate();
    const Xbyak::Xmm c = vec(regs[0]), x2 = vec(regs[1]), p = vec(regs[2]), q = vec(regs[3]);
    vmovups(c, logistic_constant(0));
    vminps(c, c, x);                              // pmin(_x, cutoff_upper) = min_ps(cutoff, _x)
    vmulps(x2, c, c);
    vmovups(p, logistic_constant(5));
    vfmadd231ps(p, x2, logistic_constant(6));     // p = x2 * alpha_9 + alpha_7
    for (int k : {4, 3, 2}) vfmadd213ps(p, x2, logistic_constant(k));  // alpha_5, 3, 1
    vmulps(p, c, p);                              // p = x * p
    vmovups(q, logistic_constant(11));
    vfmadd231ps(q, x2, logistic_constant(12));    // q = x2 * beta_10 + beta_8
    for (int k : {10, 9, 8, 7}) vfmadd213ps(q, x2, logistic_constant(k));  // beta_6 .. beta_0
    vdivps(p, p, q);
    vaddps(p, p, exp_constant(2));                // + 0.5
    Xbyak::Label no_small;
    vcmpps(k3, x, logistic_constant(1), kLt);     // pcmp_lt(_x, cutoff_lower)
    kortestw(k3, k3);
    jz(no_small, T_NEAR);
    exp(q, x);                                    // q is free again: the polynomial is done
    vblendmps(p | k3, p, q);                      // pselect(lt, exp, logistic)
    L(no_small);
    if (times_x) vmulps(d, x, p);
    else vmovaps(d, p);
    for (int r : regs) free_[r] = true;
    free_[static_cast<std::size_t>(x.getIdx())] = x_was_free;
  }

  int allocate() {
    for (int r = 0; r < value_regs_; ++r)
      if (free_[r]) {
        free_[r] = false;
        return r;
      }
    throw DoesNotFit{};
  }

  // The register of operand value u at step v, loading an element load at its first use.
  Xbyak::Xmm operand(int u, bool masked) {
    if (register_of_[u] < 0) {
      assert(u < n_loads_ && has_pointer_[u] && "fused code: a value read before it is made");
      const int r = allocate();
      const Xbyak::Xmm y = vec(r);
      const Xbyak::Reg64 p = pointer_[u];
      if (loads_[u] == Load::BFloat16Elements) {  // AVX-512 only (compile)
        if (masked) vpmovzxwd(y | k1 | T_z, ptr[p + rax * 2]);
        else vpmovzxwd(y, ptr[p + rax * 2]);
        vpslld(y, y, 16);
      } else if (loads_[u] == Load::BoolElements) {  // AVX-512 only: bytes 0 or 1 to floats
        if (masked) vpmovzxbd(y | k1 | T_z, ptr[p + rax]);
        else vpmovzxbd(y, ptr[p + rax]);
        vcvtdq2ps(y, y);
      } else if (wide_) {
        if (masked) vmovups(y | k1 | T_z, ptr[p + rax * 4]);
        else vmovups(y, ptr[p + rax * 4]);
      } else {
        if (masked) vmaskmovps(y, ymm15, ptr[p + rax * 4]);
        else vmovups(y, ptr[p + rax * 4]);
      }
      register_of_[u] = r;
    }
    return vec(register_of_[u]);
  }

  // d = (x predicate y) ? 1 : 0.
  void set_if(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Xmm& y, uint8_t predicate) {
    if (wide_) {
      vcmpps(k2, x, y, predicate);
      vmovups(d | k2 | T_z, one());
    } else {
      vcmpps(ymm13, x, y, predicate);
      vandps(d, ymm13, one());
    }
  }

  // d = mask ? t : f, mask being k2 (AVX-512) or s1's sign bits (AVX2).
  void select(const Xbyak::Xmm& d, const Xbyak::Xmm& t, const Xbyak::Xmm& f, const Xbyak::Xmm& s1) {
    if (wide_) vblendmps(d | k2, f, t);
    else vblendvps(d, f, t, s1);
  }

  // d = x & y and d = x | y on 32-bit lanes (EVEX forms under AVX-512, for zmm16-zmm31).
  void bits_and(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y) {
    if (wide_) vpandd(d, x, y);
    else vpand(d, x, y);
  }
  void bits_or(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Operand& y) {
    if (wide_) vpord(d, x, y);
    else vpor(d, x, y);
  }

  // A zero vector: AVX-512's zmm30, zeroed once on entry; under AVX2 s, zeroed here.
  Xbyak::Xmm zero(const Xbyak::Xmm& s) {
    if (wide_) return Xbyak::Zmm(kZero);
    vxorps(s, s, s);
    return s;
  }

  // Whether step v's second operand u is read straight from memory by the arithmetic
  // instruction (a float32 element load that nothing else reads, in the full vectors only).
  bool folds(const ir::FusedStep& s, int v, bool masked) const {
    const int u = s.b;
    if (masked || u < 0 || u >= n_loads_ || !has_pointer_[u] || loads_[u] != Load::Elements) return false;
    if (uses_[u] != 1 || last_use_[u] != v) return false;
    return s.op == Op::Add || s.op == Op::Sub || s.op == Op::Mul || s.op == Op::Div;
  }

  // d = a rounded to bfloat16 (bfloat16::round_bits: (u + 0x7fff + (u >> 16 & 1)) &
  // 0xffff0000, and a NaN, its magnitude above infinity's bits, keeps its upper half with the
  // quiet bit set), a float32 whose low half is zero; integer steps on s1 and s2.
  void round_bits(const Xbyak::Xmm& d, const Xbyak::Xmm& a) {
    const Xbyak::Xmm s1 = vec(wide_ ? 28 : 13), s2 = vec(wide_ ? 29 : 14);
    vpsrld(s1, a, 16);
    bits_and(s1, s1, int_one());
    vpaddd(s1, s1, a);
    vpaddd(s1, s1, round_half());
    bits_and(s1, s1, high_half());
    bits_and(s2, a, magnitude());
    bits_or(d, a, quiet_bit());
    bits_and(d, d, high_half());
    if (wide_) {
      vpcmpgtd(k2, s2, infinity_bits());
      vpblendmd(d | k2, s1, d);
    } else {
      vpcmpgtd(s2, s2, infinity_bits());
      vblendvps(d, s1, d, s2);
    }
  }

  // The AVX512_BF16 rounding of a's 16 lanes into the words of `words` (a ymm): vcvtneps2bf16
  // rounds as round_bits does except in subnormal lanes, which it flushes to zero. A vector
  // with such a lane (rare: below 1.2e-38) jumps out of the loop to cold code that rounds as
  // round_bits into d and narrows that into words, then comes back.
  void convert_bf16(const Xbyak::Ymm& words, const Xbyak::Xmm& d, const Xbyak::Xmm& a) {
    constexpr uint8_t kSubnormal = 0x20;  // vfpclassps: denormal, either sign
    Xbyak::Label& cold = labels_.emplace_back();
    Xbyak::Label& back = labels_.emplace_back();
    vfpclassps(k2, a, kSubnormal);
    kortestw(k2, k2);
    jnz(cold, T_NEAR);
    vcvtneps2bf16(words, a);
    L(back);
    cold_.push_back([this, words, d, a, &cold, &back] {
      L(cold);
      round_bits(d, a);
      vpsrld(d, d, 16);
      vpmovdw(words, d);
      jmp(back, T_NEAR);
    });
  }

  // d = a rounded to bfloat16, as round_bits; the AVX512_BF16 conversion where the code has it
  // (full vectors only), widened back.
  void round_to_bfloat16(const Xbyak::Xmm& d, const Xbyak::Xmm& a, bool masked) {
    if (!bf16_ || masked) return round_bits(d, a);
    const Xbyak::Ymm words(d.getIdx());
    convert_bf16(words, d, a);
    vpmovzxwd(d, words);
    vpslld(d, d, 16);
  }

  // fold_rows' loop (rsi: the double sums, rdx: n, a multiple of 8 * width): rows of `width`
  // values taken in groups of 8 from element 0; per group, per folded value and per column the
  // 8 values are added in float as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), that sum
  // widened to double and added to the column's sum (folded value j's at rsi + j * width), as
  // kernels_reduce.cpp's fold_fixed_rows does, to the bit. A group is computed a column vector
  // (16 columns) at a time, its 8 rows one after another, so each tree needs three partials;
  // rcx is the group's first element and rax the vector's (the body's index).
  void fold_loop() {
    const int w = fold_width_;
    const Xbyak::Zmm s1(28), s2(29);
    Xbyak::Label loop, done;
    xor_(ecx, ecx);
    test(rdx, rdx);
    jz(done, T_NEAR);
    L(loop);
    for (int h = 0; h < w / 16; ++h) {
      for (int r = 0; r < 8; ++r) {
        lea(rax, ptr[rcx + r * w + h * 16]);
        compute(false);
        for (std::size_t j = 0; j < folded_.size(); ++j) {
          const Xbyak::Zmm v(register_of_[folded_[j]]);
          const int k = 3 * static_cast<int>(j);
          const Xbyak::Zmm p0(fold_partial(k)), p1(fold_partial(k + 1)), p2(fold_partial(k + 2));
          switch (r) {  // the tree: p0 = (r0 + r1) + (r2 + r3), p1 = (r4 + r5) + (r6 + r7)
            case 0: vmovaps(p0, v); break;
            case 1: vaddps(p0, p0, v); break;
            case 2: vmovaps(p1, v); break;
            case 3: vaddps(p1, p1, v); vaddps(p0, p0, p1); break;
            case 4: vmovaps(p1, v); break;
            case 5: vaddps(p1, p1, v); break;
            case 6: vmovaps(p2, v); break;
            case 7: vaddps(p2, p2, v); vaddps(p1, p1, p2); vaddps(p0, p0, p1); break;
          }
        }
        release();
      }
      // Columns h * 16 .. + 7 and + 8 .. + 15 of each sum: the tree's halves widened and added.
      for (std::size_t j = 0; j < folded_.size(); ++j) {
        const Xbyak::Zmm p0(fold_partial(3 * static_cast<int>(j)));
        const int at = (static_cast<int>(j) * w + h * 16) * 8;
        vcvtps2pd(s1, Xbyak::Ymm(p0.getIdx()));
        vaddpd(s1, s1, ptr[rsi + at]);
        vmovupd(ptr[rsi + at], s1);
        vextractf32x8(Xbyak::Ymm(s2.getIdx()), p0, 1);
        vcvtps2pd(s2, Xbyak::Ymm(s2.getIdx()));
        vaddpd(s2, s2, ptr[rsi + at + 64]);
        vmovupd(ptr[rsi + at + 64], s2);
      }
    }
    add(rcx, 8 * w);
    cmp(rcx, rdx);
    jb(loop, T_NEAR);
    L(done);
  }

  // One vector (rax: its first element) of every step, the result stored.
  void body(bool masked) {
    store(compute(masked), masked);
    release();
  }

  // Computes the steps for one vector (rax: its first element); returns the last value's
  // register. A bfloat16 result of full vectors with AVX512_BF16 also leaves its words in s2's
  // ymm (store stores them).
  Xbyak::Xmm compute(bool masked) {
    const Xbyak::Xmm s1 = vec(wide_ ? 28 : 13), s2 = vec(wide_ ? 29 : 14);
    // A bfloat16 result of full vectors, with AVX512_BF16: its rounding leaves the words in s2's
    // ymm, stored as they are.
    const bool stores_result_words = narrow_out_ && bf16_ && !masked;
    for (int v = n_loads_; v < n_values_; ++v) {
      if (before_[v]) continue;
      const auto& s = f_.steps[v - n_loads_];
      const Xbyak::Xmm a = operand(s.a, masked);
      // A folded operand stays in memory: B is it there, or b's register.
      const bool fold = folds(s, v, masked);
      const Xbyak::Xmm b = s.b >= 0 && !fold ? operand(s.b, masked) : a;
      const Xbyak::Address b_memory = fold ? ptr[pointer_[s.b] + rax * 4] : ptr[rax];
      const Xbyak::Operand& B = fold ? static_cast<const Xbyak::Operand&>(b_memory) : b;
      const Xbyak::Xmm c = s.c >= 0 ? operand(s.c, masked) : a;
      // Operands read for the last time give their registers back before the result takes
      // one: every sequence below reads its operands before it writes d.
      for (int u : {s.a, s.b, s.c})
        if (u >= 0 && last_use_[u] == v && !before_[u] && register_of_[u] >= 0) {
          free_[register_of_[u]] = true;
          register_of_[u] = -1;
        }
      const int r = allocate();
      register_of_[v] = r;
      const Xbyak::Xmm d = vec(r);
      const bool stores_words = stores_result_words && v == n_values_ - 1;
      // Sets the mask select() reads to x predicate y.
      auto compare = [&](const Xbyak::Xmm& x, const Xbyak::Xmm& y, uint8_t predicate) {
        if (wide_) vcmpps(k2, x, y, predicate);
        else vcmpps(s1, x, y, predicate);
      };
      switch (s.op) {
        case Op::Add: vaddps(d, a, B); break;
        case Op::Sub: vsubps(d, a, B); break;
        case Op::Mul: vmulps(d, a, B); break;
        case Op::Div: vdivps(d, a, B); break;
        case Op::Maximum:  // (a is NaN or a > b) ? a : b
        case Op::Minimum:  // (a is NaN or a < b) ? a : b
          if (wide_) {
            vcmpps(k2, a, a, kUnordered);
            vcmpps(k3, a, b, s.op == Op::Maximum ? kGt : kLt);
            korw(k2, k2, k3);
          } else {
            vcmpps(s1, a, a, kUnordered);
            vcmpps(s2, a, b, s.op == Op::Maximum ? kGt : kLt);
            vorps(s1, s1, s2);
          }
          select(d, a, b, s1);
          break;
        case Op::Eq: set_if(d, a, b, kEq); break;
        case Op::Ne: set_if(d, a, b, kNe); break;
        case Op::Lt: set_if(d, a, b, kLt); break;
        case Op::Le: set_if(d, a, b, kLe); break;
        case Op::Gt: set_if(d, a, b, kGt); break;
        case Op::Ge: set_if(d, a, b, kGe); break;
        case Op::Where:  // a != 0 ? b : c
          compare(a, zero(s2), kNe);
          select(d, b, c, s1);
          break;
        case Op::Neg:
          if (wide_) vpxord(d, a, sign_bit());
          else vxorps(d, a, sign_bit());
          break;
        case Op::Abs:
          bits_and(d, a, magnitude());
          break;
        case Op::Relu:  // a < 0 ? 0 : a; maxps returns its second operand for a NaN or two zeros
          vmaxps(d, zero(s2), a);
          break;
        case Op::LogicalNot:
          set_if(d, a, zero(s2), kEq);
          break;
        case Op::Exp:  // AVX-512 only (takes), as the two below
          exp(d, a);
          break;
        case Op::Sigmoid:
          logistic(d, a, false);
          break;
        case Op::Silu:  // x * logistic(x)
          logistic(d, a, true);
          break;
        case Op::Sqrt:  // correctly rounded, as the evaluator's sqrt_exact
          vsqrtps(d, a);
          break;
        case Op::Rsqrt:  // 1 / sqrt(a), each rounded
          vsqrtps(s1, a);
          vmovups(d, one());
          vdivps(d, d, s1);
          break;
        case Op::Cast:
          if (s.dtype == DType::Bool) {
            set_if(d, a, zero(s2), kNe);
          } else if (s.dtype == DType::BFloat16 && stores_words) {  // the result, as words
            convert_bf16(Xbyak::Ymm(s2.getIdx()), d, a);
          } else if (s.dtype == DType::BFloat16) {
            round_to_bfloat16(d, a, masked);
          } else if (d.getIdx() != a.getIdx()) {
            vmovaps(d, a);
          }
          break;
        default:
          LOOM_UNREACHABLE("fused code: a step compile() does not take");
      }
    }
    return vec(register_of_[n_values_ - 1]);
  }

  // Stores the result vector as the code's result type.
  void store(const Xbyak::Xmm& result, bool masked) {
    const Xbyak::Xmm s1 = vec(wide_ ? 28 : 13), s2 = vec(wide_ ? 29 : 14);
    const bool stores_result_words = narrow_out_ && bf16_ && !masked;
    if (stores_result_words) {
      vmovdqu32(ptr[rsi + rax * 2], Xbyak::Ymm(s2.getIdx()));
    } else if (bool_out_) {  // AVX-512 only (compile): a byte each, 1 where not 0 (NaN too)
      vcmpps(k2, result, zero(s2), kNe);
      vmovdqu32(s1 | k2 | T_z, int_one());
      if (masked) {
        vpmovdb(ptr[rsi + rax] | k1, s1);
      } else {
        const Xbyak::Xmm bytes(s2.getIdx());
        vpmovdb(bytes, s1);
        vmovdqu32(ptr[rsi + rax], bytes);
      }
    } else if (narrow_out_) {  // AVX-512 only (compile): the top half of each rounded float
      vpsrld(s1, result, 16);
      if (masked) {
        vpmovdw(ptr[rsi + rax * 2] | k1, s1);
      } else {  // narrowed in a register, then a plain store: faster than vpmovdw to memory
        const Xbyak::Ymm words(s2.getIdx());
        vpmovdw(words, s1);
        vmovdqu32(ptr[rsi + rax * 2], words);
      }
    } else if (wide_) {
      if (masked) vmovups(ptr[rsi + rax * 4] | k1, result);
      else vmovups(ptr[rsi + rax * 4], result);
    } else {
      if (masked) vmaskmovps(ptr[rsi + rax * 4], ymm15, result);
      else vmovups(ptr[rsi + rax * 4], result);
    }
  }

  // Frees the registers of the steps' values, leaving only the values computed before.
  void release() {
    for (int v = n_loads_; v < n_values_; ++v)
      if (!before_[v] && register_of_[v] >= 0) {
        free_[register_of_[v]] = true;
        register_of_[v] = -1;
      }
  }

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
};

const std::vector<FusedIsa>& fused_isas() {
  static const std::vector<FusedIsa> isas = [] {
    std::vector<FusedIsa> v;
    const char* env = std::getenv("LOOM_FUSED_JIT");
    if (env && std::strcmp(env, "0") == 0) return v;
    const Xbyak::util::Cpu cpu;
    if (!cpu.has(Xbyak::util::Cpu::tAVX2)) return v;
    v.push_back(FusedIsa::Avx2);
    using Cpu = Xbyak::util::Cpu;
    if (env && std::strcmp(env, "avx2") == 0) return v;
    if (!cpu.has(Cpu::tAVX512F) || !cpu.has(Cpu::tAVX512VL)) return v;
    v.push_back(FusedIsa::Avx512);
    if (env && std::strcmp(env, "avx512") == 0) return v;
    if (cpu.has(Cpu::tAVX512_BF16) && cpu.has(Cpu::tAVX512DQ)) v.push_back(FusedIsa::Avx512Bf16);
    return v;
  }();
  return isas;
}

namespace {

// What compile and compile_fold generate from: per value, whether it is computed before the
// code (a splat, or a step on splats only), and how each load is read. False where the code
// does not apply (isa not here, another compute type, a step it does not take).
bool plan_code(const ir::Fusion& f, const std::vector<FusedCode::Load>& loads, FusedIsa isa,
               std::vector<bool>& before, std::vector<FusedCode::Load>& reads) {
  using Load = FusedCode::Load;
  const auto& isas = fused_isas();
  if (std::find(isas.begin(), isas.end(), isa) == isas.end() || f.compute != DType::Float32 ||
      f.steps.empty())
    return false;
  assert(loads.size() == f.loads.size() && "fused code: one read per load");
  before.clear();
  reads = loads;
  for (auto& read : reads) {
    before.push_back(read == Load::Splat);
    // Under AVX2 the evaluator converts bfloat16 operands into its registers.
    const bool in_place = read == Load::BFloat16Elements || read == Load::BoolElements;
    if (in_place && !is_avx512(isa)) read = Load::Elements;
  }
  for (const auto& s : f.steps) {
    bool splats = true;
    for (int u : {s.a, s.b, s.c})
      if (u >= 0 && !before[u]) splats = false;
    if (!splats && !takes(s, isa)) return false;
    before.push_back(splats);  // Constant: no operands, so computed before
  }
  return true;
}

}  // namespace

std::unique_ptr<const FusedCode> FusedCode::compile(const ir::Fusion& f,
                                                    const std::vector<Load>& loads, DType out,
                                                    FusedIsa isa, int fold_width) {
  std::vector<bool> before;
  std::vector<Load> reads;
  if (!plan_code(f, loads, isa, before, reads)) return nullptr;
  if (before.back()) return nullptr;  // one value throughout: nothing per element
  const auto& last = f.steps.back();
  const bool rounds_last = last.op == Op::Cast && last.dtype == DType::BFloat16;
  const bool narrow =
      is_avx512(isa) && (out == DType::Bool || (out == DType::BFloat16 && rounds_last));
  std::unique_ptr<FusedCode> code(new FusedCode());
  try {
    code->gen_ = std::make_unique<Generator>(f, before, reads, isa, DType::Float32);
    code->gen_->readyRE();
    if (narrow) {
      code->narrow_gen_ = std::make_unique<Generator>(f, before, reads, isa, out);
      code->narrow_gen_->readyRE();
    }
  } catch (const DoesNotFit&) {
    return nullptr;
  } catch (const Xbyak::Error&) {
    return nullptr;
  }
  // The fold, where asked for; code that cannot fold (registers) still runs and stores.
  if (fold_width > 0 && fold_width % 16 == 0 && is_avx512(isa)) {
    try {
      auto gen = std::make_unique<Generator>(f, before, reads, isa, DType::Float32, fold_width);
      gen->readyRE();
      code->fold_ = gen->getCode<FoldFn>();
      code->fold_gen_ = std::move(gen);
      code->fold_width_ = fold_width;
    } catch (const DoesNotFit&) {
    } catch (const Xbyak::Error&) {
    }
  }
  code->fn_ = code->gen_->getCode<Fn>();
  if (narrow) {
    code->narrow_ = code->narrow_gen_->getCode<Fn>();
    code->narrow_dtype_ = out;
  }
  code->before_ = std::move(before);
  code->loads_ = std::move(reads);
  code->isa_ = isa;
  return code;
}

std::unique_ptr<const FusedCode> FusedCode::compile_fold(const ir::Fusion& f,
                                                         const std::vector<Load>& loads,
                                                         FusedIsa isa, int width,
                                                         const std::vector<int>& folded) {
  std::vector<bool> before;
  std::vector<Load> reads;
  if (width <= 0 || width % 16 != 0 || !is_avx512(isa) || folded.empty() ||
      !plan_code(f, loads, isa, before, reads))
    return nullptr;
  for (int v : folded)
    if (before[static_cast<std::size_t>(v)]) return nullptr;  // one value throughout
  std::unique_ptr<FusedCode> code(new FusedCode());
  try {
    auto gen = std::make_unique<Generator>(f, before, reads, isa, DType::Float32, width, folded);
    gen->readyRE();
    code->fold_ = gen->getCode<FoldFn>();
    code->fold_gen_ = std::move(gen);
  } catch (const DoesNotFit&) {
    return nullptr;
  } catch (const Xbyak::Error&) {
    return nullptr;
  }
  code->fold_width_ = width;
  code->before_ = std::move(before);
  code->loads_ = std::move(reads);
  code->isa_ = isa;
  return code;
}

#else  // no code generator for this architecture: the block evaluator runs every fusion

struct FusedCode::Generator {};
const std::vector<FusedIsa>& fused_isas() {
  static const std::vector<FusedIsa> none;
  return none;
}
std::unique_ptr<const FusedCode> FusedCode::compile(const ir::Fusion&, const std::vector<Load>&, DType,
                                                    FusedIsa, int) {
  return nullptr;
}
std::unique_ptr<const FusedCode> FusedCode::compile_fold(const ir::Fusion&,
                                                         const std::vector<Load>&, FusedIsa, int,
                                                         const std::vector<int>&) {
  return nullptr;
}

#endif

bool fused_jit_available() { return !fused_isas().empty(); }

const char* fused_isa_name(FusedIsa isa) {
  switch (isa) {
    case FusedIsa::Avx2: return "AVX2";
    case FusedIsa::Avx512: return "AVX-512";
    case FusedIsa::Avx512Bf16: return "AVX-512 with AVX512_BF16";
  }
  LOOM_UNREACHABLE("fused code: an instruction set without a name");
}

FusedCode::~FusedCode() = default;

}  // namespace loom::runtime
