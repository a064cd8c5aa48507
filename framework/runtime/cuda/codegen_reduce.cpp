// Reduction kernels: Sum, Mean, Max (AxesAttr, kept with size 1) and ArgMax (DimAttr), over
// an operand in memory or a prologue fusion evaluated element by element (fuse_reduce.h).
//
// The operand's dimensions are simplified as on the CPU (size-1 dimensions dropped, neighbours
// both reduced or both kept merged), which leaves output j's elements at koff(j) + roff(r) for
// r in [0, n_red). Each output is folded by a group of G threads of a 256-thread block, thread
// s taking r = s, s + G, ..., and the group's partial results are combined by a fixed tree, so
// a result never depends on timing. How threads are laid out depends on where the reduced
// elements lie:
//   - reduced innermost (a row sum, a softmax's denominator, BatchNorm's statistics over
//     [N, C, H, W]): a group's threads are neighbours, so they read neighbouring addresses;
//     G = 1 for rows of at most 16 elements, a warp (combined by shuffles) up to 2048, else
//     the whole block (combined in shared memory);
//   - kept innermost (a column sum): the block holds P neighbouring outputs (up to 32, so a
//     warp reads one row segment) and G = 256 / P slices of the rows for each.
// When that gives the GPU too few blocks (few outputs, each over many elements: a sum of
// everything, per-channel statistics), each output's range of r is cut into C chunks folded by
// different blocks into partial results, which a second launch combines in chunk order. The
// partials live in a __device__ array of the module (the backend gives a kernel no scratch
// memory), sized by the shape; the chunks depend on the shape only, so the results stay
// deterministic.
//
// Float sums accumulate in double (the CPU's accumulator), integer sums in int64; Max
// propagates NaN; ArgMax's first maximum wins and a NaN counts as the maximum, combined by a
// rule that does not depend on the order of the partial results.
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/codegen_expr.h"

#include <loom/error.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

namespace loom::runtime::cuda {
namespace {

using ir::Op;
using namespace gen;

constexpr int kThreads = 256;
// Blocks that keep an H100 busy (132 SMs, 8 blocks of 256 each): fewer, and the reduction is
// split into chunks.
constexpr int64_t kTargetBlocks = 1056;
// Elements each thread folds at least when a reduction is split into chunks.
constexpr int64_t kMinPerThread = 16;
// The most partial results a split reduction keeps (in its module's memory).
constexpr int64_t kMaxPartials = int64_t{1} << 16;

struct Strided {
  std::vector<int64_t> sizes, strides;
  int64_t count() const {
    int64_t n = 1;
    for (auto s : sizes) n *= s;
    return n;
  }
};

// The operand's dimensions, simplified, split into the kept ones (output j runs over them
// row-major) and the reduced ones (r runs over them row-major).
struct Layout {
  Strided kept, red;
  bool inner_reduced = true;  // the innermost dimension left is reduced (or none is left)
};

Layout layout_of(const Shape& shape, const std::vector<int64_t>& axes) {
  std::vector<int64_t> sizes, strides;
  std::vector<bool> reduced;
  int64_t stride = 1;
  std::vector<int64_t> contiguous(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    contiguous[d] = stride;
    stride *= shape[d];
  }
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    const bool r = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    if (!sizes.empty() && reduced.back() == r) {
      sizes.back() *= shape[d];
      strides.back() = contiguous[d];
    } else {
      sizes.push_back(shape[d]);
      strides.push_back(contiguous[d]);
      reduced.push_back(r);
    }
  }
  Layout l;
  l.inner_reduced = reduced.empty() || reduced.back();
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    Strided& s = reduced[d] ? l.red : l.kept;
    s.sizes.push_back(sizes[d]);
    s.strides.push_back(strides[d]);
  }
  return l;
}

// What a reduction keeps per thread (fields, combined field by field by shuffles or shared
// memory) and the code that folds an element in, combines another thread's fields (named with
// the suffix _o) and finishes the result.
struct Reducer {
  std::vector<std::pair<std::string, std::string>> fields;  // (C type, name)
  std::string init;     // declares and initialises the fields
  std::string fold;     // folds value `v` at reduced index `r`
  std::string combine;  // folds in the fields *_o of elements elsewhere in the operand
  std::string finish;   // the result, of the instruction's storage type
};

