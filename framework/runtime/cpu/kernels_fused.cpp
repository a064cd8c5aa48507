// The fused elementwise kernel. The result is cut into blocks of kFusedBlock elements; TBB
// spreads blocks over threads. For each block, operands are loaded (converted to the compute
// type, broadcast by their strides) into scratch registers, or read in place when they are
// contiguous and already of the compute type; then each step runs as one simple loop over the
// block, which the compiler vectorises; transcendental functions use Eigen's vectorised
// versions. The last step writes straight into the result when no conversion is needed.
//
// run_step below is the one implementation of every elementwise op. Fusions run it, and so
// does an op alone (elementwise_kernel, which run_kernel calls for every dtype), so lazy,
// eager and compiled execution, fused or not, compute each element with the same code and
// agree exactly.
#include "runtime/cpu/kernels_fused.h"

// GCC 12 reports its own AVX-512 intrinsics' undefined placeholders as uninitialized when
// Eigen's vectorised sin/cos inline them (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "runtime/cpu/kernels_impl.h"

#include "ir/unreachable.h"

#include <Eigen/Core>

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace loom::runtime {
namespace {

using ir::FusedLoad;
using ir::FusedStep;
using ir::Fusion;
using ir::Op;

template <class T>
using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
template <class T>
constexpr T kInf = std::numeric_limits<T>::infinity();

// d = f(a) over n <= kFusedBlock elements with Eigen's vectorised functions. The operand is
// copied into an aligned buffer padded to whole packets, so every element goes through the
// same packet code wherever it sits: Eigen would otherwise compute unaligned heads and short
// tails with the scalar library function, whose last bits differ, and a value would then
// depend on how a kernel happened to cut its work into blocks.
template <class T, class F>
void vector_map(const T* a, T* d, int64_t n, F f) {
  constexpr int64_t kPacket = 64 / sizeof(T);
  auto aligned = [](const T* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; };
  if (n % kPacket == 0 && aligned(a) && aligned(d)) {  // already whole aligned packets
    Eigen::Map<const Array<T>, Eigen::Aligned64> x(a, n);
    Eigen::Map<Array<T>, Eigen::Aligned64> y(d, n);
    y = f(x);
    return;
  }
  alignas(64) T in[kFusedBlock];
  alignas(64) T out[kFusedBlock];
  const int64_t padded = (n + kPacket - 1) / kPacket * kPacket;
  std::copy(a, a + n, in);
  std::fill(in + n, in + padded, T(0));
  Eigen::Map<Array<T>, Eigen::Aligned64> x(in, padded), y(out, padded);
  y = f(x);
  std::copy(out, out + n, d);
}

// Tags of the per-thread buffers a fusion evaluates with: its block registers, and where
// each of its values is.
struct Registers;
struct Values;
struct Alone;  // elementwise_kernel's result and condition blocks

// Registers start on a 64-byte boundary (kFusedBlock elements apart), so vector_map works on
// them in place.
template <class T>
T* scratch_registers(std::size_t n) {
  constexpr std::size_t kAlign = 64 / sizeof(T);
  T* regs = thread_scratch<T, Registers>(n + kAlign);
  const auto misalign = reinterpret_cast<std::uintptr_t>(regs) % 64 / sizeof(T);
  return regs + (misalign ? kAlign - misalign : 0);
}

// Reads elements [begin, begin + len) of the result's index space from `src` into dst.
// Walks the merged dimensions with an odometer, one run along the innermost at a time.
template <class T, class S>
void load_block(const FusedLoad& l, const S* src, int64_t begin, int64_t len, T* dst) {
  const std::size_t rank = l.sizes.size();
  assert(rank >= 1 && rank <= ir::kMaxFusedRank && "fused load: bad rank");
  if (rank == 1 && l.strides[0] == 1) {
    for (int64_t i = 0; i < len; ++i) dst[i] = static_cast<T>(src[begin + i]);
    return;
  }
  std::array<int64_t, ir::kMaxFusedRank> idx{};
  int64_t rem = begin, offset = 0;
  for (std::size_t d = rank; d-- > 0;) {
    idx[d] = rem % l.sizes[d];
    rem /= l.sizes[d];
    offset += idx[d] * l.strides[d];
  }
  const std::size_t last = rank - 1;
  const int64_t inner = l.sizes[last], step = l.strides[last];
  for (int64_t i = 0; i < len;) {
    int64_t run = std::min(len - i, inner - idx[last]);
    if (step == 0) {
      std::fill(dst + i, dst + i + run, static_cast<T>(src[offset]));
    } else {
      for (int64_t k = 0; k < run; ++k) dst[i + k] = static_cast<T>(src[offset + k * step]);
    }
    i += run;
    idx[last] += run;
    offset += run * step;
    for (std::size_t d = last; d > 0 && idx[d] == l.sizes[d]; --d) {
      offset += l.strides[d - 1] - idx[d] * l.strides[d];
      idx[d] = 0;
      ++idx[d - 1];
    }
  }
}

// The storage dtype of T (the one run_step computes in).
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  else if constexpr (std::is_same_v<T, double>) return DType::Float64;
  else if constexpr (std::is_same_v<T, int64_t>) return DType::Int64;
  else if constexpr (std::is_same_v<T, int32_t>) return DType::Int32;
  else return DType::Bool;
}

// The one implementation of every elementwise op: d = op(a, b, c) over n <= kFusedBlock
// elements. Fusions run it in their compute type (float or double); elementwise_kernel runs it
// for an op alone, in any dtype. Booleans are 0 or 1 in T. Ops defined on floating point only
// (shape inference rejects them on other dtypes) throw for an integer or bool T.
template <class T>
void run_step(const FusedStep& s, const T* a, const T* b, const T* c, T* __restrict d,
              int64_t n) {
  constexpr bool fp = std::is_floating_point_v<T>;
  const T zero(0), one(1);
  switch (s.op) {
    case Op::Constant: std::fill(d, d + n, static_cast<T>(s.scalar)); return;
    case Op::Neg: for (int64_t i = 0; i < n; ++i) d[i] = -a[i]; return;
    case Op::Abs: for (int64_t i = 0; i < n; ++i) d[i] = std::abs(a[i]); return;
    // a < 0 (not a > 0) so that relu(NaN) is NaN, as in PyTorch.
    case Op::Relu: for (int64_t i = 0; i < n; ++i) d[i] = a[i] < zero ? zero : a[i]; return;
    case Op::Exp:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.exp(); });
      break;
    case Op::Log:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.log(); });
      break;
    // Eigen's fast float sqrt (rsqrt and a Newton step) makes +Inf NaN: +Inf is kept apart.
    case Op::Sqrt:
      if constexpr (fp)
        return vector_map(a, d, n, [](const auto& x) { return (x == kInf<T>).select(x, x.sqrt()); });
      break;
    case Op::Rsqrt:
      if constexpr (fp)
        return vector_map(a, d, n, [](const auto& x) {
          return (x == kInf<T>).select(Array<T>::Zero(x.size()), x.sqrt().inverse());
        });
      break;
    case Op::Sigmoid:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.logistic(); });
      break;
    case Op::Tanh:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.tanh(); });
      break;
    case Op::Silu:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x * x.logistic(); });
      break;
    case Op::Sin:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.sin(); });
      break;
    case Op::Cos:
      if constexpr (fp) return vector_map(a, d, n, [](const auto& x) { return x.cos(); });
      break;
    case Op::Erf:
      if constexpr (fp) {
        for (int64_t i = 0; i < n; ++i) d[i] = std::erf(a[i]);
        return;
      }
      break;
    case Op::Gelu:
      if constexpr (fp) {
        const T half(0.5), inv_sqrt2(0.70710678118654752440);
        for (int64_t i = 0; i < n; ++i) d[i] = a[i] * half * (one + std::erf(a[i] * inv_sqrt2));
        return;
      }
      break;
    case Op::GeluTanh:
      if constexpr (fp) {
        const T half(0.5), k(0.79788456080286535588), c3(0.044715);  // k = sqrt(2/pi)
        for (int64_t i = 0; i < n; ++i) d[i] = k * (a[i] + c3 * a[i] * a[i] * a[i]);
        vector_map(d, d, n, [](const auto& x) { return x.tanh(); });
        for (int64_t i = 0; i < n; ++i) d[i] = half * a[i] * (one + d[i]);
        return;
      }
      break;
    case Op::LogicalNot: for (int64_t i = 0; i < n; ++i) d[i] = a[i] == zero ? one : zero; return;
    case Op::Cast:
      // Members of a fusion produce the compute type, bool, or bfloat16 (widen.h), so a cast
      // is a copy, a test or a rounding to bfloat16 (through float32, as cast_kernel converts).
      // (Casts between dtypes, outside fusions, are cast_kernel's.)
      if (s.dtype == DType::Bool) {
        for (int64_t i = 0; i < n; ++i) d[i] = a[i] != zero ? one : zero;
      } else if (s.dtype == DType::BFloat16) {
        if constexpr (fp)
          for (int64_t i = 0; i < n; ++i)
            d[i] = static_cast<T>(round_to_bfloat16(static_cast<float>(a[i])));
        else
          unsupported_dtype("cast", DType::BFloat16);
      } else {
        std::copy(a, a + n, d);
      }
      return;
    case Op::Add: for (int64_t i = 0; i < n; ++i) d[i] = a[i] + b[i]; return;
    case Op::Sub: for (int64_t i = 0; i < n; ++i) d[i] = a[i] - b[i]; return;
    case Op::Mul: for (int64_t i = 0; i < n; ++i) d[i] = a[i] * b[i]; return;
    case Op::Div:
      if constexpr (fp) {
        for (int64_t i = 0; i < n; ++i) d[i] = a[i] / b[i];
        return;
      }
      break;
    case Op::Pow:
      if constexpr (fp) {
        for (int64_t i = 0; i < n; ++i) d[i] = std::pow(a[i], b[i]);
        return;
      }
      break;
    // NaN wins, as in torch.maximum (when b is NaN, a > b is false).
    case Op::Maximum:
      for (int64_t i = 0; i < n; ++i) d[i] = (a[i] != a[i] || a[i] > b[i]) ? a[i] : b[i];
      return;
    case Op::Minimum:
      for (int64_t i = 0; i < n; ++i) d[i] = (a[i] != a[i] || a[i] < b[i]) ? a[i] : b[i];
      return;
    case Op::Eq: for (int64_t i = 0; i < n; ++i) d[i] = a[i] == b[i] ? one : zero; return;
    case Op::Ne: for (int64_t i = 0; i < n; ++i) d[i] = a[i] != b[i] ? one : zero; return;
    case Op::Lt: for (int64_t i = 0; i < n; ++i) d[i] = a[i] < b[i] ? one : zero; return;
    case Op::Le: for (int64_t i = 0; i < n; ++i) d[i] = a[i] <= b[i] ? one : zero; return;
    case Op::Gt: for (int64_t i = 0; i < n; ++i) d[i] = a[i] > b[i] ? one : zero; return;
    case Op::Ge: for (int64_t i = 0; i < n; ++i) d[i] = a[i] >= b[i] ? one : zero; return;
    case Op::Where: for (int64_t i = 0; i < n; ++i) d[i] = a[i] != zero ? b[i] : c[i]; return;

    // Not elementwise: the fusion pass admits none of these, and run_kernel sends them
    // elsewhere.
    case Op::DeviceData: case Op::Iota: case Op::RandUniform: case Op::RandNormal:
    case Op::Sum: case Op::Mean: case Op::Max: case Op::ArgMax:
    case Op::Reshape: case Op::Permute: case Op::Slice: case Op::Expand: case Op::Pad:
    case Op::Concat: case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Gather: case Op::IndexSelect: case Op::ScatterAdd:
    case Op::OneHot: case Op::Count_:
      LOOM_UNREACHABLE("elementwise step: not an elementwise op");
  }
  // Only a floating-point op on an integer or bool T breaks out of the switch.
  if constexpr (!fp) unsupported_dtype(ir::op_name(s.op), dtype_of<T>());
  LOOM_UNREACHABLE("elementwise step: op out of range");
}

