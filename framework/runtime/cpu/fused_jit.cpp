// FusedCode (fused_jit.h): the loop a fusion's per-element steps compile to.
//
// The generated function, for n elements and L lanes (16 with AVX-512, 8 with AVX2):
//
//   load the pointers of the element loads into general registers; broadcast each value
//   computed before (splats) into a vector register of its own
//   AVX2 with a bfloat16 result: first the vectors two at a time (pair_loop), the rounding's
//       NaN steps taken only where a NaN is among the 16 values (cold code), one 32-byte store
//   for i in [.., n rounded down to L) step L:  each step on L lanes, operands loaded at their
//       first use (a bfloat16 one widened by a shift), registers freed after their last; the
//       last value stored to out + i (as float32, its top halves as bfloat16, or bool bytes)
//   if n % L: the same body once more with masked loads and stores (masked lanes are never
//       read or written, so nothing is touched beyond the operands; AVX2, which has no 8- or
//       16-bit masked loads or stores, copies the bfloat16 and bool operands' last elements
//       into stack slots first and stores such a result through one, stage_tail)
//   return; then the cold code of the roundings to bfloat16 (Avx512Bf16: a vector with a
//       subnormal lane jumps there, is rounded with integer steps, and jumps back; AVX2's
//       pairs with a NaN lane)
//
// Registers: rdi: the value pointers, rsi: out, rdx: n, rax: the index of the current element,
// rcx: the end of the full vectors; up to 10 element loads get a register each (r8-r11, rbx,
// rbp, r12-r15, the last six saved and restored). AVX-512: zmm0-zmm27 hold values, zmm28-zmm29
// are scratch for the steps that take two instructions or more, zmm30 is zero, k1 is the tail's
// lane mask and k2-k3 hold comparisons. AVX2: ymm0-ymm12 hold values, ymm13-ymm14 are scratch,
// ymm15 is the tail's lane mask (in a fold, a partial sum; in pair_loop, the first vector's
// value). A fusion needing more at once is left to the evaluator (there are no spills).
// An arithmetic step's second operand, when it is a float32 load nothing else reads, is read
// straight from memory by the instruction in the full vectors.
//
// fold_rows' function (a reduction's prologue, kernels_reduce.cpp) takes the same steps over
// groups of 8 rows, a column vector at a time, and adds each folded value into three partial
// registers as a fixed tree, then the tree's sum into the double sums (fold_loop).
//
// The generator's class is in fused_jit_generator.h; the instructions of each step are in
// fused_jit_steps.cpp.
#include "runtime/cpu/fused_jit.h"

#include "ir/unreachable.h"

#if defined(__x86_64__)
#include "runtime/cpu/fused_jit_generator.h"

