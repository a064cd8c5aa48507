// Elementwise kernels (an op alone or a Fusion) and Matmul/Conv2d epilogues, and the CUDA C
// pieces every generator of this family shares (codegen_expr.h). Reductions are in
// codegen_reduce.cpp.
//
// An elementwise kernel gives each thread one element of the result at a time (a grid-stride
// loop): every operand's offset is computed from the flat index through constant divisions
// (a broadcast dimension costs nothing), converted to the compute type, the steps run as
// straight-line code on named values, and the result is converted once, as it is stored. The
// index is 32-bit unless the result is too large for it.
//
// A fusion whose result has a multiple of kVector elements, stored in at most 4 bytes, takes
// kVector of them a thread instead (vector_loop): its result and every operand it reads whole
// and in order (a plain contiguous load of at most 4 bytes an element) move as one 4- to
// 16-byte access per thread, so a warp's access covers 128 to 512 contiguous bytes and each
// thread has four elements' work in flight. Other loads (broadcasts, strided reads) stay one
// element at a time. The kernel checks at run time that those addresses are aligned for
// vector access and otherwise runs the element loop, which the same kernel carries.
// LOOM_CUDA_VECTOR=0 generates the element loop alone (to compare).
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/codegen_expr.h"

#include "ir/setting.h"
#include "ir/unreachable.h"

#include <loom/error.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

