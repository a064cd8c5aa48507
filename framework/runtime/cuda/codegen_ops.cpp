// Movement, Iota and the random ops as CUDA C (codegen.h); indexing is in codegen_index.cpp
// and pooling in codegen_pool.cpp. Semantics are the CPU backend's (runtime/cpu/
// kernels_movement.cpp, kernels_elementwise.cpp, kernels_random.cpp), element for element.
//
// Permute, Slice and Expand are one strided gather: the flat output index is split into
// coordinates and each coordinate adds (coordinate * input stride) to the source offset. The
// dimensions are first coalesced (as the CPU's CopyPlan does), so a slice of whole rows or a
// permute that keeps blocks together splits only a few coordinates. A permute that moves the
// input's contiguous dimension away from the last one goes through a shared-memory tile
// instead, so that both the reads and the writes of a warp are contiguous.
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/kernel_text.h"

#include <loom/bfloat16.h>
#include <loom/error.h>

#include <string>
#include <vector>

namespace loom::runtime::cuda {
namespace {

using text::contiguous;
using text::num;

// The output's dimensions with the input stride of each: size-1 dimensions dropped, and a
// dimension merged into its outer neighbour when the input walks them as one run (the output
// is contiguous, so it always does).
struct Walk {
  std::vector<int64_t> sizes, strides;
  int64_t base = 0;
};

Walk coalesce(const Shape& shape, const std::vector<int64_t>& strides, int64_t base) {
  Walk w;
  w.base = base;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!w.sizes.empty() && w.strides.back() == strides[d] * shape[d]) {
      w.sizes.back() *= shape[d];
      w.strides.back() = strides[d];
      continue;
    }
    w.sizes.push_back(shape[d]);
    w.strides.push_back(strides[d]);
  }
  return w;
}

// `off` += the input offset of `r`'s coordinates over w's dimensions, innermost first; the
// outermost coordinate needs no modulo.
std::string walk_offset(const Walk& w, const std::string& r, const std::string& off) {
  std::string s;
  for (std::size_t d = w.sizes.size(); d-- > 1;)
    s += "  " + off + " += (" + r + " % " + num(w.sizes[d]) + ") * " + num(w.strides[d]) + "; " +
         r + " /= " + num(w.sizes[d]) + ";\n";
  if (!w.sizes.empty()) s += "  " + off + " += " + r + " * " + num(w.strides[0]) + ";\n";
  return s;
}

