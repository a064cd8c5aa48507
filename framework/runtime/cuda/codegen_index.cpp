// Indexing as CUDA C (codegen.h: index_code): Gather, IndexSelect, ScatterAdd and OneHot,
// matching the CPU's kernels (runtime/cpu/kernels_index.cpp). The CPU throws on an index out
// of range before writing anything; a kernel cannot, so it calls report_error (the backend
// then fails the program naming the op) and skips the element.
//
// ScatterAdd is deterministic and sums like the CPU: every element of the result starts from
// `self` and adds its sources in increasing position along `dim`, each element owned by one
// thread for the whole scatter (no atomics). View index and src as [outer, L, inner] around
// dim; each (outer, inner) column scatters into its own column of the result. Two kernels:
//  - columns: one thread per (column, block of result rows along dim) walks the column's L
//    indices in order and adds those that land in its rows. Splitting the rows into blocks
//    buys parallelism when columns are few, at the price of each block re-reading the index.
//  - rows: when the index is the same across a line of inner positions (the embedding
//    gradient: an index [T] expanded to [T, D]; detected from the Expand that made it, or
//    inner == 1), a block owns a range of result rows and all D columns. It reads the index
//    once per position, gathers the positions that land in its rows (in order, through a
//    ballot), and its threads add those source rows, coalesced along D.
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/kernel_text.h"

#include <loom/error.h>

#include <algorithm>
#include <string>
#include <vector>

namespace loom::runtime::cuda {
namespace {

using text::contiguous;
using text::num;

int64_t product(const Shape& s, std::size_t b, std::size_t e) {
  int64_t n = 1;
  for (std::size_t d = b; d < e; ++d) n *= s[d];
  return n;
}

// Statements adding to `off` the offset in x (strides `xs`) of the coordinates that `r`
// (consumed) has over dims [b, e) of the index's shape `is`.
std::string place(const Shape& is, const std::vector<int64_t>& xs, std::size_t b, std::size_t e,
                  const std::string& r, const std::string& off) {
  std::string s;
  for (std::size_t d = e; d-- > b;) {
    if (is[d] == 1) continue;
    s += "  " + off + " += (" + r + " % " + num(is[d]) + ") * " + num(xs[d]) + "; " + r +
         " /= " + num(is[d]) + ";\n";
  }
  return s;
}

// The bounds check of index value `j` against `size`: reports and skips the element.
std::string check(int i, const std::string& j, int64_t size, const std::string& then) {
  return "  if (" + j + " < 0 || " + j + " >= " + text::wide(size) + ") { report_error(" +
         std::to_string(i) + "); " + then + " }\n";
}

InstrCode gather_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const auto dim = static_cast<std::size_t>(in.attr.get<ir::DimAttr>().dim);
  const Shape& x = p.slot_type(in.args[0]).shape;
  const Shape& is = p.slot_type(in.args[1]).shape;
  const int64_t n = shape_numel(is);
  if (n == 0) return {Runs::Kernels, {}, {}};
  const auto xs = contiguous(x);
  const std::string entry = prefix + "_gather";
  const char* I = text::index_type(std::max(n, shape_numel(x)));
  const char* U = text::bits_type(in.dtype);
  std::string src = text::flat_head(entry, in.args.size(), n, I);
  src += "  const i64 j = ((const i64*)a1_)[t];\n" + check(i, "j", x[dim], "return;");
  src += std::string("  ") + I + " r = t, s = (" + I + ")j * " + num(xs[dim]) + ";\n";
  src += place(is, xs, dim + 1, is.size(), "r", "s");
  src += "  r /= " + num(is[dim]) + ";\n";
  src += place(is, xs, 0, dim, "r", "s");
  src += std::string("  ((") + U + "*)out_)[t] = ((const " + U + "*)a0_)[s];\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

InstrCode index_select_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const auto dim = static_cast<std::size_t>(in.attr.get<ir::DimAttr>().dim);
  const Shape& x = p.slot_type(in.args[0]).shape;
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  const int64_t inner = product(x, dim + 1, x.size()), len = in.shape[dim];
  const std::string entry = prefix + "_index_select";
  const char* I = text::index_type(std::max(n, shape_numel(x)));
  const char* U = text::bits_type(in.dtype);
  std::string src = text::flat_head(entry, in.args.size(), n, I);
  src += std::string("  const ") + I + " q = t % " + num(inner) + ", r = t / " + num(inner) +
         ";\n  const i64 j = ((const i64*)a1_)[r % " + num(len) + "];\n" +
         check(i, "j", x[dim], "return;");
  src += std::string("  ((") + U + "*)out_)[t] = ((const " + U + "*)a0_)[(r / " + num(len) +
         " * " + num(x[dim]) + " + (" + I + ")j) * " + num(inner) + " + q];\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

InstrCode one_hot_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const int64_t classes = in.attr.get<ir::OneHotAttr>().num_classes;
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  if (in.dtype != DType::Int64) throw Error("cuda codegen: one_hot: expected an int64 result");
  const std::string entry = prefix + "_one_hot";
  const char* I = text::index_type(n);
  std::string src = text::flat_head(entry, in.args.size(), n, I);
  // A bad index is reported once per row, whose elements are all written 0.
  src += std::string("  const ") + I + " c = t % " + num(classes) +
         ";\n  const i64 j = ((const i64*)a0_)[t / " + num(classes) + "];\n";
  src += "  if ((j < 0 || j >= " + text::wide(classes) + ") && c == 0) report_error(" +
         std::to_string(i) + ");\n";
  src += "  ((i64*)out_)[t] = j == (i64)c ? 1 : 0;\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

InstrCode scatter_add_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  const auto dim = static_cast<std::size_t>(in.attr.get<ir::DimAttr>().dim);
  if (in.dtype == DType::Bool || in.dtype == DType::BFloat16)
    throw Error(std::string("scatter_add: expected a numeric dtype, got ") + dtype_name(in.dtype) +
                (in.dtype == DType::BFloat16 ? " (the compiler widens bfloat16 to float32)" : ""));
  const Shape& self = p.slot_type(in.args[0]).shape;
  const Shape& is = p.slot_type(in.args[1]).shape;
  const auto ss = contiguous(self);
  const int64_t n = shape_numel(self), m = shape_numel(is);
  const char* I = text::index_type(std::max(n, m));
  const char* T = storage_type(in.dtype);
  InstrCode code;
  // The result starts as a copy of self (a no-op when self donated its buffer to it).
  if (n > 0) {
    const std::string entry = prefix + "_copy";
    code.source += text::flat_head(entry, in.args.size(), n, I);
    code.source += std::string("  ((") + T + "*)out_)[t] = ((const " + T + "*)a0_)[t];\n}\n";
    code.launches.push_back(text::flat_launch(entry, n));
  }
  if (m == 0) return code;

