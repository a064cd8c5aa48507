#include "compiler/conv_im2col.h"

#include "ir/setting.h"

#include <string>
#include <vector>

namespace loom::compiler {
namespace {

using ir::Op;

bool one_group_nchw(const ir::Conv2dAttr& attr, const Shape& input, const Shape& weight,
                    const Shape& output) {
  return attr.groups == 1 && !attr.channels_last && input.size() == 4 && weight.size() == 4 &&
         output.size() == 4;
}

bool rewritable(const ir::Program& p, const ir::Instr& in, const ir::Target& target) {
  if (in.op != Op::Conv2d || in.args.size() != 2 || in.epilogue.active()) return false;
  const auto& a = in.attr.get<ir::Conv2dAttr>();
  const Shape& input = p.slot_type(in.args[0]).shape;
  const Shape& weight = p.slot_type(in.args[1]).shape;
  return one_group_nchw(a, input, weight, in.shape) && target.runs(Op::Im2col, in.dtype) &&
         target.runs(Op::Matmul, in.dtype) &&
         target.conv_as_matmul(in.dtype, a, input, weight, in.shape);
}

}  // namespace

ir::Program convs_as_matmuls(ir::Program p, const ir::Target& target) {
  if (!target.conv_as_matmul) return p;
  const int n_in = static_cast<int>(p.inputs.size());
  std::vector<ir::Instr> old = std::move(p.instrs);
  p.instrs.clear();
  p.instrs.reserve(old.size());
  std::vector<int> slot_map(static_cast<std::size_t>(n_in) + old.size());
  for (int s = 0; s < n_in; ++s) slot_map[s] = s;
  auto emit = [&](ir::Instr in) {
    p.instrs.push_back(std::move(in));
    return n_in + static_cast<int>(p.instrs.size()) - 1;
  };
  for (std::size_t i = 0; i < old.size(); ++i) {
    ir::Instr in = std::move(old[i]);
    for (auto& a : in.args) a = slot_map[a];
    const int slot = n_in + static_cast<int>(i);
    if (!rewritable(p, in, target)) {
      slot_map[slot] = emit(std::move(in));
      continue;
    }
    const auto& a = in.attr.get<ir::Conv2dAttr>();
    const Shape weight = p.slot_type(in.args[1]).shape;  // [O, C, kh, kw]
    const int64_t n = in.shape[0], o = in.shape[1], plane = in.shape[2] * in.shape[3];
    const int64_t taps = weight[1] * weight[2] * weight[3];
    const Shape cols_shape{taps, n * plane};
    const int cols = emit({Op::Im2col, in.dtype, cols_shape,
                           ir::Conv2dGradAttr{a, {weight[2], weight[3]}}, {in.args[0]}});
    const Shape w2{o, taps};
    const int w = emit({Op::Reshape, in.dtype, w2, ir::ShapeAttr{w2}, {in.args[1]}});
    const Shape y_shape{o, n * plane};
    int y = emit({Op::Matmul, in.dtype, y_shape, ir::MatmulAttr{}, {w, cols}});
    if (n > 1) {  // [O, N, Ho*Wo] -> [N, O, Ho*Wo]
      const Shape by_image{o, n, plane}, images_first{n, o, plane};
      y = emit({Op::Reshape, in.dtype, by_image, ir::ShapeAttr{by_image}, {y}});
      y = emit({Op::Permute, in.dtype, images_first, ir::PermuteAttr{{1, 0, 2}}, {y}});
    }
    slot_map[slot] = emit({Op::Reshape, in.dtype, in.shape, ir::ShapeAttr{in.shape}, {y}});
  }
  for (auto& out : p.outputs) out = slot_map[out];
  return p;
}

bool tiny_plane_conv(DType, const ir::Conv2dAttr& attr, const Shape& input, const Shape& weight,
                     const Shape& output) {
  return one_group_nchw(attr, input, weight, output) &&
         output[0] * output[2] * output[3] < output[1];
}

bool small_output_conv(DType, const ir::Conv2dAttr& attr, const Shape& input,
                       const Shape& weight, const Shape& output) {
  return one_group_nchw(attr, input, weight, output) && shape_numel(output) <= kSmallConvOutput;
}

ConvRule conv_im2col_rule(ConvRule device_default) {
  static const std::string setting = ir::env_setting(
      "LOOM_CONV_IM2COL", "auto", {"auto", "off", "tiny_plane", "small_output"});
  if (setting == "off") return nullptr;
  if (setting == "tiny_plane") return tiny_plane_conv;
  if (setting == "small_output") return small_output_conv;
  return device_default;
}

}  // namespace loom::compiler