#include <xbyak/xbyak_util.h>
#endif

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace loom::runtime {

#if defined(__x86_64__)
using namespace fused_jit;

// The evaluator's exp (and sigmoid and silu, built on it) is Eigen's float packets with FMA
// (fused_steps.h's vector_map): pexp<Packet16f>'s own polynomial in a build for AVX-512, the
// generic pexp_float over Packet8f in a build for AVX2 below it. The code computes the one of
// its instruction set (Generator::exp, Generator::logistic), so it takes them where that is
// the build's.
bool fused_code_takes_exp(FusedIsa isa) {
#if defined(__AVX512F__) && defined(__FMA__)
  return is_avx512(isa);
#elif defined(__AVX2__) && defined(__FMA__)
  return isa == FusedIsa::Avx2;
#else
  return static_cast<void>(isa), false;
#endif
}

namespace {

using ir::Op;

// Whether the code takes step op on isa (as a per-element step; Constant is always computed
// before).
bool takes(const ir::FusedStep& s, FusedIsa isa) {
  if (s.op == Op::Exp || s.op == Op::Sigmoid || s.op == Op::Silu) return fused_code_takes_exp(isa);
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

}  // namespace

// Which general register holds each element load's pointer, and the last step (as a value
// index) that reads each value.
void FusedCode::Generator::plan() {
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
  // AVX2's tail: a stack slot per bfloat16 or bool load and for such a result (stage_tail).
  tail_slot_.assign(n_loads_, -1);
  int slots = 0;
  if (!wide_) {
    for (int k = 0; k < n_loads_; ++k)
      if (has_pointer_[k] && loads_[k] != Load::Elements) tail_slot_[k] = slots++;
    if (narrow_out_ || bool_out_) out_slot_ = slots++;
  }
  tail_bytes_ = slots ? 16 * (slots + 1) : 0;
}

// AVX2's tail of n % 8 elements (rdx) read from bfloat16 or bool operands or stored as such:
// AVX2 has no 8- or 16-bit masked loads or stores, so the operands' last elements are copied
// into stack slots of 16 bytes, zero-padded, that the tail's body reads whole, and such a result
// is stored into its slot and copied out from there (store_packed, copy_tail): nothing beyond an
// operand or the result is read or written. [rsp] keeps n % 8; the slots follow, 16 bytes each.
void FusedCode::Generator::stage_tail() {
  sub(rsp, tail_bytes_);
  mov(ptr[rsp], rdx);
  vpxor(xmm13, xmm13, xmm13);
  for (int k = 0; k < n_loads_; ++k) {
    if (tail_slot_[k] < 0) continue;
    const int size = loads_[k] == Load::BFloat16Elements ? 2 : 1;
    vmovdqu(ptr[rsp + tail_at(tail_slot_[k])], xmm13);
    copy_tail(size, pointer_[k] + rax * size, rsp + 16 + tail_at(tail_slot_[k]));
  }
}

// Copies n % 8 elements of `size` bytes (2 or 1; n % 8 at [rsp]) from `source` to
// `destination`, both taken after rsi and rdi are pushed (rsp then 16 lower); `destination`
// may use rsi (the result), `source` neither rsi nor rdi.
void FusedCode::Generator::copy_tail(int size, const Xbyak::RegExp& source,
                                     const Xbyak::RegExp& destination) {
  mov(rcx, ptr[rsp]);
  push(rsi);
  push(rdi);
  lea(rdi, ptr[destination]);
  lea(rsi, ptr[source]);
  rep();
  if (size == 2) movsw();
  else movsb();
  pop(rdi);
  pop(rsi);
}

void FusedCode::Generator::emit() {
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

  xor_(eax, eax);
  if (!wide_ && narrow_out_) {  // AVX2, a bfloat16 result: 16 elements at a time first
    Xbyak::Label singles;
    mov(rcx, rdx);
    and_(rcx, ~int64_t{2 * lanes_ - 1});
    test(rcx, rcx);
    jz(singles, T_NEAR);
    pair_loop();
    L(singles);
  }
  mov(rcx, rdx);
  and_(rcx, ~int64_t{lanes_ - 1});
  cmp(rax, rcx);
  jae(tail, T_NEAR);
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
    if (tail_bytes_) stage_tail();
    shl(rdx, 5);
    lea(rcx, ptr[rip + masks_]);
    vmovups(ymm15, ptr[rcx + rdx]);
  }
  free_ = invariant_free;
  register_of_ = invariant_regs;
  body(true);
  if (tail_bytes_) add(rsp, tail_bytes_);
  L(done);
  vzeroupper();
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) pop(*it);
  ret();
  // The roundings' subnormal lanes, out of the loop (round_to_bfloat16).
  for (auto& cold : cold_) cold();
  emit_constants(consts);
}

// Constants, a vector each, then (AVX2) the tail masks (entry j: the first j lanes set).
void FusedCode::Generator::emit_constants(Xbyak::Label& consts) {
  align(64);
  L(consts);
  for (uint32_t c : {0x3f800000u, 0x80000000u, 0x7fffffffu, 1u, 0x7fffu, 0xffff0000u,
                     0x7f800000u, 0x00400000u})
    for (int lane = 0; lane < lanes_; ++lane) dd(c);
  for (float c : kPolynomialConstants)
    for (int lane = 0; lane < lanes_; ++lane) dd(std::bit_cast<uint32_t>(c));
  for (int lane = 0; lane < lanes_; ++lane) dd(kHighWords[lane % std::size(kHighWords)]);
  for (int lane = 0; lane < lanes_; ++lane) dd(kHighWordsUp[lane % std::size(kHighWordsUp)]);
  if (!wide_) {
    L(masks_);
    for (int j = 0; j < 8; ++j)
      for (int lane = 0; lane < 8; ++lane) dd(lane < j ? 0xffffffffu : 0u);
  }
}