// Evaluates a fusion block by block on one thread, with that thread's scratch registers.
template <class T>
class BlockEvaluator {
 public:
  BlockEvaluator(const Fusion& f, std::span<const TensorView> in)
      : f_(f), in_(in), n_loads_(static_cast<int>(f.loads.size())),
        n_values_(n_loads_ + static_cast<int>(f.steps.size())),
        regs_(scratch_registers<T>(static_cast<std::size_t>(f.num_registers) * kFusedBlock)),
        value_(thread_scratch<const T*, Values>(n_values_)) {}

  // Elements [begin, begin + len) of the result's index space, len <= kFusedBlock. The last
  // step writes to `dst` when given; returns where the result is.
  const T* eval(int64_t begin, int64_t len, T* dst) {
    for (int k = 0; k < n_loads_; ++k) {
      const auto& l = f_.loads[k];
      const TensorView& src = in_[l.arg];
      if (f_.register_of[k] < 0) {
        value_[k] = src.as<const T>() + begin;
        continue;
      }
      visit_storage(l.dtype, [&](auto tag) {
        using S = typename decltype(tag)::type;
        load_block(l, src.as<const S>(), begin, len, reg(k));
      });
      value_[k] = reg(k);
    }
    for (int v = n_loads_; v < n_values_; ++v) {
      const auto& s = f_.steps[v - n_loads_];
      T* d = (v == n_values_ - 1 && dst) ? dst : reg(v);
      run_step<T>(s, s.a >= 0 ? value_[s.a] : nullptr, s.b >= 0 ? value_[s.b] : nullptr,
                  s.c >= 0 ? value_[s.c] : nullptr, d, len);
      value_[v] = d;
    }
    return value_[n_values_ - 1];
  }