namespace loom::runtime::cuda {
namespace gen {
namespace {

using ir::Op;

std::string num(const char* digits, DType t) {
  return t == DType::Float32 ? std::string(digits) + "f" : std::string(digits);
}

bool is_float(DType t) { return t == DType::Float32 || t == DType::Float64; }

// A math library function at arithmetic dtype t: expf for float, exp for double.
std::string fn(const char* name, DType t, const std::string& x, const std::string& y = {}) {
  std::string f = name;
  if (t == DType::Float32) f += "f";
  return f + "(" + x + (y.empty() ? "" : ", " + y) + ")";
}

[[noreturn]] void unsupported(Op op, DType t) {
  throw Error(std::string("cuda codegen: ") + ir::op_name(op) + " is not defined on " +
              dtype_name(t));
}

}  // namespace

std::string named(const char* prefix, int64_t n) {
  std::string s = prefix;  // (not prefix + to_string(n): GCC 12 warns, bug 105329)
  s += std::to_string(n);
  return s;
}

DType arith_dtype(DType t) { return t == DType::BFloat16 ? DType::Float32 : t; }

std::string load_as(const std::string& v, DType from, DType t) {
  if (from == DType::BFloat16) {
    const std::string f = "bf16_to_f(" + v + ")";
    return t == DType::Float32 ? f : std::string("(") + compute_type(t) + ")" + f;
  }
  if (from == t) return v;
  return std::string("(") + compute_type(t) + ")(" + v + ")";
}

std::string store_as(const std::string& v, DType t, DType to) {
  switch (to) {
    case DType::Bool:
      return t == DType::Bool ? v : "(unsigned char)(" + v + " != 0)";
    case DType::BFloat16:
      return t == DType::Float32 ? "f_to_bf16(" + v + ")" : "f_to_bf16((float)(" + v + "))";
    case DType::Int32:
    case DType::Int64:
      if (is_float(t)) {
        // C++ leaves a float out of the integer's range undefined; x86's truncating
        // conversion (which the CPU backend runs) gives the lowest value, as does a NaN. CUDA
        // would saturate instead, so the range is tested here.
        const bool i32 = to == DType::Int32;
        const std::string lim = num(i32 ? "2147483648.0" : "9223372036854775808.0", t);
        const std::string lowest = i32 ? "(-2147483647 - 1)" : "(-9223372036854775807LL - 1)";
        return "(" + v + " >= -" + lim + " && " + v + " < " + lim + " ? (" +
               storage_type(to) + ")(" + v + ") : " + lowest + ")";
      }
      [[fallthrough]];
    case DType::Float32:
    case DType::Float64:
      return t == to ? v : std::string("(") + storage_type(to) + ")(" + v + ")";
  }
  LOOM_UNREACHABLE("cuda codegen: dtype out of range");
}

std::string step_expr(const ir::FusedStep& s, DType t, const std::string& a, const std::string& b,
                      const std::string& c) {
  const bool fp = is_float(t);
  const std::string ct = compute_type(t);
  const std::string zero = fp ? num("0.0", t) : "(" + ct + ")0";
  const std::string one = fp ? num("1.0", t) : "(" + ct + ")1";
  // Bool values only meet tests and selection (as on the CPU).
  if (t == DType::Bool && s.op != Op::Eq && s.op != Op::Ne && s.op != Op::LogicalNot &&
      s.op != Op::Where && s.op != Op::Constant && s.op != Op::Cast)
    unsupported(s.op, t);
  auto test = [&](const char* cmp) { return "(" + a + " " + cmp + " " + b + " ? " + one + " : " + zero + ")"; };
  auto float_only = [&](const std::string& e) {
    if (!fp) unsupported(s.op, t);
    return e;
  };
  auto sigmoid = [&](const std::string& x) {
    return "(" + one + " / (" + one + " + " + fn("exp", t, "-" + x) + "))";
  };
  switch (s.op) {
    case Op::Constant: return literal(s.scalar, t);
    case Op::Neg: return "(-" + a + ")";
    case Op::Abs: return fp ? fn("fabs", t, a) : "(" + a + " < " + zero + " ? -" + a + " : " + a + ")";
    // a < 0 (not a > 0): relu(NaN) is NaN, as in PyTorch.
    case Op::Relu: return "(" + a + " < " + zero + " ? " + zero + " : " + a + ")";
    case Op::Exp: return float_only(fn("exp", t, a));
    case Op::Log: return float_only(fn("log", t, a));
    case Op::Sqrt: return float_only(fn("sqrt", t, a));
    // 1 / sqrt(a), each rounded (not rsqrt's approximation): 0 at +Inf, as the CPU computes it.
    case Op::Rsqrt: return float_only("(" + one + " / " + fn("sqrt", t, a) + ")");
    case Op::Sigmoid: return float_only(sigmoid(a));
    case Op::Tanh: return float_only(fn("tanh", t, a));
    // x / (1 + exp(-x)), one rounding fewer than x * sigmoid(x): as PyTorch and the CPU.
    case Op::Silu: return float_only("(" + a + " / (" + one + " + " + fn("exp", t, "-" + a) + "))");
    case Op::Gelu:
      return float_only("(" + a + " * " + num("0.5", t) + " * (" + one + " + " +
                        fn("erf", t, a + " * " + num("0.70710678118654752440", t)) + "))");
    case Op::GeluTanh: {  // 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))), the CPU's order
      const std::string inner = num("0.79788456080286535588", t) + " * (" + a + " + " +
                                num("0.044715", t) + " * " + a + " * " + a + " * " + a + ")";
      return float_only("(" + num("0.5", t) + " * " + a + " * (" + one + " + " +
                        fn("tanh", t, inner) + "))");
    }
    case Op::Erf: return float_only(fn("erf", t, a));
    case Op::Sin: return float_only(fn("sin", t, a));
    case Op::Cos: return float_only(fn("cos", t, a));
    case Op::LogicalNot: return "(" + a + " == " + zero + " ? " + one + " : " + zero + ")";
    case Op::Cast:
      // Inside a fusion (widen.h) a cast yields the compute type, a bool or a bfloat16: a
      // copy, a test, or a rounding to bfloat16 through float32. (A cast between storage
      // dtypes, outside fusions, is cast_expr's.)
      if (s.dtype == DType::Bool) return "(" + a + " != " + zero + " ? " + one + " : " + zero + ")";
      if (s.dtype == DType::BFloat16) {
        if (!fp) unsupported(s.op, t);
        return load_as(store_as(a, t, DType::BFloat16), DType::BFloat16, t);
      }
      return a;
    case Op::Add: return "(" + a + " + " + b + ")";
    case Op::Sub: return "(" + a + " - " + b + ")";
    case Op::Mul: return "(" + a + " * " + b + ")";
    case Op::Div: return float_only("(" + a + " / " + b + ")");
    case Op::Pow: return float_only(fn("pow", t, a, b));
    // NaN wins, as in torch.maximum (when b is NaN, a > b is false).
    case Op::Maximum: return "((" + a + " != " + a + " || " + a + " > " + b + ") ? " + a + " : " + b + ")";
    case Op::Minimum: return "((" + a + " != " + a + " || " + a + " < " + b + ") ? " + a + " : " + b + ")";
    case Op::Eq: return test("==");
    case Op::Ne: return test("!=");
    case Op::Lt: return test("<");
    case Op::Le: return test("<=");
    case Op::Gt: return test(">");
    case Op::Ge: return test(">=");
    case Op::Where: return "(" + a + " != " + zero + " ? " + b + " : " + c + ")";
    case Op::DeviceData: case Op::Iota: case Op::RandUniform: case Op::RandNormal:
    case Op::Sum: case Op::Mean: case Op::Max: case Op::ArgMax:
    case Op::Reshape: case Op::Permute: case Op::Slice: case Op::Expand: case Op::Pad:
    case Op::Concat: case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Im2col: case Op::Gather: case Op::IndexSelect:
    case Op::ScatterAdd: case Op::OneHot: case Op::Count_:
      break;
  }
  throw Error(std::string("cuda codegen: ") + ir::op_name(s.op) + " is not an elementwise op");
}

std::string offset_expr(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                        const std::string& idx) {
  std::string sum;
  int64_t inner = 1;  // elements per step of dimension d
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (strides[d] != 0 && sizes[d] != 1) {
      std::string q = inner == 1 ? idx : "(" + idx + " / " + std::to_string(inner) + ")";
      // The outermost coordinate needs no remainder: the index stays below the element count.
      if (d > 0) q = "(" + q + " % " + std::to_string(sizes[d]) + ")";
      if (strides[d] != 1) q += " * " + std::to_string(strides[d]);
      sum += (sum.empty() ? "" : " + ") + q;
    }
    inner *= sizes[d];
  }
  return sum.empty() ? "0" : sum;
}

const char* index_type(int64_t bound) {
  return bound < std::numeric_limits<int32_t>::max() ? "int" : "i64";
}

std::string kernel_head(const std::string& name, int threads, std::size_t args) {
  std::string s = "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(threads) +
                  ") " + name + "(void* out";
  for (std::size_t k = 0; k < args; ++k) s += ", const void* a" + std::to_string(k);
  return s + ")";
}

std::string pointers(const ir::Program& p, const ir::Instr& in, const std::string& indent) {
  const char* restrict = in.donors.empty() ? " __restrict__" : "";
  std::string s;
  for (std::size_t k = 0; k < in.args.size(); ++k) {
    const char* st = storage_type(p.slot_type(in.args[k]).dtype);
    const auto n = std::to_string(k);
    s += indent + "const " + st + "*" + restrict + " x" + n + " = (const " + st + "*)a" + n + ";\n";
  }
  const char* ot = storage_type(in.dtype);
  return s + indent + ot + "* o = (" + ot + "*)out;\n";
}

std::string fusion_values(const ir::Fusion& f, const std::string& idx, const std::string& indent,
                          std::string* last, const std::vector<std::string>* loaded) {
  const std::string ct = compute_type(f.compute);
  auto name = [](int v) { return named("v", v); };
  std::string s;
  int v = 0;
  for (const auto& l : f.loads) {
    const auto j = static_cast<std::size_t>(v);
    const std::string at =
        loaded && !(*loaded)[j].empty()
            ? (*loaded)[j]
            : named("x", l.arg) + "[" + (l.offset ? std::to_string(l.offset) + " + " : "") +
                  offset_expr(l.sizes, l.strides, idx) + "]";
    s += indent + "const " + ct + " " + name(v++) + " = " + load_as(at, l.dtype, f.compute) + ";\n";
  }
  for (const auto& st : f.steps) {
    const std::string e = step_expr(st, f.compute, st.a >= 0 ? name(st.a) : "",
                                    st.b >= 0 ? name(st.b) : "", st.c >= 0 ? name(st.c) : "");
    s += indent + "const " + ct + " " + name(v++) + " = " + e + ";\n";
  }
  if (f.steps.empty()) throw Error("cuda codegen: a fusion without steps");
  *last = name(v - 1);
  return s;
}

void check_loads(const ir::Program& p, const ir::Instr& in) {
  for (const auto& l : in.fusion->loads) {
    if (l.arg < 0 || l.arg >= static_cast<int>(in.args.size()) ||
        p.slot_type(in.args[static_cast<std::size_t>(l.arg)]).dtype != l.dtype)
      throw Error(std::string("cuda codegen: a fused load of ") + ir::op_name(in.op) +
                  " names an operand it lacks or reads it as " + dtype_name(l.dtype));
  }
}

int64_t blocks_for(int64_t n, int threads) {
  return std::clamp<int64_t>((n + threads - 1) / threads, 1, kMaxBlocks);
}

}  // namespace gen