Reducer reducer_of(const ir::Instr& in, DType v, int64_t n_red) {
  const std::string vt = compute_type(v);
  const bool fp = v == DType::Float32 || v == DType::Float64;
  Reducer r;
  switch (in.op) {
    case Op::Sum:
    case Op::Mean: {
      const DType acc = fp ? DType::Float64 : DType::Int64;
      if (in.op == Op::Mean && !fp)
        throw Error(std::string("cuda codegen: mean is not defined on ") + dtype_name(v));
      r.fields = {{compute_type(acc), "acc"}};
      r.init = std::string(compute_type(acc)) + " acc = 0;";
      r.fold = std::string("acc += (") + compute_type(acc) + ")v;";
      r.combine = "acc += acc_o;";
      const std::string value =
          in.op == Op::Sum ? "acc" : "(acc / (double)" + std::to_string(n_red) + "LL)";
      r.finish = store_as(value, acc, in.dtype);
      return r;
    }
    case Op::Max:
      // A NaN wins and stays: once acc is NaN, v > acc is false.
      r.fields = {{vt, "acc"}};
      r.init = vt + " acc = " +
               (fp ? literal(-std::numeric_limits<double>::infinity(), v)
                   : v == DType::Int32 ? "(-2147483647 - 1)" : "(-9223372036854775807LL - 1)") +
               ";";
      r.fold = "if (v != v || v > acc) acc = v;";
      r.combine = "if (acc_o != acc_o || acc_o > acc) acc = acc_o;";
      r.finish = store_as("acc", v, in.dtype);
      return r;
    case Op::ArgMax:
      // arg < 0: nothing folded yet. A thread folds r in increasing order, so strictly greater
      // keeps its first maximum; partial results are combined by (NaN first, then the larger,
      // then the lower index), which gives the same answer in any order.
      r.fields = {{vt, "best"}, {"i64", "arg"}};
      r.init = vt + " best = 0; i64 arg = -1;";
      r.fold = "if (arg < 0 || (best == best && (v != v || v > best))) { best = v; arg = r; }";
      r.combine =
          "if (arg_o >= 0 && (arg < 0 || (best_o != best_o ? (best == best || arg_o < arg)"
          " : (best == best && (best_o > best || (best_o == best && arg_o < arg)))))) {"
          " best = best_o; arg = arg_o; }";
      r.finish = "(arg < 0 ? 0 : arg)";
      if (in.dtype != DType::Int64) throw Error("cuda codegen: an ArgMax that is not int64");
      return r;
    default:
      break;
  }
  throw Error(std::string("cuda codegen: ") + ir::op_name(in.op) + " is not a reduction");
}

// How the work is cut: P outputs per block, G threads per output, C chunks per output.
struct Plan {
  int P = 1, G = 1;
  int64_t C = 1, chunk = 0;  // chunk: reduced elements per chunk (a multiple of G)
  bool shuffle = false;      // the G threads of an output are neighbouring lanes of a warp
};

int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

Plan plan_of(const Layout& l, int64_t n_out, int64_t n_red) {
  Plan pl;
  if (l.inner_reduced) {
    pl.G = n_red <= 16 ? 1 : n_red <= 2048 ? 32 : kThreads;
  } else if (n_red > 8) {
    pl.G = static_cast<int>(kThreads / std::min<int64_t>(32, pow2_at_least(n_out)));
  }
  pl.P = kThreads / pl.G;
  pl.shuffle = l.inner_reduced && pl.G > 1 && pl.G <= 32;
  const int64_t out_blocks = (n_out + pl.P - 1) / pl.P;
  if (out_blocks < kTargetBlocks) {
    int64_t c = std::min((kTargetBlocks + out_blocks - 1) / out_blocks, n_red / (pl.G * kMinPerThread));
    while (c > 1 && n_out * c > kMaxPartials) c /= 2;
    pl.C = std::max<int64_t>(c, 1);
  }
  pl.chunk = (n_red + pl.C - 1) / pl.C;
  pl.chunk = (pl.chunk + pl.G - 1) / pl.G * pl.G;
  if (pl.chunk > 0) pl.C = (n_red + pl.chunk - 1) / pl.chunk;  // no empty chunk
  pl.C = std::max<int64_t>(pl.C, 1);
  return pl;
}