 private:
  T* reg(int v) const { return regs_ + f_.register_of[v] * kFusedBlock; }

  const Fusion& f_;
  std::span<const TensorView> in_;
  const int n_loads_, n_values_;
  T* regs_;
  const T** value_;
};

template <class T>
void run_fusion(const Fusion& f, std::span<const TensorView> in, const TensorView& out) {
  const int64_t n = out.numel();
  // A result written over a donated operand (memory_plan.cpp) is computed into a register
  // and then copied: its last step must not write where its operands are read directly.
  const bool aliased =
      std::any_of(in.begin(), in.end(), [&](const TensorView& v) { return v.data == out.data; });
  const bool direct_out = out.dtype == f.compute && !aliased;
  assert((out.dtype == f.compute || out.dtype == DType::Bool || out.dtype == DType::BFloat16) &&
         "fused kernel: bad result dtype");
  const int64_t blocks = (n + kFusedBlock - 1) / kFusedBlock;
  parallel_range(blocks, 8, [&](int64_t b0, int64_t b1) {
    BlockEvaluator<T> eval(f, in);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t begin = blk * kFusedBlock, len = std::min(kFusedBlock, n - begin);
      if (direct_out) {
        eval.eval(begin, len, out.as<T>() + begin);
        continue;
      }
      const T* r = eval.eval(begin, len, nullptr);
      if (out.dtype == f.compute) {
        std::copy(r, r + len, out.as<T>() + begin);
        continue;
      }
      if (out.dtype == DType::BFloat16) {  // the last step rounded already: exact
        bfloat16* po = out.as<bfloat16>() + begin;
        for (int64_t i = 0; i < len; ++i) po[i] = bfloat16(static_cast<float>(r[i]));
        continue;
      }
      BoolStorage* po = out.as<BoolStorage>() + begin;
      for (int64_t i = 0; i < len; ++i) po[i] = r[i] != T(0);
    }
  });
}