namespace {

using ir::Op;
using namespace gen;

constexpr int kThreads = 256;
constexpr int kVector = 4;  // elements a thread takes at a time in vector_loop

// LOOM_CUDA_VECTOR, read once: "0" turns vector_loop off.
bool vector_loops_on() {
  static const bool on = ir::env_setting("LOOM_CUDA_VECTOR", "1", {"0", "1"}) == "1";
  return on;
}

// The CUDA vector type of kVector values of storage dtype `t`, if it has one (values of at
// most 4 bytes).
const char* vector_type(DType t) {
  switch (t) {
    case DType::Bool: return "uchar4";
    case DType::BFloat16: return "ushort4";
    case DType::Int32: return "int4";
    case DType::Float32: return "float4";
    case DType::Int64: case DType::Float64: return nullptr;
  }
  return nullptr;
}

// Whether a fused load reads its operand whole and in order: element i of the result at
// element i of the operand.
bool reads_in_order(const ir::FusedLoad& l, int64_t n) {
  return l.flat() && l.sizes[0] == n;
}

// A cast between storage dtypes (an op alone): bfloat16 through float32, bool "not zero".
std::string cast_expr(const std::string& v, DType from, DType to) {
  const DType t = arith_dtype(from);
  return store_as(load_as(v, from, t), t, to);
}

// The loop body computing element i of an op alone: its operands have the result's shape.
std::string alone_body(const ir::Program& p, const ir::Instr& in, const std::string& ind) {
  auto arg_dtype = [&](std::size_t k) { return p.slot_type(in.args[k]).dtype; };
  auto at = [](std::size_t k) { return named("x", static_cast<int64_t>(k)) + "[i]"; };
  if (in.op == Op::Cast) return ind + "o[i] = " + cast_expr(at(0), arg_dtype(0), in.dtype) + ";\n";
  if (in.op == Op::Constant) {
    const DType t = arith_dtype(in.dtype);
    const double v = in.attr.get<ir::ScalarAttr>().value;
    return ind + "o[i] = " + store_as(literal(v, in.dtype), t, in.dtype) + ";\n";
  }
  if (in.args.empty() || in.args.size() > 3)
    throw Error(std::string("cuda codegen: ") + ir::op_name(in.op) + " with " +
                std::to_string(in.args.size()) + " operands");
  // A Where computes in its values' dtype; everything else in its first operand's.
  const DType t = arith_dtype(arg_dtype(in.op == Op::Where ? 1 : 0));
  const std::string ct = compute_type(t);
  std::string s, names[3];
  for (std::size_t k = 0; k < in.args.size(); ++k) {
    names[k] = named("v", static_cast<int64_t>(k));
    s += ind + "const " + ct + " " + names[k] + " = " + load_as(at(k), arg_dtype(k), t) + ";\n";
  }
  const ir::FusedStep step{in.op, -1, -1, -1, 0, in.dtype};
  s += ind + "const " + ct + " r = " + step_expr(step, t, names[0], names[1], names[2]) + ";\n";
  return s + ind + "o[i] = " + store_as("r", t, in.dtype) + ";\n";
}

// One thread per element in a grid-stride loop around `body`, which reads the index `i`.
InstrCode grid_loop(const ir::Program& p, const ir::Instr& in, const std::string& prefix,
                    int64_t n, const std::string& body) {
  InstrCode code;
  if (n == 0) return code;  // nothing to write: no launch
  const int64_t blocks = blocks_for(n, kThreads);
  const std::string I = index_type(n + blocks * kThreads);
  const std::string entry = prefix + "_main";
  code.source = kernel_head(entry, kThreads, in.args.size()) + " {\n" + pointers(p, in, "  ") +
                "  const " + I + " step = (" + I + ")gridDim.x * blockDim.x;\n" +
                "  for (" + I + " i = (" + I + ")blockIdx.x * blockDim.x + threadIdx.x; i < " +
                std::to_string(n) + "; i += step) {\n" + body + "  }\n}\n";
  code.launches.push_back({entry, blocks, kThreads, 0});
  return code;
}

// A fusion computed kVector elements a thread (see the top of the file), or none when its
// result's size or dtype does not allow it: `scalar_body` is the element loop's body, run
// where an address is not aligned for vector access.
std::optional<InstrCode> vector_loop(const ir::Program& p, const ir::Instr& in,
                                     const std::string& prefix, const std::string& scalar_body) {
  const ir::Fusion& f = *in.fusion;
  const int64_t n = shape_numel(in.shape);
  const char* out_vector = vector_type(in.dtype);
  if (!vector_loops_on() || n % kVector != 0 || n < kThreads * kVector || !out_vector)
    return std::nullopt;
  const int64_t groups = n / kVector;
  const int64_t blocks = blocks_for(groups, kThreads);
  const std::string I = index_type(n + blocks * kThreads * kVector);
  const std::string V = std::to_string(kVector);
  // Each operand read in order comes in as one vector r<j>; lane(r, k) is its k-th value.
  std::string vectors, addresses = "(unsigned long long)o";
  std::vector<std::string> loaded(f.loads.size());
  for (std::size_t j = 0; j < f.loads.size(); ++j) {
    const ir::FusedLoad& l = f.loads[j];
    const char* vt = vector_type(l.dtype);
    if (!reads_in_order(l, n) || !vt) continue;
    const std::string x = named("x", l.arg), r = named("r", static_cast<int64_t>(j));
    vectors += "      const " + std::string(vt) + " " + r + " = ((const " + vt + "*)" + x +
               ")[q];\n";
    loaded[j] = "lane(" + r + ", k)";
    addresses += " | (unsigned long long)" + x;
  }
  std::string last;
  const std::string values = fusion_values(f, "e", "        ", &last, &loaded);
  InstrCode code;
  const std::string entry = prefix + "_main";
  code.source =
      kernel_head(entry, kThreads, in.args.size()) + " {\n" + pointers(p, in, "  ") +
      "  const " + I + " step = (" + I + ")gridDim.x * blockDim.x;\n" +
      "  const " + I + " first = (" + I + ")blockIdx.x * blockDim.x + threadIdx.x;\n" +
      "  if (((" + addresses + ") & 15ull) == 0) {\n" +
      "    for (" + I + " q = first; q < " + std::to_string(groups) + "; q += step) {\n" +
      vectors +
      "      " + storage_type(in.dtype) + " w[" + V + "];\n" +
      "      #pragma unroll\n" +
      "      for (int k = 0; k < " + V + "; ++k) {\n" +
      "        const " + I + " e = q * " + V + " + k;\n" + values +
      "        w[k] = " + store_as(last, f.compute, in.dtype) + ";\n" +
      "      }\n" +
      "      ((" + out_vector + "*)o)[q] = make_" + out_vector + "(w[0], w[1], w[2], w[3]);\n" +
      "    }\n" +
      "    return;\n" +
      "  }\n" +
      "  for (" + I + " i = first; i < " + std::to_string(n) + "; i += step) {\n" + scalar_body +
      "  }\n" +
      "}\n";
  code.launches.push_back({entry, blocks, kThreads, 0});
  return code;
}

}  // namespace