// Lines that combine the G partial results of each output into its thread s == 0.
std::string combine_code(const Reducer& red, const Plan& pl, bool inner) {
  if (pl.G == 1) return "";
  std::string s;
  if (pl.shuffle) {
    s += "  for (int w = " + std::to_string(pl.G / 2) + "; w > 0; w >>= 1) {\n";
    for (const auto& [type, name] : red.fields)
      s += "    const " + type + " " + name + "_o = __shfl_down_sync(0xffffffffu, " + name +
           ", w, " + std::to_string(pl.G) + ");\n";
    return s + "    " + red.combine + "\n  }\n";
  }
  const std::string apart = inner ? "w" : "w * " + std::to_string(pl.P);  // slice s + w's thread
  for (const auto& [type, name] : red.fields)
    s += "  __shared__ " + type + " sh_" + name + "[" + std::to_string(kThreads) + "];\n  sh_" +
         name + "[threadIdx.x] = " + name + ";\n";
  s += "  __syncthreads();\n  for (int w = " + std::to_string(pl.G / 2) +
       "; w > 0; w >>= 1) {\n    if (s < w) {\n";
  for (const auto& [type, name] : red.fields)
    s += "      const " + type + " " + name + "_o = sh_" + name + "[threadIdx.x + " + apart + "];\n";
  s += "      " + red.combine + "\n";
  for (const auto& [type, name] : red.fields) s += "      sh_" + name + "[threadIdx.x] = " + name + ";\n";
  return s + "    }\n    __syncthreads();\n  }\n";
}

}  // namespace

