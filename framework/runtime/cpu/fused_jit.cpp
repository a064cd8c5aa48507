// FusedCode (fused_jit.h): the loop a fusion's per-element steps compile to.
//
// The generated function, for n elements:
//
//   load the pointers of the element loads into general registers; broadcast each value
//   computed before (splats) into a vector register of its own
//   for i in [0, n rounded down to 8) step 8:  each step on 8 lanes, operands loaded at their
//       first use, registers freed after their last; the last value stored to out + i
//   if n % 8: the same body once more with masked loads and stores (vmaskmovps never touches
//       the lanes past n, so nothing is read or written beyond the operands)
//
// Registers: ymm0-ymm12 hold values, ymm13-ymm14 are scratch for the steps that take two
// instructions or more, ymm15 is the tail's lane mask. A fusion needing more at once is left to
// the evaluator (there are no spills). rdi: the value pointers, rsi: out, rdx: n, rax: the byte
// offset of the current 8 elements, rcx: the end of the full vectors; up to 10 element loads
// get a register each (r8-r11, rbx, rbp, r12-r15, the last six saved and restored).
#include "runtime/cpu/fused_jit.h"

#include "ir/unreachable.h"

#if defined(__x86_64__)
#include <xbyak/xbyak.h>
#include <xbyak/xbyak_util.h>
#endif

#include <array>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace loom::runtime {