InstrCode strided_copy(const std::string& prefix, std::size_t args, DType dtype, int64_t n,
                       int64_t in_numel, const Walk& w) {
  const std::string entry = prefix + "_copy";
  const char* I = text::index_type(std::max(n, in_numel));
  const char* U = text::bits_type(dtype);
  std::string src = text::flat_head(entry, args, n, I);
  src += std::string("  ") + I + " r = t, s = " + num(w.base) + ";\n";
  src += walk_offset(w, "r", "s");
  src += std::string("  ((") + U + "*)out_)[t] = ((const " + U + "*)a0_)[s];\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

// A transposing copy: dimension `a` of the walk is the input's contiguous one (stride 1) and
// the last dimension (contiguous in the output) has a stride in the input. A block moves a
// 32 x 32 tile: it reads 32-element runs along `a` and writes 32-element runs along the last
// dimension, through shared memory padded by one column so that neither side conflicts.
InstrCode tiled_transpose(const std::string& prefix, std::size_t args, DType dtype, int64_t n,
                          int64_t in_numel, const Walk& w, std::size_t a) {
  constexpr int kTile = 32, kRows = 8;  // a 32 x 8 block; each thread moves 4 elements
  const std::string entry = prefix + "_tile";
  const char* I = text::index_type(std::max(n, in_numel));
  const char* U = text::bits_type(dtype);
  const std::size_t last = w.sizes.size() - 1;
  const int64_t size_a = w.sizes[a], size_l = w.sizes[last];
  const int64_t tiles_a = (size_a + kTile - 1) / kTile, tiles_l = (size_l + kTile - 1) / kTile;
  // The dimensions other than `a` and `last` pick the tile's plane; their output strides.
  const auto out_strides = contiguous(Shape(w.sizes.begin(), w.sizes.end()));
  int64_t planes = 1;
  std::string plane_code;
  for (std::size_t d = last; d-- > 0;) {
    if (d == a) continue;
    plane_code += "  in_base += (b % " + num(w.sizes[d]) + ") * " + num(w.strides[d]) +
                  "; out_base += (b % " + num(w.sizes[d]) + ") * " + num(out_strides[d]) +
                  "; b /= " + num(w.sizes[d]) + ";\n";
    planes *= w.sizes[d];
  }
  std::string src = text::signature(entry, args);
  src += std::string("  __shared__ ") + U + " tile[" + std::to_string(kTile) + "][" +
         std::to_string(kTile + 1) + "];\n";
  src += std::string("  const ") + U + "* in = (const " + U + "*)a0_;\n  " + U + "* out = (" +
         U + "*)out_;\n";
  src += std::string("  ") + I + " b = blockIdx.x;\n";
  src += std::string("  const ") + I + " l0 = (b % " + num(tiles_l) + ") * " +
         std::to_string(kTile) + "; b /= " + num(tiles_l) + ";\n";
  src += std::string("  const ") + I + " a_start = (b % " + num(tiles_a) + ") * " +
         std::to_string(kTile) + "; b /= " + num(tiles_a) + ";\n";
  src += std::string("  ") + I + " in_base = " + num(w.base) + ", out_base = 0;\n" + plane_code;
  src += "  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;\n";
  // Read: consecutive threads walk `a`, contiguous in the input.
  src += "  for (int j = ty; j < 32; j += " + std::to_string(kRows) + ") {\n";
  src += std::string("    const ") + I + " ia = a_start + tx, il = l0 + j;\n";
  src += "    if (ia < " + num(size_a) + " && il < " + num(size_l) +
         ") tile[j][tx] = in[in_base + ia + il * " + num(w.strides[last]) + "];\n  }\n";
  src += "  __syncthreads();\n";
  // Write: consecutive threads walk the last dimension, contiguous in the output.
  src += "  for (int j = ty; j < 32; j += " + std::to_string(kRows) + ") {\n";
  src += std::string("    const ") + I + " ia = a_start + j, il = l0 + tx;\n";
  src += "    if (ia < " + num(size_a) + " && il < " + num(size_l) + ") out[out_base + ia * " +
         num(out_strides[a]) + " + il] = tile[tx][j];\n  }\n}\n";
  const int64_t blocks = planes * tiles_a * tiles_l;
  return {Runs::Kernels, std::move(src), {Launch{entry, blocks, kTile * kRows, 0}}};
}

// Permute, Slice, Expand: the strided copy of operand 0, tiled when it transposes.
InstrCode gather_copy(const ir::Program& p, const ir::Instr& in, const std::string& prefix,
                      const Walk& w) {
  const int64_t n = shape_numel(in.shape);
  const int64_t in_numel = shape_numel(p.slot_type(in.args[0]).shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  // Tiling pays when both sides of the transpose are long enough to fill a warp's run.
  const std::size_t r = w.sizes.size();
  if (r >= 2 && w.strides[r - 1] != 1 && w.sizes[r - 1] >= 16)
    for (std::size_t a = 0; a + 1 < r; ++a)
      if (w.strides[a] == 1 && w.sizes[a] >= 16)
        return tiled_transpose(prefix, in.args.size(), in.dtype, n, in_numel, w, a);
  return strided_copy(prefix, in.args.size(), in.dtype, n, in_numel, w);
}

// A value of `t` as the bits its storage holds, for a fill.
std::string stored_literal(double v, DType t) {
  if (t == DType::BFloat16)
    return "(bf16)" + std::to_string(bfloat16(static_cast<float>(v)).bits) + "u";
  return literal(v, t);
}

InstrCode pad_code(const ir::Program& p, const ir::Instr& in, const std::string& prefix) {
  const auto& a = in.attr.get<ir::PadAttr>();
  const Shape& xs = p.slot_type(in.args[0]).shape;
  const std::size_t rank = xs.size();
  if (a.lo.size() != rank || a.hi.size() != rank)
    throw Error("cuda codegen: pad: expected a low and a high pad per dimension");
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  // An unpadded dimension merges into its outer neighbour: the pair is then one dimension
  // padded by lo * size before and (hi * size) after, and holding xs * size input elements.
  std::vector<int64_t> sizes, lo, inside;
  for (std::size_t d = 0; d < rank; ++d) {
    if (!sizes.empty() && a.lo[d] == 0 && a.hi[d] == 0) {
      sizes.back() *= in.shape[d];
      lo.back() *= in.shape[d];
      inside.back() *= xs[d];
      continue;
    }
    sizes.push_back(in.shape[d]);
    lo.push_back(a.lo[d]);
    inside.push_back(xs[d]);
  }
  const auto in_strides = contiguous(Shape(inside.begin(), inside.end()));
  const std::string entry = prefix + "_pad";
  const char* I = text::index_type(n);
  const char* T = storage_type(in.dtype);
  std::string src = text::flat_head(entry, in.args.size(), n, I);
  src += std::string("  ") + I + " r = t, s = 0;\n  bool in_x = true;\n";
  for (std::size_t d = sizes.size(); d-- > 0;) {
    const std::string coord = d > 0 ? "r % " + num(sizes[d]) : std::string("r");
    src += std::string("  { const ") + I + " c = " + coord + " - " + num(lo[d]) +
           "; in_x = in_x && c >= 0 && c < " + num(inside[d]) + "; s += c * " +
           num(in_strides[d]) + ";";
    if (d > 0) src += " r /= " + num(sizes[d]) + ";";
    src += " }\n";
  }
  src += std::string("  ((") + T + "*)out_)[t] = in_x ? ((const " + T + "*)a0_)[s] : " +
         stored_literal(a.value, in.dtype) + ";\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

// Each output row along the axis (one per outer index) is the operands' runs side by side; a
// thread finds its operand by comparing its position in the row with the runs' ends.
InstrCode concat_code(const ir::Program& p, const ir::Instr& in, const std::string& prefix) {
  const auto axis = static_cast<std::size_t>(in.attr.get<ir::DimAttr>().dim);
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  int64_t inner = 1;
  for (std::size_t d = axis + 1; d < in.shape.size(); ++d) inner *= in.shape[d];
  const int64_t row = in.shape[axis] * inner;
  const std::string entry = prefix + "_concat";
  const char* I = text::index_type(n);
  const char* U = text::bits_type(in.dtype);
  std::string src = text::flat_head(entry, in.args.size(), n, I);
  src += std::string("  const ") + I + " o = t / " + num(row) + ", j = t % " + num(row) + ";\n";
  src += std::string("  ") + U + " v;\n  ";
  int64_t start = 0;
  for (std::size_t k = 0; k < in.args.size(); ++k) {
    const int64_t run = p.slot_type(in.args[k]).shape[axis] * inner;
    if (run == 0) continue;
    const std::string read = std::string("((const ") + U + "*)a" + std::to_string(k) +
                             "_)[o * " + num(run) + " + j - " + num(start) + "]";
    start += run;
    src += start < row ? "if (j < " + num(start) + ") v = " + read + ";\n  else " : "v = " + read + ";\n";
  }
  src += std::string("  ((") + U + "*)out_)[t] = v;\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

InstrCode iota_code(const ir::Instr& in, const std::string& prefix) {
  const auto dim = static_cast<std::size_t>(in.attr.get<ir::DimAttr>().dim);
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  int64_t inner = 1;
  for (std::size_t d = dim + 1; d < in.shape.size(); ++d) inner *= in.shape[d];
  const std::string entry = prefix + "_iota";
  const char* I = text::index_type(n);
  const std::string v = "(t / " + num(inner) + ") % " + num(in.shape[dim]);
  std::string value;  // converted as the CPU's convert<T>: bool is "not zero", bf16 via float
  switch (in.dtype) {
    case DType::Bool: value = "(unsigned char)((" + v + ") != 0)"; break;
    case DType::BFloat16: value = "f_to_bf16((float)(" + v + "))"; break;
    case DType::Float32: case DType::Float64: case DType::Int64: case DType::Int32:
      value = std::string("(") + storage_type(in.dtype) + ")(" + v + ")";
      break;
  }
  std::string src = text::flat_head(entry, in.args.size(), n, I);
  src += std::string("  ((") + storage_type(in.dtype) + "*)out_)[t] = " + value + ";\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

}  // namespace

InstrCode movement_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  using ir::Op;
  switch (in.op) {
    case Op::Permute: {
      const auto& perm = in.attr.get<ir::PermuteAttr>().perm;
      const auto xs = contiguous(p.slot_type(in.args[0]).shape);
      std::vector<int64_t> st(perm.size());
      for (std::size_t d = 0; d < perm.size(); ++d) st[d] = xs[static_cast<std::size_t>(perm[d])];
      return gather_copy(p, in, prefix, coalesce(in.shape, st, 0));
    }
    case Op::Slice: {
      const auto& a = in.attr.get<ir::SliceAttr>();
      const auto xs = contiguous(p.slot_type(in.args[0]).shape);
      if (a.starts.size() != xs.size() || a.steps.size() != xs.size())
        throw Error("cuda codegen: slice: expected a start and a step per dimension");
      std::vector<int64_t> st(xs.size());
      int64_t base = 0;
      for (std::size_t d = 0; d < xs.size(); ++d) {
        base += a.starts[d] * xs[d];
        st[d] = a.steps[d] * xs[d];
      }
      return gather_copy(p, in, prefix, coalesce(in.shape, st, base));
    }
    case Op::Expand: {
      const Shape& x = p.slot_type(in.args[0]).shape;
      auto st = contiguous(x);
      if (x.size() != in.shape.size()) throw Error("cuda codegen: expand: expected the same rank");
      for (std::size_t d = 0; d < st.size(); ++d)
        if (x[d] != in.shape[d]) st[d] = 0;  // a size-1 dimension broadcast
      return gather_copy(p, in, prefix, coalesce(in.shape, st, 0));
    }
    case Op::Pad: return pad_code(p, in, prefix);
    case Op::Concat: return concat_code(p, in, prefix);
    case Op::Iota: return iota_code(in, prefix);
    default: break;
  }
  throw Error(std::string("cuda codegen: movement_code got ") + ir::op_name(in.op));
}

// The CPU's counter-based generator (kernels_random.cpp), spelled identically:
//   bits(seed, c) = mix(mix(seed) + (c + 1) * 0x9E3779B97F4A7C15), mix = SplitMix64's finalizer;
//   rand:  float32 (bits >> 40) * 2^-24, float64 (bits >> 11) * 2^-53;
//   randn: Box-Muller in double over counters 2i and 2i + 1, rounded to the dtype.
// bfloat16 (never produced by the compiler, which widens it) rounds the float32 value.
InstrCode random_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const bool normal = in.op == ir::Op::RandNormal;
  if (in.op != ir::Op::RandNormal && in.op != ir::Op::RandUniform)
    throw Error(std::string("cuda codegen: random_code got ") + ir::op_name(in.op));
  if (!is_floating(in.dtype))
    throw Error(std::string(normal ? "randn" : "rand") + ": expected a floating dtype, got " +
                dtype_name(in.dtype));
  if (in.args.size() != 1 || p.slot_type(in.args[0]).dtype != DType::Int64)
    throw Error("cuda codegen: a random op takes one int64 seed operand");
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  const std::string mix = prefix + "_mix", bits = prefix + "_bits";
  std::string src;
  src += "__device__ __forceinline__ unsigned long long " + mix + "(unsigned long long z) {\n";
  src += "  z ^= z >> 30; z *= 0xBF58476D1CE4E5B9ULL;\n";
  src += "  z ^= z >> 27; z *= 0x94D049BB133111EBULL;\n";
  src += "  return z ^ (z >> 31);\n}\n";
  src += "__device__ __forceinline__ unsigned long long " + bits +
         "(unsigned long long key, unsigned long long c) {\n";
  src += "  return " + mix + "(key + (c + 1ULL) * 0x9E3779B97F4A7C15ULL);\n}\n";
  const std::string entry = prefix + (normal ? "_randn" : "_rand");
  src += text::flat_head(entry, in.args.size(), n, "i64");
  src += "  const unsigned long long key = " + mix + "((unsigned long long)*(const i64*)a0_);\n";
  src += "  const unsigned long long c = (unsigned long long)t;\n";
  const std::string two_pow53 = "1.1102230246251565404236316680908203125e-16";  // exact
  std::string value;  // a double for float64, a float otherwise
  if (normal) {
    src += "  const double u1 = (double)((" + bits + "(key, 2ULL * c) >> 11) + 1ULL) * " +
           two_pow53 + ";\n";
    src += "  const double u2 = (double)(" + bits + "(key, 2ULL * c + 1ULL) >> 11) * " +
           two_pow53 + ";\n";
    src += "  const double z = sqrt(-2.0 * log(u1)) * cos(6.28318530717958647692 * u2);\n";
    value = in.dtype == DType::Float64 ? "z" : "(float)z";
  } else if (in.dtype == DType::Float64) {
    value = "(double)(" + bits + "(key, c) >> 11) * " + two_pow53;
  } else {
    value = "(float)(" + bits + "(key, c) >> 40) * 5.9604644775390625e-08f";  // 2^-24, exact
  }
  if (in.dtype == DType::BFloat16) value = "f_to_bf16(" + value + ")";
  src += std::string("  ((") + storage_type(in.dtype) + "*)out_)[t] = " + value + ";\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

}  // namespace loom::runtime::cuda