InstrCode reduce_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const ir::Fusion* f = in.fusion.get();
  // A fused prologue may read nothing (the sum of an iota or a constant); a plain one reads its operand.
  if (!f && in.args.empty()) throw Error(std::string("cuda codegen: ") + ir::op_name(in.op) + " without operands");
  const Shape& shape = f ? f->shape : p.slot_type(in.args[0]).shape;
  const DType x_dtype = f ? f->compute : p.slot_type(in.args[0]).dtype;
  if (x_dtype == DType::Bool)
    throw Error(std::string("cuda codegen: ") + ir::op_name(in.op) + " is not defined on bool");
  const DType v = arith_dtype(x_dtype);
  if (f) check_loads(p, in);

  std::vector<int64_t> axes;
  if (in.op == Op::ArgMax) axes = {in.attr.get<ir::DimAttr>().dim};
  else axes = in.attr.get<ir::AxesAttr>().axes;
  const Layout l = layout_of(shape, axes);
  const int64_t n_out = l.kept.count(), n_red = l.red.count();
  if (n_out != shape_numel(in.shape))
    throw Error(std::string("cuda codegen: ") + ir::op_name(in.op) + " of " + shape_str(shape) +
                " to " + shape_str(in.shape));
  InstrCode code;
  if (n_out == 0) return code;  // nothing to write: no launch

  const Reducer red = reducer_of(in, v, n_red);
  const Plan pl = plan_of(l, n_out, n_red);
  const std::string I = index_type(shape_numel(shape) + 2 * kThreads);
  const std::string main = prefix + "_main", combine = prefix + "_combine";
  const bool split = pl.C > 1;
  std::string& s = code.source;

  if (split)  // the partial results, per output chunk by chunk
    for (const auto& [type, name] : red.fields)
      s += "__device__ " + type + " " + prefix + "_part_" + name + "[" + std::to_string(n_out * pl.C) + "];\n";

  // Output j (of P per block), slice s of its G threads, chunk c of its C.
  s += kernel_head(main, kThreads, in.args.size()) + " {\n" + pointers(p, in, "  ");
  const std::string G = std::to_string(pl.G), P = std::to_string(pl.P), C = std::to_string(pl.C);
  if (l.inner_reduced)
    s += "  const int s = threadIdx.x % " + G + ";\n  const " + I + " j = (" + I + ")(blockIdx.x / " + C +
         ") * " + P + " + threadIdx.x / " + G + ";\n";
  else
    s += "  const int s = threadIdx.x / " + P + ";\n  const " + I + " j = (" + I + ")(blockIdx.x / " + C +
         ") * " + P + " + threadIdx.x % " + P + ";\n";
  s += "  " + red.init + "\n";
  if (n_red > 0) {
    const std::string chunk = std::to_string(pl.chunk);
    s += "  if (j < " + std::to_string(n_out) + ") {\n";
    s += "    const " + I + " base = " + offset_expr(l.kept.sizes, l.kept.strides, "j") + ";\n";
    if (split)
      s += "    const " + I + " r0 = (" + I + ")(blockIdx.x % " + C + ") * " + chunk + ";\n" +
           "    const " + I + " r1 = min(r0 + " + chunk + ", (" + I + ")" + std::to_string(n_red) + ");\n";
    else
      s += "    const " + I + " r0 = 0, r1 = " + std::to_string(n_red) + ";\n";
    // Unrolled, so that a thread can have several loads in flight (the fold order, and so
    // the result, is unchanged). Per-channel sums over ResNet-20's first-stage channels-last
    // bfloat16 activations ([1024,32,32,16], 33 MB each) took 60-78 us on an H100, several
    // times a pass at its ~3 TB/s, with one 2-byte load per thread at a time; the unrolled
    // version's gain was within that session's noise.
    s += "    #pragma unroll 8\n    for (" + I + " r = r0 + s; r < r1; r += " + G + ") {\n";
    s += "      const " + I + " e = base + " + offset_expr(l.red.sizes, l.red.strides, "r") + ";\n";
    if (f) {
      std::string last;
      s += fusion_values(*f, "e", "      ", &last);
      s += std::string("      const ") + compute_type(v) + " v = " + last + ";\n";
    } else {
      s += std::string("      const ") + compute_type(v) + " v = " + load_as("x0[e]", x_dtype, v) + ";\n";
    }
    s += "      " + red.fold + "\n    }\n  }\n";
  }
  s += combine_code(red, pl, l.inner_reduced);
  s += "  if (s == 0 && j < " + std::to_string(n_out) + ") {\n";
  if (split)
    for (const auto& [type, name] : red.fields)
      s += "    " + prefix + "_part_" + name + "[j * " + C + " + blockIdx.x % " + C + "] = " + name + ";\n";
  else
    s += "    o[j] = " + red.finish + ";\n";
  s += "  }\n}\n";
  const int64_t blocks = (n_out + pl.P - 1) / pl.P * pl.C;
  if (blocks > int64_t{0x7fffffff}) throw Error("cuda codegen: a reduction too large for one grid");
  code.launches.push_back({main, blocks, kThreads, 0});
  if (!split) return code;

  // The chunks' partial results, combined in chunk order: one thread per output.
  s += kernel_head(combine, kThreads, in.args.size()) + " {\n" + pointers(p, in, "  ");
  s += "  const int j = blockIdx.x * blockDim.x + threadIdx.x;\n  if (j >= " + std::to_string(n_out) +
       ") return;\n";
  for (const auto& [type, name] : red.fields)
    s += "  " + type + " " + name + " = " + prefix + "_part_" + name + "[j * " + C + "];\n";
  s += "  for (int c = 1; c < " + C + "; ++c) {\n";
  for (const auto& [type, name] : red.fields)
    s += "    const " + type + " " + name + "_o = " + prefix + "_part_" + name + "[j * " + C + " + c];\n";
  s += "    " + red.combine + "\n  }\n  o[j] = " + red.finish + ";\n}\n";
  code.launches.push_back({combine, (n_out + kThreads - 1) / kThreads, kThreads, 0});
  return code;
}

}  // namespace loom::runtime::cuda