  const int64_t outer = product(is, 0, dim), len = is[dim], inner = product(is, dim + 1, is.size());
  const int64_t size = self[dim];
  // The result offset of inner position q (the index may be smaller than self off dim).
  bool inner_is_self = true;
  for (std::size_t d = dim + 1; d < is.size(); ++d) inner_is_self = inner_is_self && is[d] == self[d];
  auto inner_offset = [&](const std::string& q, const std::string& indent) {
    if (inner_is_self) return indent + "const " + I + " qo = " + q + ";\n";
    std::string s = indent + I + " qo = 0, rq = " + q + ";\n";
    s += place(is, ss, dim + 1, is.size(), "rq", "qo");
    return s;
  };
  const std::string head = std::string("  const i64* idx = (const i64*)a1_;\n  const ") + T +
                           "* src = (const " + T + "*)a2_;\n  " + T + "* out = (" + T + "*)out_;\n";
  // Result rows along dim are split into `blocks` ranges of `rows` rows.
  auto split = [&](int64_t want) {
    const int64_t blocks = std::clamp<int64_t>(want, 1, std::max<int64_t>(size, 1));
    const int64_t rows = std::max<int64_t>(1, (size + blocks - 1) / blocks);
    return std::pair{std::max<int64_t>(1, (size + rows - 1) / rows), rows};
  };

