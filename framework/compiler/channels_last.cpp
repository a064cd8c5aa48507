#include "compiler/channels_last.h"

#include "ir/setting.h"

#include <loom/error.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <vector>

namespace loom::compiler {
namespace {

using ir::Op;

// out.shape[i] = in.shape[perm[i]]
constexpr std::array<int64_t, 4> kToChannelsLast{0, 2, 3, 1};
constexpr std::array<int64_t, 4> kToChannelsFirst{0, 3, 1, 2};

Shape permuted(const Shape& s, const std::array<int64_t, 4>& perm) {
  return {s[perm[0]], s[perm[1]], s[perm[2]], s[perm[3]]};
}

// Whether permuting `s` by `perm` keeps the order of its dimensions larger than 1: then the
// transpose moves no element and a Reshape does it.
bool permute_is_reshape(const Shape& s, const std::array<int64_t, 4>& perm) {
  int64_t last = -1;
  for (int64_t d : perm) {
    if (s[d] == 1) continue;
    if (d < last) return false;
    last = d;
  }
  return true;
}

bool is_conv(Op op) {
  return op == Op::Conv2d || op == Op::Conv2dGradInput || op == Op::Conv2dGradWeight;
}

// The forward conv's attribute and shapes (input, weight, output) of any of its three passes.
struct ConvShapes {
  ir::Conv2dAttr attr;
  Shape input, weight, output;
};

ConvShapes conv_shapes(const ir::Program& p, const ir::Instr& in) {
  const Shape a = p.slot_type(in.args[0]).shape;
  const Shape b = p.slot_type(in.args[1]).shape;
  if (in.op == Op::Conv2d) return {in.attr.get<ir::Conv2dAttr>(), a, b, in.shape};
  const ir::Conv2dAttr& conv = in.attr.get<ir::Conv2dGradAttr>().conv;
  if (in.op == Op::Conv2dGradInput) return {conv, in.shape, b, a};  // (grad_y, w) -> x
  return {conv, a, in.shape, b};                                    // (x, grad_y) -> w
}

bool converts(const ir::Program& p, const ir::Instr& in, const ir::Target& target) {
  if (!is_conv(in.op) || !((target.channels_last_convs >> static_cast<int>(in.dtype)) & 1) ||
      in.shape.size() != 4)
    return false;
  if (!target.channels_last_conv) return true;
  const ConvShapes s = conv_shapes(p, in);
  return target.channels_last_conv(in.dtype, s.attr, s.input, s.weight, s.output);
}

class Rewriter {
 public:
  Rewriter(const ir::Program& old) : old_(old), values_(old.num_slots()) {
    out_.hash = old.hash;
    out_.inputs = old.inputs;
    out_.graph_nodes = old.graph_nodes;
    for (int s = 0; s < static_cast<int>(old.inputs.size()); ++s) values_[s].first = s;
  }

  ir::Program run(const ir::Target& target) {
    const int num_inputs = static_cast<int>(old_.inputs.size());
    for (int i = 0; i < static_cast<int>(old_.instrs.size()); ++i) {
      const ir::Instr& in = old_.instrs[i];
      Value& v = values_[num_inputs + i];
      if (in.op == Op::Reshape && in.shape.size() == 4 &&
          in.shape == old_.slot_type(in.args[0]).shape && lives_last(in.args[0])) {
        v.last = values_[in.args[0]].last;  // an alias (simplify.h) of a channels-last value
      } else if (converts(old_, in, target)) {
        v = conv(in);
      } else if (in.shape.size() == 4 && ir::is_elementwise(in.op) && any_lives_last(in)) {
        ir::Instr copy = in;
        for (int& a : copy.args) a = channels_last(a);
        copy.shape = permuted(in.shape, kToChannelsLast);
        v.last = emit(std::move(copy));
      } else if (in.shape.size() == 4 && is_reduction(in.op) && lives_last(in.args[0])) {
        ir::Instr copy = in;
        copy.args[0] = channels_last(in.args[0]);
        copy.shape = permuted(in.shape, kToChannelsLast);
        std::vector<int64_t> axes;
        for (int64_t d = 0; d < 4; ++d)
          if (std::ranges::binary_search(in.attr.get<ir::AxesAttr>().axes, kToChannelsLast[d]))
            axes.push_back(d);
        copy.attr = ir::AxesAttr{std::move(axes)};
        v.last = emit(std::move(copy));
      } else if (in.op == Op::Slice && in.shape.size() == 4 && lives_last(in.args[0])) {
        // A window of a channels-last value (some channels or rows of a conv's output): the
        // same window of its channels-last form, not a transpose of the whole value first.
        ir::Instr copy = in;
        copy.args[0] = channels_last(in.args[0]);
        copy.shape = permuted(in.shape, kToChannelsLast);
        const auto& slice = in.attr.get<ir::SliceAttr>();
        copy.attr = ir::SliceAttr{permuted(slice.starts, kToChannelsLast),
                                  permuted(slice.steps, kToChannelsLast),
                                  permuted(slice.sizes, kToChannelsLast)};
        v.last = emit(std::move(copy));
      } else {
        ir::Instr copy = in;
        for (int& a : copy.args) a = channels_first(a);
        v.first = emit(std::move(copy));
      }
    }
    for (int s : old_.outputs) out_.outputs.push_back(channels_first(s));
    return std::move(out_);
  }

 private:
  // A value of the old program in the new one: its slot in the layout it was traced with
  // (first) and channels-last (last), -1 where not made.
  struct Value {
    int first = -1, last = -1;
  };

  static bool is_reduction(Op op) { return op == Op::Sum || op == Op::Mean || op == Op::Max; }

