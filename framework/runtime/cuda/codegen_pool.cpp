// Pooling as CUDA C (codegen.h: pool_code): MaxPool2d, AvgPool2d and their gradients over
// [N,C,H,W], matching the CPU's kernels (runtime/cpu/kernels_compute.cpp, kernels_grad.cpp)
// bit for bit: the same window scan, the same divisor, sums in the same order and type.
//
// The forwards run one thread per output element. The gradients run one thread per input
// element, which visits the windows that hold it in (oy, ox) order and adds what each sends
// it: the CPU scatters window by window in that same order, so each input's sum is formed in
// the same order without atomics (deterministic). A max window's winner is recomputed by the
// forward's scan (the first maximum; a NaN takes over), so no argmax buffer is needed.
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/kernel_text.h"

#include <loom/error.h>

#include <cmath>
#include <limits>
#include <string>

namespace loom::runtime::cuda {
namespace {

using text::num;

struct Geometry {
  int64_t planes, h, w, oh, ow;
};

// The window geometry as constants, and the scan loops' bounds for output (oy, ox).
std::string constants(const ir::Pool2dAttr& a, const Geometry& g) {
  auto c = [](const char* name, int64_t v) {
    return std::string("  const int ") + name + " = " + std::to_string(v) + ";\n";
  };
  return c("H", g.h) + c("W", g.w) + c("OH", g.oh) + c("OW", g.ow) + c("KH", a.kernel[0]) +
         c("KW", a.kernel[1]) + c("SH", a.stride[0]) + c("SW", a.stride[1]) +
         c("PH", a.padding[0]) + c("PW", a.padding[1]);
}

// The CPU's max scan over window (oy, ox) of `in`, padding skipped: `best` and, when `index`,
// the first position holding it (a NaN takes over; an all -inf window keeps its first).
std::string max_scan(const std::string& load, const std::string& neg_inf, bool index) {
  std::string s;
  s += "    const int y0 = oy * SH - PH, x0 = ox * SW - PW;\n";
  s += "    const int ys = max(y0, 0), ye = min(y0 + KH, H), xs = max(x0, 0), xe = min(x0 + KW, W);\n";
  s += "    C best = " + neg_inf + ";\n";
  if (index) s += "    int best_i = -1;\n";
  s += "    for (int y = ys; y < ye; ++y)\n      for (int x = xs; x < xe; ++x) {\n";
  s += "        const C v = " + load + ";\n";
  if (index)
    s += "        if (best_i < 0 || v > best || isnan(v)) { best = v; best_i = y * W + x; }\n";
  else
    s += "        if (v > best || isnan(v)) best = v;\n";
  s += "      }\n";
  return s;
}

// The in-bounds window of (oy, ox) and its divisor (the CPU's avg_window).
std::string avg_window(bool count_include_pad) {
  std::string s;
  s += "    int y0 = oy * SH - PH, x0 = ox * SW - PW;\n";
  s += "    int y1 = min(y0 + KH, H + PH), x1 = min(x0 + KW, W + PW);\n";
  s += "    const int padded = (y1 - y0) * (x1 - x0);\n";
  s += "    y0 = max(y0, 0); x0 = max(x0, 0); y1 = min(y1, H); x1 = min(x1, W);\n";
  s += std::string("    const int count = ") +
       (count_include_pad ? "padded" : "(y1 - y0) * (x1 - x0)") + ";\n";
  return s;
}

}  // namespace

InstrCode pool_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  using ir::Op;
  const char* name = ir::op_name(in.op);
  if (in.op != Op::MaxPool2d && in.op != Op::AvgPool2d && in.op != Op::MaxPool2dGrad &&
      in.op != Op::AvgPool2dGrad)
    throw Error(std::string("cuda codegen: pool_code got ") + name);
  if (!is_floating(in.dtype))
    throw Error(std::string(name) + ": expected a floating dtype, got " + dtype_name(in.dtype));
  const bool grad = in.op == Op::MaxPool2dGrad || in.op == Op::AvgPool2dGrad;
  const ir::Pool2dAttr a = in.op == Op::AvgPool2dGrad ? in.attr.get<ir::Pool2dGradAttr>().pool
                                                      : in.attr.get<ir::Pool2dAttr>();
  // The input shape [N,C,H,W] is the result's for a gradient, operand 0's for a forward;
  // the pooled one [N,C,Ho,Wo] the other way round (AvgPool2dGrad: its only operand).
  const Shape& pooled = grad ? p.slot_type(in.args.back()).shape : in.shape;
  const Shape& input = grad ? in.shape : p.slot_type(in.args[0]).shape;
  if (input.size() != 4 || pooled.size() != 4)
    throw Error(std::string(name) + ": expected 4-D [N,C,H,W] tensors, got " + shape_str(input) +
                " and " + shape_str(pooled));
  const Geometry g{input[0] * input[1], input[2], input[3], pooled[2], pooled[3]};
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};

  const char* T = storage_type(in.dtype);
  const char* C = compute_type(in.dtype);
  const bool bf16 = in.dtype == DType::BFloat16;
  auto load = [&](const std::string& e) { return bf16 ? "bf16_to_f(" + e + ")" : e; };
  auto store = [&](const std::string& v) { return bf16 ? "f_to_bf16(" + v + ")" : v; };
  const char* I = text::index_type(std::max(n, shape_numel(input)));
  const std::string entry = prefix + "_" + name;
  std::string src = text::flat_head(entry, in.args.size(), n, I);
  src += std::string("  typedef ") + C + " C;\n" + constants(a, g);
  src += std::string("  ") + T + "* out = (" + T + "*)out_;\n";
  const std::string neg_inf =
      literal(-std::numeric_limits<double>::infinity(), bf16 ? DType::Float32 : in.dtype);

  if (!grad) {
    // One thread per output element (plane, oy, ox).
    src += std::string("  const int ox = (int)(t % OW), oy = (int)(t / OW % OH);\n  const ") + T +
           "* in = (const " + T + "*)a0_ + (t / (OW * OH)) * " + num(g.h * g.w) + ";\n  {\n";
    if (in.op == Op::MaxPool2d) {
      src += max_scan(load("in[y * W + x]"), neg_inf, false);
      src += "    out[t] = " + store("best") + ";\n";
    } else {
      // Summed in double and divided once, as the CPU does.
      src += avg_window(a.count_include_pad);
      src += "    double sum = 0;\n";
      src += "    for (int y = y0; y < y1; ++y)\n      for (int x = x0; x < x1; ++x) sum += " +
             load("in[y * W + x]") + ";\n";
      src += "    out[t] = count > 0 ? " + store("(C)(sum / (double)count)") + " : " +
             store("(C)0") + ";\n";
    }
    src += "  }\n}\n";
    return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
  }

  // One thread per input element (plane, y, x): the windows holding row y are those with
  // oy * SH - PH <= y < oy * SH - PH + KH, i.e. oy in [ceil((y + PH - KH + 1) / SH),
  // (y + PH) / SH], clipped to [0, OH); the same for columns.
  src += "  const int me_x = (int)(t % W), me_y = (int)(t / W % H);\n";
  src += std::string("  const ") + I + " plane = t / (H * W);\n";
  src += "  const int oy0 = max(0, (me_y + PH - KH + SH) / SH), oy1 = min(OH - 1, (me_y + PH) / SH);\n";
  src += "  const int ox0 = max(0, (me_x + PW - KW + SW) / SW), ox1 = min(OW - 1, (me_x + PW) / SW);\n";
  src += std::string("  const ") + T + "* go = (const " + T + "*)a" +
         std::to_string(in.args.size() - 1) + "_ + plane * " + num(g.oh * g.ow) + ";\n";
  if (in.op == Op::MaxPool2dGrad)
    src += std::string("  const ") + T + "* in = (const " + T + "*)a0_ + plane * " +
           num(g.h * g.w) + ";\n";
  src += "  C acc = 0;\n";
  src += "  for (int oy = oy0; oy <= oy1; ++oy)\n    for (int ox = ox0; ox <= ox1; ++ox) {\n";
  if (in.op == Op::MaxPool2dGrad) {
    src += max_scan(load("in[y * W + x]"), neg_inf, true);
    src += "    if (best_i == me_y * W + me_x) acc += " + load("go[oy * OW + ox]") + ";\n";
  } else {
    src += avg_window(a.count_include_pad);
    src += "    if (count > 0) acc += (C)((double)" + load("go[oy * OW + ox]") +
           " / (double)count);\n";
  }
  src += "    }\n  out[t] = " + store("acc") + ";\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