// One elementwise op alone (elementwise_kernel): the operands are contiguous and of the
// result's shape, so each block runs run_step on them in place. A Where's bool condition is
// converted to T per block, as a fusion's load converts it.
template <class T>
void run_alone(Op op, std::span<const TensorView> in, const TensorView& out) {
  const int64_t n = out.numel();
  const bool where = op == Op::Where;
  // A result written over a donated operand (memory_plan.cpp) goes through scratch: run_step
  // writes through a __restrict pointer and may reread its operand (GeluTanh).
  const bool aliased =
      std::any_of(in.begin(), in.end(), [&](const TensorView& v) { return v.data == out.data; });
  const bool direct_out = out.dtype == dtype_of<T>() && !aliased;
  assert((out.dtype == dtype_of<T>() || out.dtype == DType::Bool) && "elementwise: bad result dtype");
  const FusedStep step{op, -1, -1, -1, 0, out.dtype};
  const int64_t blocks = (n + kFusedBlock - 1) / kFusedBlock;
  parallel_range(blocks, 8, [&](int64_t b0, int64_t b1) {
    T* scratch = thread_scratch<T, Alone>(2 * kFusedBlock);
    T* cond = scratch + kFusedBlock;
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t begin = blk * kFusedBlock, len = std::min(kFusedBlock, n - begin);
      const T* operand[3] = {nullptr, nullptr, nullptr};
      for (std::size_t k = 0; k < in.size(); ++k)
        if (!(where && k == 0)) operand[k] = in[k].as<const T>() + begin;
      if (where) {
        const BoolStorage* pc = in[0].as<const BoolStorage>() + begin;
        for (int64_t i = 0; i < len; ++i) cond[i] = static_cast<T>(pc[i]);
        operand[0] = cond;
      }
      T* d = direct_out ? out.as<T>() + begin : scratch;
      run_step<T>(step, operand[0], operand[1], operand[2], d, len);
      if (direct_out) continue;
      if (out.dtype == dtype_of<T>()) {
        std::copy(d, d + len, out.as<T>() + begin);
        continue;
      }
      BoolStorage* po = out.as<BoolStorage>() + begin;
      for (int64_t i = 0; i < len; ++i) po[i] = d[i] != T(0);
    }
  });
}

}  // namespace