  bool lives_last(int s) const { return values_[s].first < 0; }

  bool any_lives_last(const ir::Instr& in) const {
    bool any = false;
    for (int a : in.args) {
      if (old_.slot_type(a).shape != in.shape) return false;  // not a plain same-shape op
      any = any || lives_last(a);
    }
    return any;
  }

  int emit(ir::Instr in) {
    out_.instrs.push_back(std::move(in));
    return static_cast<int>(out_.inputs.size() + out_.instrs.size()) - 1;
  }

  const ir::Instr* producer(int s) const {
    const int i = s - static_cast<int>(old_.inputs.size());
    return i >= 0 ? &old_.instrs[i] : nullptr;
  }

  // The old slot `s` (rank 4) in the given layout, converted from the other where needed.
  int channels_last(int s) { return convert(s, true); }
  int channels_first(int s) {
    if (old_.slot_type(s).shape.size() != 4) return values_[s].first;
    return convert(s, false);
  }

  // Whether the old slot `s` (rank 4) converts to the wanted layout without a transpose.
  bool cheap(int s, bool to_last) const {
    const Value& v = values_[s];
    if ((to_last ? v.last : v.first) >= 0) return true;
    const Shape& shape = old_.slot_type(s).shape;
    const Shape have_shape = to_last ? shape : permuted(shape, kToChannelsLast);
    const auto& perm = to_last ? kToChannelsLast : kToChannelsFirst;
    if (permute_is_reshape(have_shape, perm)) return true;
    const ir::Instr* in = producer(s);
    if (!in) return false;
    if (in->op == Op::Constant) return true;
    if (in->op == Op::Expand) return old_.slot_type(in->args[0]).shape.size() == 4;
    return rebuildable(*in, to_last);
  }

  bool rebuildable(const ir::Instr& in, bool to_last) const {
    if (!ir::is_elementwise(in.op)) return false;
    for (int a : in.args)
      if (old_.slot_type(a).shape != in.shape || !cheap(a, to_last)) return false;
    return true;
  }

  int convert(int s, bool to_last) {
    Value& v = values_[s];
    int& want = to_last ? v.last : v.first;
    if (want >= 0) return want;
    const int have = to_last ? v.first : v.last;
    const ir::SlotType t = old_.slot_type(s);
    const auto& perm = to_last ? kToChannelsLast : kToChannelsFirst;
    const Shape have_shape = to_last ? t.shape : permuted(t.shape, kToChannelsLast);
    const Shape shape = permuted(have_shape, perm);
    // Equal shapes are not enough ([1,16,16,16] is its own transpose's shape): the transpose
    // must move no element.
    if (shape == have_shape && permute_is_reshape(have_shape, perm)) return want = have;
    const ir::Instr* in = producer(s);
    int made;
    if (in && in->op == Op::Expand && old_.slot_type(in->args[0]).shape.size() == 4) {
      // A broadcast is rebuilt from its source in the wanted layout: no transpose of the
      // broadcast values.
      const int src = convert(in->args[0], to_last);
      made = emit({Op::Expand, t.dtype, shape, ir::ShapeAttr{shape}, {src}});
    } else if (in && in->op == Op::Constant) {
      made = emit({Op::Constant, t.dtype, shape, in->attr, {}});
    } else if (permute_is_reshape(have_shape, perm)) {
      made = emit({Op::Reshape, t.dtype, shape, ir::ShapeAttr{shape}, {have}});
    } else if (in && rebuildable(*in, to_last)) {
      // An elementwise op over broadcasts (a per-channel scale times a scalar): computed
      // again in the wanted layout rather than transposed.
      ir::Instr copy = *in;
      for (int& a : copy.args) a = convert(a, to_last);
      copy.shape = shape;
      made = emit(std::move(copy));
    } else {
      made = emit({Op::Permute, t.dtype, shape,
                   ir::PermuteAttr{std::vector<int64_t>(perm.begin(), perm.end())}, {have}});
    }
    return want = made;
  }

  // A conv on channels-last activations: its first operand always is one, the second too for
  // a weight gradient (a weight otherwise); its result is one except for a weight gradient.
  Value conv(const ir::Instr& in) {
    ir::Instr copy = in;
    const bool grad_weight = in.op == Op::Conv2dGradWeight;
    if (in.op == Op::Conv2d) {
      auto attr = in.attr.get<ir::Conv2dAttr>();
      attr.channels_last = true;
      copy.attr = attr;
    } else {
      auto attr = in.attr.get<ir::Conv2dGradAttr>();
      attr.conv.channels_last = true;
      copy.attr = attr;
    }
    copy.args = {channels_last(in.args[0]),
                 grad_weight ? channels_last(in.args[1]) : channels_first(in.args[1])};
    for (std::size_t i = 2; i < in.args.size(); ++i)  // an epilogue's bias [O], in no layout
      copy.args.push_back(channels_first(in.args[i]));
    Value v;
    if (grad_weight) {
      v.first = emit(std::move(copy));
    } else {
      copy.shape = permuted(in.shape, kToChannelsLast);
      v.last = emit(std::move(copy));
    }
    return v;
  }

  const ir::Program& old_;
  std::vector<Value> values_;
  ir::Program out_;
};

}  // namespace

ir::Program assign_channels_last(ir::Program p, const ir::Target& target) {
  if (!std::ranges::any_of(p.instrs, [&](const ir::Instr& in) { return converts(p, in, target); }))
    return p;
  return Rewriter(p).run(target);
}

const std::string& conv_layout_setting() {
  static const std::string layout =
      ir::env_setting("LOOM_CONV_LAYOUT", "auto", {"auto", "nchw", "channels_last"});
  return layout;
}

}  // namespace loom::compiler