int FusedCode::Generator::allocate() {
  for (int r = 0; r < value_regs_; ++r)
    if (free_[r]) {
      free_[r] = false;
      return r;
    }
  throw DoesNotFit{};
}

// The register of operand value u at step v, loading an element load at its first use.
Xbyak::Xmm FusedCode::Generator::operand(int u, bool masked) {
  if (register_of_[u] < 0) {
    assert(u < n_loads_ && has_pointer_[u] && "fused code: a value read before it is made");
    const int r = allocate();
    const Xbyak::Xmm y = vec(r);
    const Xbyak::Reg64 p = pointer_[u];
    if (loads_[u] == Load::BFloat16Elements) {
      if (masked && wide_) vpmovzxwd(y | k1 | T_z, ptr[p + rax * 2]);
      else if (masked) vpmovzxwd(y, ptr[rsp + tail_at(tail_slot_[u])]);  // AVX2 (stage_tail)
      else vpmovzxwd(y, ptr[p + rax * 2]);
      vpslld(y, y, 16);
    } else if (loads_[u] == Load::BoolElements) {  // bytes 0 or 1 to floats
      if (masked && wide_) vpmovzxbd(y | k1 | T_z, ptr[p + rax]);
      else if (masked) vpmovzxbd(y, ptr[rsp + tail_at(tail_slot_[u])]);  // AVX2 (stage_tail)
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

// fold_rows' loop (rsi: the double sums, rdx: n, a multiple of 8 * width): rows of `width`
// values taken in groups of 8 from element 0; per group, per folded value and per column the
// 8 values are added in float as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), that sum
// widened to double and added to the column's sum (folded value j's at rsi + j * width), as
// kernels_reduce.cpp's fold_fixed_rows does, to the bit. A group is computed a column vector
// (the lanes: 16 or 8 columns) at a time, its 8 rows one after another, so each tree needs
// three partials; rcx is the group's first element and rax the vector's (the body's index).
void FusedCode::Generator::fold_loop() {
  const int w = fold_width_;
  // Scratch for the widening: the steps' own, free between rows.
  const Xbyak::Xmm s1 = vec(wide_ ? 28 : 13), s2 = vec(wide_ ? 29 : 14);
  Xbyak::Label loop, done;
  xor_(ecx, ecx);
  test(rdx, rdx);
  jz(done, T_NEAR);
  L(loop);
  for (int h = 0; h < w / lanes_; ++h) {
    for (int r = 0; r < 8; ++r) {
      lea(rax, ptr[rcx + r * w + h * lanes_]);
      compute(false);
      for (std::size_t j = 0; j < folded_.size(); ++j) {
        const Xbyak::Xmm v = vec(register_of_[folded_[j]]);
        const int k = 3 * static_cast<int>(j);
        const Xbyak::Xmm p0 = vec(fold_partial(k)), p1 = vec(fold_partial(k + 1)),
                         p2 = vec(fold_partial(k + 2));
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
    // The vector's columns in each sum: the tree's halves widened and added (a half's doubles
    // fill a vector).
    for (std::size_t j = 0; j < folded_.size(); ++j) {
      const int p0 = fold_partial(3 * static_cast<int>(j));
      const int at = (static_cast<int>(j) * w + h * lanes_) * 8;
      const int half = 4 * lanes_;  // bytes of a half's doubles
      if (wide_) {
        vcvtps2pd(s1, Xbyak::Ymm(p0));
        vextractf32x8(Xbyak::Ymm(s2.getIdx()), Xbyak::Zmm(p0), 1);
        vcvtps2pd(s2, Xbyak::Ymm(s2.getIdx()));
      } else {
        vcvtps2pd(s1, Xbyak::Xmm(p0));
        vextractf128(Xbyak::Xmm(s2.getIdx()), Xbyak::Ymm(p0), 1);
        vcvtps2pd(s2, Xbyak::Xmm(s2.getIdx()));
      }
      vaddpd(s1, s1, ptr[rsi + at]);
      vmovupd(ptr[rsi + at], s1);
      vaddpd(s2, s2, ptr[rsi + at + half]);
      vmovupd(ptr[rsi + at + half], s2);
    }
  }
  add(rcx, 8 * w);
  cmp(rcx, rdx);
  jb(loop, T_NEAR);
  L(done);
}

// One vector (rax: its first element) of every step, the result stored.
void FusedCode::Generator::body(bool masked) {
  store(compute(masked), masked);
  release();
}

// Stores the result vector as the code's result type.
void FusedCode::Generator::store(const Xbyak::Xmm& result, bool masked) {
  const Xbyak::Xmm s1 = vec(wide_ ? 28 : 13), s2 = vec(wide_ ? 29 : 14);
  const bool stores_result_words = narrow_out_ && bf16_ && !masked;
  if (stores_result_words) {
    vmovdqu32(ptr[rsi + rax * 2], Xbyak::Ymm(s2.getIdx()));
  } else if (bool_out_ && !wide_) {  // AVX2: a byte each, 1 where not 0 (NaN too)
    const Xbyak::Xmm bytes(s1.getIdx()), high(s2.getIdx());
    vcmpps(s1, result, zero(s2), kNe);
    vpsrld(s1, s1, 31);
    vextracti128(high, Xbyak::Ymm(s1.getIdx()), 1);
    vpackssdw(bytes, bytes, high);
    vpacksswb(bytes, bytes, bytes);
    store_packed(bytes, 1, masked);
  } else if (bool_out_) {  // AVX-512: a byte each, 1 where not 0 (NaN too)
    vcmpps(k2, result, zero(s2), kNe);
    vmovdqu32(s1 | k2 | T_z, int_one());
    if (masked) {
      vpmovdb(ptr[rsi + rax] | k1, s1);
    } else {
      const Xbyak::Xmm bytes(s2.getIdx());
      vpmovdb(bytes, s1);
      vmovdqu32(ptr[rsi + rax], bytes);
    }
  } else if (narrow_out_ && result_words_) {  // AVX2: the words round_to_words packed
    store_packed(Xbyak::Xmm(result.getIdx()), 2, masked);
  } else if (narrow_out_ && !wide_) {  // AVX2: the top halves, packed into words
    const Xbyak::Xmm words(s1.getIdx()), high(s2.getIdx());
    vpsrld(s1, result, 16);
    vextracti128(high, Xbyak::Ymm(s1.getIdx()), 1);
    vpackusdw(words, words, high);  // each half at most 0xffff: no saturation
    store_packed(words, 2, masked);
  } else if (narrow_out_) {  // AVX-512: the top half of each rounded float
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

// AVX2: stores the result's 8 elements of `size` bytes (2: bfloat16, 1: bool), packed at the
// bottom of x, at out + rax; the tail's through its stack slot (stage_tail).
void FusedCode::Generator::store_packed(const Xbyak::Xmm& x, int size, bool masked) {
  const auto put = [&](const Xbyak::Address& at) {
    if (size == 2) vmovdqu(at, x);
    else vmovq(at, x);
  };
  if (!masked) return put(ptr[rsi + rax * size]);
  put(ptr[rsp + tail_at(out_slot_)]);
  copy_tail(size, rsp + 16 + tail_at(out_slot_), rsi + rax * size);
}

// Frees the registers of the steps' values, leaving only the values computed before.
void FusedCode::Generator::release() {
  for (int v = n_loads_; v < n_values_; ++v)
    if (!before_[v] && register_of_[v] >= 0) {
      free_[register_of_[v]] = true;
      register_of_[v] = -1;
    }
}

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
  for (auto& read : reads) before.push_back(read == Load::Splat);
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
  const bool narrow = out == DType::Bool || (out == DType::BFloat16 && rounds_last);
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
  if (fold_width > 0 && fold_width % fused_lanes(isa) == 0) {
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
  if (width <= 0 || width % fused_lanes(isa) != 0 || folded.empty() ||
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
bool fused_code_takes_exp(FusedIsa) { return false; }
const std::vector<FusedIsa>& fused_isas() {
  static const std::vector<FusedIsa> none;
  return none;
}
std::unique_ptr<const FusedCode> FusedCode::compile(const ir::Fusion&, const std::vector<Load>&,
                                                    DType, FusedIsa, int) {
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