void fused_kernel(const ir::Fusion& fusion, std::span<const TensorView> in,
                  const TensorView& out) {
  visit_float("fused elementwise", fusion.compute,
              [&](auto tag) { run_fusion<typename decltype(tag)::type>(fusion, in, out); });
}

template <class T>
void eval_fusion(const ir::Fusion& fusion, std::span<const TensorView> in, int64_t begin,
                 int64_t len, T* dst) {
  assert(fusion.compute == (sizeof(T) == 4 ? DType::Float32 : DType::Float64) &&
         "eval_fusion: wrong compute type");
  BlockEvaluator<T> eval(fusion, in);
  for (int64_t at = 0; at < len; at += kFusedBlock)
    eval.eval(begin + at, std::min(kFusedBlock, len - at), dst + at);
}

template void eval_fusion<float>(const ir::Fusion&, std::span<const TensorView>, int64_t,
                                 int64_t, float*);
template void eval_fusion<double>(const ir::Fusion&, std::span<const TensorView>, int64_t,
                                  int64_t, double*);

template <class T>
void unary_step(ir::Op op, const T* a, T* d, int64_t n) {
  const FusedStep s{op, -1, -1, -1, 0, std::is_same_v<T, float> ? DType::Float32 : DType::Float64};
  for (int64_t i = 0; i < n; i += kFusedBlock)
    run_step<T>(s, a + i, nullptr, nullptr, d + i, std::min(kFusedBlock, n - i));
}

template void unary_step<float>(ir::Op, const float*, float*, int64_t);
template void unary_step<double>(ir::Op, const double*, double*, int64_t);

void elementwise_kernel(ir::Op op, std::span<const TensorView> in, const TensorView& out) {
  assert(in.size() == static_cast<std::size_t>(ir::op_info(op).arity) && "elementwise: operands");
  const DType t = in[op == Op::Where ? 1 : 0].dtype;  // a Where computes in its values' dtype
  // Bool operands only meet tests and selection; shape inference rejects arithmetic on them.
  if (t == DType::Bool && op != Op::Eq && op != Op::Ne && op != Op::LogicalNot && op != Op::Where)
    unsupported_dtype(ir::op_name(op), t);
  visit_dtype(t, [&](auto tag) { run_alone<typename decltype(tag)::type>(op, in, out); });
}

}  // namespace loom::runtime
