// FusedCode's generator (fused_jit_generator.h): the instructions of each step (compute), one
// IEEE operation per arithmetic step, with the evaluator's NaN and signed-zero rules, the
// rounding to bfloat16 (round_bits; convert_bf16 where the CPU has AVX512_BF16), Eigen's AVX2 and
// AVX-512 exp instruction for instruction, and sigmoid and silu built on it (fused_jit.h says
// why).
#if defined(__x86_64__)
#include "runtime/cpu/fused_jit_generator.h"

#include "ir/unreachable.h"

#include <cstdint>

namespace loom::runtime {

using ir::Op;
using namespace fused_jit;

// Computes the steps for one vector (rax: its first element); returns the last value's
// register. A bfloat16 result of full vectors with AVX512_BF16 also leaves its words in s2's
// ymm, and one on AVX2 leaves them in the register returned (result_words_).
Xbyak::Xmm FusedCode::Generator::compute(bool masked) {
  result_words_ = false;
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
      case Op::Exp:  // where the evaluator's polynomial is this code's (takes), as below
        exp(d, a);
        break;
      case Op::Sigmoid:
        logistic(d, a, false);
        break;
      case Op::Silu:  // x / (1 + exp(-x))
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
        } else if (s.dtype == DType::BFloat16 && narrow_out_ && !wide_ && v == n_values_ - 1) {
          if (defer_rounding_) {  // AVX2's pair_loop rounds it
            if (d.getIdx() != a.getIdx()) vmovaps(d, a);
          } else {
            round_to_words(d, a);  // AVX2: the result, as words
            result_words_ = true;
          }
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

// d = exp(x) with the bits of the exp the evaluator's vector_map runs on every element: Eigen's
// pexp<Packet16f> (AVX-512), or its generic pexp_float over Packet8f (AVX2: another clamp, ln 2
// taken off in two parts, and pldexp_generic's scaling by four powers of two), with the same
// operations on the same operands in the same order, each min/max with Eigen's operand order
// (it decides NaN) and each pmadd one fused multiply-add.
// Six temporaries from the value registers (DoesNotFit when they are taken), never x's,
// which the final max reads again; d may be x's register (the max writes it last).
void FusedCode::Generator::exp(const Xbyak::Xmm& d, const Xbyak::Xmm& x) {
  const bool x_was_free = free_[static_cast<std::size_t>(x.getIdx())];
  free_[static_cast<std::size_t>(x.getIdx())] = false;
  int regs[6];
  for (int& r : regs) r = allocate();
  free_[static_cast<std::size_t>(x.getIdx())] = x_was_free;
  const Xbyak::Xmm t0 = vec(regs[0]), m = vec(regs[1]), r2 = vec(regs[2]), r3 = vec(regs[3]),
                   y = vec(regs[4]), y1 = vec(regs[5]);
  // The clamp (pexp<Packet16f>'s bounds, or pexp_float's for Packet8f).
  vmovups(t0, wide_ ? exp_constant(0) : generic_exp_constant(0));
  vminps(t0, t0, x);                       // pmin(_x, exp_hi) = min_ps(exp_hi, _x)
  vmovups(m, wide_ ? exp_constant(1) : generic_exp_constant(1));
  vmaxps(t0, m, t0);                       // pmax(., exp_lo) = max_ps(exp_lo, .)
  vmovups(m, exp_constant(2));
  vfmadd231ps(m, t0, exp_constant(3));     // x * LOG2EF + half
  if (wide_) {
    vrndscaleps(m, m, 0x01);               // floor
    vfmadd231ps(t0, m, exp_constant(4));   // r = m * nln2 + x
  } else {
    vroundps(m, m, 0x01);                  // floor
    vfmadd231ps(t0, m, generic_exp_constant(2));  // r = m * C1 + x, then m * C2 + r
    vfmadd231ps(t0, m, generic_exp_constant(3));
  }
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
  if (wide_) {
    vaddps(m, m, exp_constant(11));        // m + 127
    vcvttps2dq(m, m);
    vpslld(m, m, 23);                      // 2^m
    vmulps(y, y, m);
  } else {  // pldexp_generic(y, m): e = m within +-278, b = e >> 2, y * 2^b * 2^b * 2^b * 2^(e-3b)
    const Xbyak::Xmm b = r3, c = y1;
    vmovups(r2, generic_exp_constant(5));
    vmaxps(r2, r2, m);                     // pmax(m, -278) = max_ps(-278, m)
    vmovups(m, generic_exp_constant(4));
    vminps(m, m, r2);                      // pmin(., 278) = min_ps(278, .)
    vcvttps2dq(m, m);                      // e
    vpsrad(b, m, 2);                       // b = e >> 2
    vpaddd(c, b, generic_exp_constant(6));
    vpslld(c, c, 23);                      // 2^b
    vmulps(y, y, c);
    vmulps(y, y, c);
    vmulps(y, y, c);
    for (int k = 0; k < 3; ++k) vpsubd(m, m, b);  // e - 3b
    vpaddd(m, m, generic_exp_constant(6));
    vpslld(m, m, 23);                      // 2^(e - 3b)
    vmulps(y, y, m);
  }
  // The lanes of x below the clamp's lower bound are 0, those where exp overflows +Inf
  // (exp_flushed, fused_steps.h): compared before the max, which may write x's register.
  if (wide_) {
    vcmpps(k4, x, exp_constant(1), kLt);
    vcmpps(k5, x, exp_overflow(), kGt);
  } else {  // t0 (y2) and r2 are done with
    vcmpps(t0, x, generic_exp_constant(1), kLt);
    vcmpps(r2, x, exp_overflow(), kGt);
  }
  vmaxps(d, x, y);                         // pmax(y * 2^m, _x) = max_ps(_x, .)
  if (wide_) {
    vmovaps(d | k4, zero(d));
    vmovups(d | k5, infinity_bits());
  } else {
    vandnps(d, t0, d);
    vblendvps(d, d, infinity_bits(), r2);
  }
  for (int r : regs) free_[r] = true;
}

// d = 1 / (1 + exp(-x)) (sigmoid), or x / (1 + exp(-x)) (silu), the evaluator's logistic
// (fused_steps.h) step for step: -x exactly, this exp, one add, one division.
void FusedCode::Generator::logistic(const Xbyak::Xmm& d, const Xbyak::Xmm& x, bool times_x) {
  const bool x_was_free = free_[static_cast<std::size_t>(x.getIdx())];
  free_[static_cast<std::size_t>(x.getIdx())] = false;
  const int e_reg = allocate();
  const Xbyak::Xmm e = vec(e_reg);
  if (wide_) vpxord(e, x, sign_bit());          // -x (vxorps on zmm needs AVX512DQ)
  else vxorps(e, x, sign_bit());
  exp(e, e);                                    // exp(-x), flushed
  vaddps(e, e, one());                          // 1 + exp(-x)
  if (times_x) {
    vdivps(d, x, e);
  } else {
    const int one_reg = allocate();
    const Xbyak::Xmm u = vec(one_reg);
    vmovups(u, one());
    vdivps(d, u, e);
    free_[static_cast<std::size_t>(one_reg)] = true;
  }
  free_[static_cast<std::size_t>(e_reg)] = true;
  free_[static_cast<std::size_t>(x.getIdx())] = x_was_free;
}

// d = (x predicate y) ? 1 : 0.
void FusedCode::Generator::set_if(const Xbyak::Xmm& d, const Xbyak::Xmm& x, const Xbyak::Xmm& y,
                                  uint8_t predicate) {
  if (wide_) {
    vcmpps(k2, x, y, predicate);
    vmovups(d | k2 | T_z, one());
  } else {
    vcmpps(ymm13, x, y, predicate);
    vandps(d, ymm13, one());
  }
}

// d = mask ? t : f, mask being k2 (AVX-512) or s1's sign bits (AVX2).
void FusedCode::Generator::select(const Xbyak::Xmm& d, const Xbyak::Xmm& t, const Xbyak::Xmm& f,
                                  const Xbyak::Xmm& s1) {
  if (wide_) vblendmps(d | k2, f, t);
  else vblendvps(d, f, t, s1);
}

// d = x & y and d = x | y on 32-bit lanes (EVEX forms under AVX-512, for zmm16-zmm31).
void FusedCode::Generator::bits_and(const Xbyak::Xmm& d, const Xbyak::Xmm& x,
                                    const Xbyak::Operand& y) {
  if (wide_) vpandd(d, x, y);
  else vpand(d, x, y);
}

void FusedCode::Generator::bits_or(const Xbyak::Xmm& d, const Xbyak::Xmm& x,
                                   const Xbyak::Operand& y) {
  if (wide_) vpord(d, x, y);
  else vpor(d, x, y);
}

// A zero vector: AVX-512's zmm30, zeroed once on entry; under AVX2 s, zeroed here.
Xbyak::Xmm FusedCode::Generator::zero(const Xbyak::Xmm& s) {
  if (wide_) return Xbyak::Zmm(kZero);
  vxorps(s, s, s);
  return s;
}

// Whether step v's second operand u is read straight from memory by the arithmetic
// instruction (a float32 element load that nothing else reads, in the full vectors only).
bool FusedCode::Generator::folds(const ir::FusedStep& s, int v, bool masked) const {
  const int u = s.b;
  if (masked || u < 0 || u >= n_loads_ || !has_pointer_[u] || loads_[u] != Load::Elements)
    return false;
  if (uses_[u] != 1 || last_use_[u] != v) return false;
  return s.op == Op::Add || s.op == Op::Sub || s.op == Op::Mul || s.op == Op::Div;
}

// d = a rounded to bfloat16 (bfloat16::round_bits: (u + 0x7fff + (u >> 16 & 1)) &
// 0xffff0000, and a NaN, its magnitude above infinity's bits, keeps its upper half with the
// quiet bit set), a float32 whose low half is zero; integer steps on s1 and s2.
void FusedCode::Generator::round_bits(const Xbyak::Xmm& d, const Xbyak::Xmm& a) {
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

void FusedCode::Generator::round_to_words(const Xbyak::Xmm& d, const Xbyak::Xmm& a) {
  assert(!wide_ && "round_to_words: AVX2 only");
  round_upper(d, a, false);
  vpshufb(d, d, high_words());      // each 128-bit lane's four upper halves to its low 8 bytes
  vpermq(Xbyak::Ymm(d.getIdx()), Xbyak::Ymm(d.getIdx()), 0x08);  // the two lanes' to the low 16
}

void FusedCode::Generator::round_upper(const Xbyak::Xmm& d, const Xbyak::Xmm& a, bool without_nan) {
  assert(!wide_ && "round_upper: AVX2 only");
  const Xbyak::Xmm s1 = vec(13), s2 = vec(14);
  vpsrld(s1, a, 16);
  vpand(s1, s1, int_one());
  if (without_nan) {
    vpaddd(d, a, s1);
    vpaddd(d, d, round_half());     // the upper half rounded to nearest even
    return;
  }
  vpaddd(s1, s1, a);
  vpaddd(s1, s1, round_half());     // the upper half rounded to nearest even
  vcmpps(s2, a, a, kUnordered);
  vpor(d, a, quiet_bit());          // a NaN's upper half, quiet
  vblendvps(d, s1, d, s2);
}

void FusedCode::Generator::pair_loop() {
  assert(!wide_ && narrow_out_ && "pair_loop: AVX2's bfloat16 results only");
  const Xbyak::Ymm first(15), nan(14);  // ymm15 is free until the tail (its mask)
  Xbyak::Label loop;
  Xbyak::Label& cold = labels_.emplace_back();  // kept for cold_, which runs after the ret
  Xbyak::Label& back = labels_.emplace_back();
  defer_rounding_ = true;
  L(loop);
  vmovaps(first, compute(false));
  release();
  add(rax, lanes_);
  const Xbyak::Ymm second(compute(false).getIdx());
  vcmpps(nan, first, second, kUnordered);
  vptest(nan, nan);
  jnz(cold, T_NEAR);
  round_upper(first, first, true);
  round_upper(second, second, true);
  L(back);
  vpshufb(first, first, high_words());      // the first's upper halves: each lane's low 8 bytes
  vpshufb(second, second, high_words_up()); // the second's: each lane's high 8 bytes
  vpblendd(second, first, second, 0xcc);
  vpermq(second, second, 0xd8);             // lane 0's low, lane 1's low, then the highs
  vmovdqu(ptr[rsi + rax * 2 - 2 * lanes_], second);
  release();
  add(rax, lanes_);
  cmp(rax, rcx);
  jb(loop, T_NEAR);
  defer_rounding_ = false;
  cold_.push_back([this, first, second, &cold, &back] {
    L(cold);
    round_upper(first, first, false);
    round_upper(second, second, false);
    jmp(back, T_NEAR);
  });
}

// The AVX512_BF16 rounding of a's 16 lanes into the words of `words` (a ymm): vcvtneps2bf16
// rounds as round_bits does except in subnormal lanes, which it flushes to zero. A vector
// with such a lane (rare: below 1.2e-38) jumps out of the loop to cold code that rounds as
// round_bits into d and narrows that into words, then comes back.
void FusedCode::Generator::convert_bf16(const Xbyak::Ymm& words, const Xbyak::Xmm& d,
                                        const Xbyak::Xmm& a) {
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
void FusedCode::Generator::round_to_bfloat16(const Xbyak::Xmm& d, const Xbyak::Xmm& a,
                                             bool masked) {
  if (!bf16_ || masked) return round_bits(d, a);
  const Xbyak::Ymm words(d.getIdx());
  convert_bf16(words, d, a);
  vpmovzxwd(d, words);
  vpslld(d, d, 16);
}

}  // namespace loom::runtime

#endif  // defined(__x86_64__)
