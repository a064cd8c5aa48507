// The program-level half of code generation: the prelude, the dispatch by op, and the
// literals and type names the generators share (codegen.h).
#include "runtime/cuda/codegen.h"

#include "ir/unreachable.h"

#include <loom/error.h>

#include <bit>
#include <cmath>
#include <cstdio>

namespace loom::runtime::cuda {

const std::string& prelude() {
  static const std::string text = R"(// loom: generated CUDA C
typedef long long i64;
typedef unsigned short bf16;
// Set by a kernel that meets bad data (an index out of range): the instruction's number + 1.
// The backend reads it after each program and fails the program's outputs naming the op.
__device__ int loom_error;
__device__ __forceinline__ void report_error(int instr) { atomicCAS(&loom_error, 0, instr + 1); }
__device__ __forceinline__ float bf16_to_f(bf16 v) { return __uint_as_float(((unsigned)v) << 16); }
__device__ __forceinline__ bf16 f_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);  // NaN stays NaN, quiet
  return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ i64 thread_index() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
// Value k of a 4-vector (float4, ushort4, ...); k a constant once the loop is unrolled.
template <class V> __device__ __forceinline__ auto lane(const V& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}
)";
  return text;
}

const char* storage_type(DType t) {
  switch (t) {
    case DType::Float32: return "float";
    case DType::Float64: return "double";
    case DType::Int64: return "i64";
    case DType::Int32: return "int";
    case DType::Bool: return "unsigned char";
    case DType::BFloat16: return "bf16";
  }
  LOOM_UNREACHABLE("cuda codegen: value out of range");
}

const char* compute_type(DType t) {
  return t == DType::BFloat16 ? "float" : storage_type(t);
}

std::string literal(double v, DType t) {
  char buf[64];
  switch (t) {
    case DType::Float64:
      std::snprintf(buf, sizeof buf, "__longlong_as_double(0x%llxLL)",
                    static_cast<unsigned long long>(std::bit_cast<uint64_t>(v)));
      return buf;
    case DType::Float32:
    case DType::BFloat16: {
      const auto f = static_cast<float>(v);
      std::snprintf(buf, sizeof buf, "__uint_as_float(0x%xu)", std::bit_cast<uint32_t>(f));
      return buf;
    }
    case DType::Int64:
      std::snprintf(buf, sizeof buf, "%lldLL", static_cast<long long>(v));
      return buf;
    case DType::Int32:
      std::snprintf(buf, sizeof buf, "%d", static_cast<int>(v));
      return buf;
    case DType::Bool:
      return v != 0 ? "1" : "0";
  }
  LOOM_UNREACHABLE("cuda codegen: value out of range");
}

InstrCode generate(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  using ir::Op;
  switch (in.op) {
    case Op::Reshape:
      return {Runs::Nothing, {}, {}};
    case Op::Matmul: case Op::Conv2d: case Op::Conv2dGradInput: case Op::Conv2dGradWeight: {
      if (!in.epilogue.active()) return {Runs::Library, {}, {}};
      auto code = epilogue_code(p, i, prefix);
      code.runs = Runs::Library;
      return code;
    }
    case Op::Sum: case Op::Mean: case Op::Max: case Op::ArgMax:
      return reduce_code(p, i, prefix);
    case Op::Permute: case Op::Slice: case Op::Expand: case Op::Pad: case Op::Concat:
    case Op::Iota:
      return movement_code(p, i, prefix);
    case Op::RandUniform: case Op::RandNormal:
      return random_code(p, i, prefix);
    case Op::Gather: case Op::IndexSelect: case Op::ScatterAdd: case Op::OneHot:
      return index_code(p, i, prefix);
    case Op::MaxPool2d: case Op::AvgPool2d: case Op::MaxPool2dGrad: case Op::AvgPool2dGrad:
      return pool_code(p, i, prefix);
    case Op::Im2col:
      return im2col_code(p, i, prefix);
    case Op::DeviceData:
      throw Error("cuda codegen: a DeviceData instruction (inputs are slots, not instructions)");
    case Op::Constant:
    case Op::Neg: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Abs:
    case Op::Relu: case Op::Sigmoid: case Op::Tanh: case Op::Silu: case Op::Gelu:
    case Op::GeluTanh: case Op::Erf: case Op::Sin: case Op::Cos: case Op::LogicalNot:
    case Op::Cast:
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow: case Op::Maximum:
    case Op::Minimum: case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt:
    case Op::Ge: case Op::Where:
      return elementwise_code(p, i, prefix);
    case Op::Count_:
      break;
  }
  LOOM_UNREACHABLE("cuda codegen: value out of range");
}

int ProgramCode::kernels() const {
  int n = 0;
  for (const auto& c : instrs) n += static_cast<int>(c.launches.size());
  return n;
}

ProgramCode generate_program(const ir::Program& p) {
  ProgramCode code;
  code.source = prelude();
  code.instrs.reserve(p.instrs.size());
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    std::string prefix = "k";  // (not "k" + to_string: GCC 12 warns falsely, -Wrestrict)
    prefix += std::to_string(i);
    auto c = generate(p, i, prefix);
    code.source += c.source;
    c.source.clear();
    code.instrs.push_back(std::move(c));
  }
  return code;
}

}  // namespace loom::runtime::cuda