// Im2col: one thread per result element (row (c, i, j), column (n, y, x)), copying the bits
// of the input element that tap (i, j) of output (y, x)'s window reads, or zero in the
// padding, as the CPU's im2col_kernel does.
InstrCode im2col_code(const ir::Program& p, int i, const std::string& prefix) {
  const auto& in = p.instrs[static_cast<std::size_t>(i)];
  if (in.op != ir::Op::Im2col)
    throw Error(std::string("cuda codegen: im2col_code got ") + ir::op_name(in.op));
  const auto& a = in.attr.get<ir::Conv2dGradAttr>();
  const Shape& x = p.slot_type(in.args[0]).shape;
  const int64_t n = shape_numel(in.shape);
  if (n == 0) return {Runs::Kernels, {}, {}};
  const int64_t oh = (x[2] + 2 * a.conv.padding[0] - a.conv.dilation[0] * (a.size[0] - 1) - 1) /
                         a.conv.stride[0] + 1;
  const int64_t ow = (x[3] + 2 * a.conv.padding[1] - a.conv.dilation[1] * (a.size[1] - 1) - 1) /
                         a.conv.stride[1] + 1;
  const char* B = text::bits_type(in.dtype);
  const char* I = text::index_type(std::max(n, shape_numel(x)));
  const std::string entry = prefix + "_im2col";
  auto c = [&](const char* name, int64_t v) {
    return std::string("  const ") + I + " " + name + " = " + num(v) + ";\n";
  };
  std::string src = text::flat_head(entry, 1, n, I);
  src += c("C", x[1]) + c("H", x[2]) + c("W", x[3]) + c("OH", oh) + c("OW", ow) +
         c("KH", a.size[0]) + c("KW", a.size[1]) + c("SH", a.conv.stride[0]) +
         c("SW", a.conv.stride[1]) + c("PH", a.conv.padding[0]) + c("PW", a.conv.padding[1]) +
         c("DH", a.conv.dilation[0]) + c("DW", a.conv.dilation[1]) + c("COLS", in.shape[1]);
  src += std::string("  const ") + I + " r = t / COLS, col = t % COLS;\n";
  src += std::string("  const ") + I + " ch = r / (KH * KW), ki = r / KW % KH, kj = r % KW;\n";
  src += std::string("  const ") + I + " b = col / (OH * OW), oy = col / OW % OH, ox = col % OW;\n";
  src += std::string("  const ") + I + " iy = oy * SH - PH + ki * DH;\n";
  src += std::string("  const ") + I + " ix = ox * SW - PW + kj * DW;\n";
  src += std::string("  ") + B + "* out = (" + B + "*)out_;\n";
  src += std::string("  const ") + B + "* in = (const " + B + "*)a0_;\n";
  src += "  const bool inside = iy >= 0 && iy < H && ix >= 0 && ix < W;\n";
  src += "  out[t] = inside ? in[((b * C + ch) * H + iy) * W + ix] : 0;\n}\n";
  return {Runs::Kernels, std::move(src), {text::flat_launch(entry, n)}};
}

}  // namespace loom::runtime::cuda