  if (ir::index_uniform_inner(p, in.args[1], dim)) {
    // About 512 blocks: enough to fill a GPU, few enough that the index reads stay cheap.
    const auto [vblocks, rows] = split((512 + outer - 1) / outer);
    const std::string entry = prefix + "_scatter_rows";
    std::string s = text::signature(entry, in.args.size()) + head;
    s += "  __shared__ int hit_k[256], hit_v[256], warp_hits[8];\n";
    s += "  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n";
    s += std::string("  ") + I + " r = blockIdx.x / " + num(vblocks) + ", out_base = 0;\n";
    s += "  const i64 vb = blockIdx.x % " + num(vblocks) + ", v0 = vb * " + text::wide(rows) +
         ", v1 = min(v0 + " + text::wide(rows) + ", " + text::wide(size) + ");\n";
    s += std::string("  const ") + I + " at0 = r * " + num(len * inner) + ";\n";
    s += place(is, ss, 0, dim, "r", "out_base");
    s += std::string("  for (") + I + " k0 = 0; k0 < " + num(len) + "; k0 += 256) {\n";
    s += std::string("    const ") + I + " k = k0 + tid;\n    bool hit = false;\n    int v = 0;\n";
    s += "    if (k < " + num(len) + ") {\n      const i64 j = idx[at0 + k * " + num(inner) + "];\n";
    s += "      if (j < 0 || j >= " + text::wide(size) + ") { if (vb == 0) report_error(" +
         std::to_string(i) + "); }\n";
    s += "      else if (j >= v0 && j < v1) { hit = true; v = (int)(j - v0); }\n    }\n";
    // The hits of this chunk, in position order: a warp's by ballot, after earlier warps'.
    s += "    const unsigned m = __ballot_sync(0xffffffffu, hit);\n";
    s += "    if (lane == 0) warp_hits[warp] = __popc(m);\n    __syncthreads();\n";
    s += "    int before = 0, total = 0;\n";
    s += "    for (int w = 0; w < 8; ++w) { before += w < warp ? warp_hits[w] : 0; total += warp_hits[w]; }\n";
    s += "    if (hit) { const int at = before + __popc(m & ((1u << lane) - 1u)); hit_k[at] = (int)(k - k0); hit_v[at] = v; }\n";
    s += "    __syncthreads();\n";
    s += "    for (int h = 0; h < total; ++h) {\n";
    s += std::string("      const ") + I + " from = at0 + (k0 + hit_k[h]) * " + num(inner) +
         ", to = out_base + (" + I + ")(v0 + hit_v[h]) * " + num(ss[dim]) + ";\n";
    s += std::string("      for (") + I + " q = tid; q < " + num(inner) + "; q += 256) {\n";
    s += inner_offset("q", "        ");
    s += "        out[to + qo] += src[from + q];\n      }\n    }\n";
    s += "    __syncthreads();  // the next chunk rewrites the hit lists\n  }\n}\n";
    code.source += s;
    code.launches.push_back(Launch{entry, outer * vblocks, 256, 0});
    return code;
  }

  // Columns: about 32k threads, each walking its column's L indices.
  const int64_t columns = outer * inner;
  const auto [vblocks, rows] = split((32768 + columns - 1) / columns);
  const int64_t threads = columns * vblocks;
  const std::string entry = prefix + "_scatter_columns";
  std::string s = text::flat_head(entry, in.args.size(), threads, I) + head;
  s += std::string("  const ") + I + " q = t % " + num(inner) + ";\n  " + I + " r = t / " +
       num(inner) + ";\n";
  s += "  const i64 vb = r % " + num(vblocks) + ", v0 = vb * " + text::wide(rows) +
       ", v1 = min(v0 + " + text::wide(rows) + ", " + text::wide(size) + ");\n";
  s += "  r /= " + num(vblocks) + ";\n";
  s += std::string("  ") + I + " at = r * " + num(len * inner) + " + q, out_base = 0;\n";
  s += place(is, ss, 0, dim, "r", "out_base");
  s += inner_offset("q", "  ");
  s += "  out_base += qo;\n";
  s += std::string("  for (") + I + " k = 0; k < " + num(len) + "; ++k, at += " + num(inner) +
       ") {\n";
  s += "    const i64 j = idx[at];\n";
  s += "    if (j < 0 || j >= " + text::wide(size) + ") { if (vb == 0) report_error(" +
       std::to_string(i) + "); continue; }\n";
  s += std::string("    if (j >= v0 && j < v1) out[out_base + (") + I + ")j * " + num(ss[dim]) +
       "] += src[at];\n  }\n}\n";
  code.source += s;
  code.launches.push_back(text::flat_launch(entry, threads));
  return code;
}

}  // namespace

InstrCode index_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  switch (in.op) {
    case ir::Op::Gather: return gather_code(p, i, prefix);
    case ir::Op::IndexSelect: return index_select_code(p, i, prefix);
    case ir::Op::ScatterAdd: return scatter_add_code(p, i, prefix);
    case ir::Op::OneHot: return one_hot_code(p, i, prefix);
    default: break;
  }
  throw Error(std::string("cuda codegen: index_code got ") + ir::op_name(in.op));
}

}  // namespace loom::runtime::cuda