#if defined(__x86_64__)
namespace {

using ir::Op;

// vcmpps predicates (quiet: NaN operands raise no flag, which changes no result).
constexpr uint8_t kEq = 0x00, kLt = 0x11, kLe = 0x12, kNe = 0x04, kGe = 0x1D, kGt = 0x1E,
                  kUnordered = 0x03;

// Whether the code takes step op (as a per-element step; Constant is always computed before).
bool takes(const ir::FusedStep& s) {
  switch (s.op) {
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Maximum: case Op::Minimum:
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Where:
    case Op::Neg: case Op::Abs: case Op::Relu: case Op::LogicalNot: case Op::Cast:
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
  Generator(const ir::Fusion& f, const std::vector<bool>& before)
      : Xbyak::CodeGenerator(4096, Xbyak::AutoGrow), f_(f), before_(before),
        n_loads_(static_cast<int>(f.loads.size())),
        n_values_(n_loads_ + static_cast<int>(f.steps.size())) {
    plan();
    emit();
  }

 private:
  // Which general register holds each element load's pointer, and the last step (as a value
  // index) that reads each value.
  void plan() {
    last_use_.assign(n_values_, -1);
    for (int v = n_loads_; v < n_values_; ++v) {
      if (before_[v]) continue;
      const auto& s = f_.steps[v - n_loads_];
      for (int u : {s.a, s.b, s.c})
        if (u >= 0) last_use_[u] = v;
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
      vbroadcastss(Xbyak::Ymm(r), ptr[rcx]);
      register_of_[v] = r;
    }
    const auto invariant_free = free_;
    const auto invariant_regs = register_of_;

    mov(rcx, rdx);
    and_(rcx, ~int64_t{7});
    shl(rcx, 2);
    xor_(eax, eax);
    test(rcx, rcx);
    jz(tail, T_NEAR);
    L(loop);
    body(false);
    add(rax, 32);
    cmp(rax, rcx);
    jb(loop, T_NEAR);
    L(tail);
    and_(rdx, 7);
    jz(done, T_NEAR);
    shl(rdx, 5);
    lea(rcx, ptr[rip + masks_]);
    vmovups(ymm15, ptr[rcx + rdx]);
    free_ = invariant_free;
    register_of_ = invariant_regs;
    body(true);
    L(done);
    vzeroupper();
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) pop(*it);
    ret();

    // Constants, 8 lanes each, then the tail masks (entry j: the first j lanes set).
    align(32);
    L(consts);
    for (uint32_t c : {0x3f800000u, 0x80000000u, 0x7fffffffu, 1u, 0x7fffu, 0xffff0000u,
                       0x7f800000u, 0x00400000u})
      for (int lane = 0; lane < 8; ++lane) dd(c);
    L(masks_);
    for (int j = 0; j < 8; ++j)
      for (int lane = 0; lane < 8; ++lane) dd(lane < j ? 0xffffffffu : 0u);
  }

  // The constants' addresses (emit's table order).
  Xbyak::Address constant(int index) { return ptr[rip + *consts_ + 32 * index]; }
  Xbyak::Address one() { return constant(0); }
  Xbyak::Address sign_bit() { return constant(1); }
  Xbyak::Address magnitude() { return constant(2); }
  Xbyak::Address int_one() { return constant(3); }
  Xbyak::Address round_half() { return constant(4); }
  Xbyak::Address high_half() { return constant(5); }
  Xbyak::Address infinity_bits() { return constant(6); }
  Xbyak::Address quiet_bit() { return constant(7); }

  int allocate() {
    for (int r = 0; r < 13; ++r)
      if (free_[r]) {
        free_[r] = false;
        return r;
      }
    throw DoesNotFit{};
  }

  // The register of operand value u at step v, loading an element load at its first use.
  Xbyak::Ymm operand(int u, bool masked) {
    if (register_of_[u] < 0) {
      assert(u < n_loads_ && has_pointer_[u] && "fused code: a value read before it is made");
      const int r = allocate();
      const Xbyak::Ymm y(r);
      if (masked) vmaskmovps(y, ymm15, ptr[pointer_[u] + rax]);
      else vmovups(y, ptr[pointer_[u] + rax]);
      register_of_[u] = r;
    }
    return Xbyak::Ymm(register_of_[u]);
  }

  void body(bool masked) {
    const Xbyak::Ymm s1 = ymm13, s2 = ymm14;
    for (int v = n_loads_; v < n_values_; ++v) {
      if (before_[v]) continue;
      const auto& s = f_.steps[v - n_loads_];
      const Xbyak::Ymm a = operand(s.a, masked);
      const Xbyak::Ymm b = s.b >= 0 ? operand(s.b, masked) : a;
      const Xbyak::Ymm c = s.c >= 0 ? operand(s.c, masked) : a;
      // Operands read for the last time give their registers back before the result takes
      // one: every sequence below reads its operands before it writes d.
      for (int u : {s.a, s.b, s.c})
        if (u >= 0 && last_use_[u] == v && !before_[u] && register_of_[u] >= 0) {
          free_[register_of_[u]] = true;
          register_of_[u] = -1;
        }
      const int r = allocate();
      register_of_[v] = r;
      const Xbyak::Ymm d(r);
      auto test = [&](Xbyak::Ymm x, Xbyak::Ymm y, uint8_t predicate) {
        vcmpps(s1, x, y, predicate);
        vandps(d, s1, one());
      };
      switch (s.op) {
        case Op::Add: vaddps(d, a, b); break;
        case Op::Sub: vsubps(d, a, b); break;
        case Op::Mul: vmulps(d, a, b); break;
        case Op::Div: vdivps(d, a, b); break;
        case Op::Maximum:  // (a is NaN or a > b) ? a : b
        case Op::Minimum:  // (a is NaN or a < b) ? a : b
          vcmpps(s1, a, a, kUnordered);
          vcmpps(s2, a, b, s.op == Op::Maximum ? kGt : kLt);
          vorps(s1, s1, s2);
          vblendvps(d, b, a, s1);
          break;
        case Op::Eq: test(a, b, kEq); break;
        case Op::Ne: test(a, b, kNe); break;
        case Op::Lt: test(a, b, kLt); break;
        case Op::Le: test(a, b, kLe); break;
        case Op::Gt: test(a, b, kGt); break;
        case Op::Ge: test(a, b, kGe); break;
        case Op::Where:  // a != 0 ? b : c
          vxorps(s2, s2, s2);
          vcmpps(s1, a, s2, kNe);
          vblendvps(d, c, b, s1);
          break;
        case Op::Neg: vxorps(d, a, sign_bit()); break;
        case Op::Abs: vandps(d, a, magnitude()); break;
        case Op::Relu:  // a < 0 ? 0 : a
          vxorps(s2, s2, s2);
          vcmpps(s1, a, s2, kLt);
          vandnps(d, s1, a);
          break;
        case Op::LogicalNot:
          vxorps(s2, s2, s2);
          test(a, s2, kEq);
          break;
        case Op::Cast:
          if (s.dtype == DType::Bool) {
            vxorps(s2, s2, s2);
            test(a, s2, kNe);
          } else if (s.dtype == DType::BFloat16) {
            // bfloat16::round_bits: (u + 0x7fff + (u >> 16 & 1)) & 0xffff0000, and a NaN
            // (magnitude above infinity's bits) keeps its upper half with the quiet bit set.
            vpsrld(s1, a, 16);
            vpand(s1, s1, int_one());
            vpaddd(s1, s1, a);
            vpaddd(s1, s1, round_half());
            vpand(s1, s1, high_half());
            vpand(s2, a, magnitude());
            vpcmpgtd(s2, s2, infinity_bits());
            vpor(d, a, quiet_bit());
            vpand(d, d, high_half());
            vblendvps(d, s1, d, s2);
          } else if (d.getIdx() != a.getIdx()) {
            vmovaps(d, a);
          }
          break;
        default:
          LOOM_UNREACHABLE("fused code: a step compile() does not take");
      }
    }
    const Xbyak::Ymm result(register_of_[n_values_ - 1]);
    if (masked) vmaskmovps(ptr[rsi + rax], ymm15, result);
    else vmovups(ptr[rsi + rax], result);
    // The body leaves only the values computed before in registers.
    for (int v = n_loads_; v < n_values_; ++v)
      if (!before_[v] && register_of_[v] >= 0) {
        free_[register_of_[v]] = true;
        register_of_[v] = -1;
      }
  }

  const ir::Fusion& f_;  // read while generating only
  const std::vector<bool> before_;
  const int n_loads_, n_values_;
  std::vector<int> last_use_;
  std::vector<Xbyak::Reg64> pointer_;
  std::vector<bool> has_pointer_;
  std::vector<Xbyak::Reg64> saved_;
  std::array<bool, 13> free_{};
  std::vector<int> register_of_;  // per value: its vector register now, -1: none
  Xbyak::Label* consts_ = nullptr;
  Xbyak::Label masks_;
};

bool fused_jit_available() {
  static const bool available = [] {
    const char* v = std::getenv("LOOM_FUSED_JIT");
    if (v && std::strcmp(v, "0") == 0) return false;
    return Xbyak::util::Cpu().has(Xbyak::util::Cpu::tAVX2);
  }();
  return available;
}

std::unique_ptr<const FusedCode> FusedCode::compile(const ir::Fusion& f,
                                                    const std::vector<bool>& splat_loads) {
  if (!fused_jit_available() || f.compute != DType::Float32 || f.steps.empty()) return nullptr;
  const int n_loads = static_cast<int>(f.loads.size());
  std::vector<bool> before(splat_loads);
  before.resize(n_loads, false);
  for (const auto& s : f.steps) {
    bool splats = true;
    for (int u : {s.a, s.b, s.c})
      if (u >= 0 && !before[u]) splats = false;
    if (!splats && !takes(s)) return nullptr;
    before.push_back(splats);  // Constant: no operands, so computed before
  }
  if (before.back()) return nullptr;  // one value throughout: nothing per element
  std::unique_ptr<FusedCode> code(new FusedCode());
  try {
    code->gen_ = std::make_unique<Generator>(f, before);
    code->gen_->readyRE();
  } catch (const DoesNotFit&) {
    return nullptr;
  } catch (const Xbyak::Error&) {
    return nullptr;
  }
  code->fn_ = code->gen_->getCode<Fn>();
  code->before_ = std::move(before);
  return code;
}

#else  // no code generator for this architecture: the block evaluator runs every fusion

struct FusedCode::Generator {};
bool fused_jit_available() { return false; }
std::unique_ptr<const FusedCode> FusedCode::compile(const ir::Fusion&, const std::vector<bool>&) {
  return nullptr;
}

#endif

FusedCode::~FusedCode() = default;

}  // namespace loom::runtime