InstrCode elementwise_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const int64_t n = shape_numel(in.shape);
  if (!in.fusion) return grid_loop(p, in, prefix, n, alone_body(p, in, "    "));
  const ir::Fusion& f = *in.fusion;
  if (f.compute != DType::Float32 && f.compute != DType::Float64)
    throw Error(std::string("cuda codegen: a fusion computing in ") + dtype_name(f.compute));
  if (shape_numel(f.shape) != n)
    throw Error("cuda codegen: a fusion of shape " + shape_str(f.shape) + " for a result of " +
                shape_str(in.shape));
  check_loads(p, in);
  std::string last;
  std::string body = fusion_values(f, "i", "    ", &last);
  body += "    o[i] = " + store_as(last, f.compute, in.dtype) + ";\n";
  if (auto code = vector_loop(p, in, prefix, body)) return std::move(*code);
  return grid_loop(p, in, prefix, n, body);
}

InstrCode epilogue_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const auto& e = in.epilogue;
  if (in.op != Op::Matmul && in.op != Op::Conv2d)
    throw Error(std::string("cuda codegen: an epilogue on ") + ir::op_name(in.op));
  const int64_t n = shape_numel(in.shape);
  // The bias index of element i: its column for a Matmul, its channel for a Conv2d: the last
  // dimension of a channels-last one ([N,H,W,C]), the second of an NCHW one.
  std::string bias_at;
  if (in.op == Op::Matmul) {
    if (in.shape.size() < 2) throw Error("cuda codegen: a Matmul of shape " + shape_str(in.shape));
    bias_at = "i % " + std::to_string(in.shape.back());
  } else {
    if (in.shape.size() != 4) throw Error("cuda codegen: a Conv2d of shape " + shape_str(in.shape));
    if (in.attr.get<ir::Conv2dAttr>().channels_last)
      bias_at = "i % " + std::to_string(in.shape[3]);
    else
      bias_at = "(i / " + std::to_string(in.shape[2] * in.shape[3]) + ") % " +
                std::to_string(in.shape[1]);
  }
  const DType t = arith_dtype(in.dtype);
  const std::string ct = compute_type(t);
  const std::string ind = "    ";
  std::string body = ind + ct + " v = " + load_as("o[i]", in.dtype, t) + ";\n";
  if (e.bias >= 0) {
    if (e.bias >= static_cast<int>(in.args.size()) ||
        p.slot_type(in.args[static_cast<std::size_t>(e.bias)]).dtype != in.dtype)
      throw Error("cuda codegen: an epilogue bias that is not an operand of the result's dtype");
    body += ind + "const " + ct + " b = " +
            load_as(named("x", e.bias) + "[" + bias_at + "]", in.dtype, t) + ";\n";
    body += ind + "v = " + step_expr({Op::Add, -1, -1, -1, 0, in.dtype}, t, "v", "b") + ";\n";
  }
  if (e.activation != Op::Count_) {
    switch (e.activation) {
      case Op::Relu: case Op::Sigmoid: case Op::Tanh: case Op::Silu: case Op::Gelu:
      case Op::GeluTanh:
        break;
      default:
        throw Error(std::string("cuda codegen: an epilogue activation ") +
                    ir::op_name(e.activation));
    }
    body += ind + "v = " + step_expr({e.activation, -1, -1, -1, 0, in.dtype}, t, "v") + ";\n";
  }
  body += ind + "o[i] = " + store_as("v", t, in.dtype) + ";\n";
  return grid_loop(p, in, prefix, n, body);
}

}  // namespace loom::runtime::cuda
