#include "compiler/fuse_elementwise.h"

#include "ir/setting.h"
#include "ir/unreachable.h"

#include <loom/bfloat16.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <map>
#include <optional>
#include <string>

namespace loom::compiler {
namespace {

using ir::Op;
using ir::OpGroup;

// Members per fusion: enough for the longest chains we trace (BatchNorm, AdamW), small enough
// that a block's registers stay in L1.
constexpr std::size_t kMaxMembers = 48;

// The most steps a value recomputed in each of its readers' fusions may take (its own and
// those of the cheap values it is computed from): recomputing stays a few instructions per
// element.
constexpr int kMaxRecomputeSteps = 8;

// The most distinct steps a value recomputed because its readers already load what it is
// computed from (Fuser::shares_loads) may take, with those of the values it is computed from.
constexpr int kMaxSharedRecomputeSteps = 16;

// What computing one elementwise step costs, in bytes of memory traffic per element: the
// fused code runs a chain of compares and selects at about a step per cycle per vector, so a
// step costs about what moving half a byte per element through memory does.
constexpr double kStepBytes = 0.5;

// The most whole tensors (not broadcasts) a fusion may load once a value shared with its
// readers' loads is computed in it: each is a stream through memory.
constexpr int kMaxSharedStreams = 6;

// A broadcast operand whose source has at most 1/kCachedBroadcast of the result's elements
// stays in cache while a fusion reads it: price_recompute counts it as free.
constexpr int64_t kCachedBroadcast = 64;

bool is_float(DType t) { return t == DType::Float32 || t == DType::Float64; }

// Whether every value of dtype `src` survives conversion to `compute` unchanged, so tests and
// comparisons on the converted value give the same answer.
bool exact_in(DType src, DType compute) {
  return src == compute || src == DType::Bool || (src == DType::BFloat16 && is_float(compute)) ||
         (compute == DType::Float64 && (src == DType::Float32 || src == DType::Int32));
}

// A Cast to bfloat16 of a float value: after widening (widen.h) the only bfloat16 an
// elementwise instruction makes. It joins a float fusion as a rounding step, and heads one
// whose result is stored as bfloat16.
bool rounds_to_bfloat16(const ir::Instr& in, const ir::Program& p) {
  return in.op == Op::Cast && in.dtype == DType::BFloat16 &&
         is_float(p.slot_type(in.args[0]).dtype);
}

// Whether an elementwise op reads its operands in a dtype other than its result's (so the
// fusion must check they convert exactly). Asked of elementwise ops only.
bool tests_operands(Op op) {
  switch (op) {
    case Op::Eq: case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge:
    case Op::LogicalNot: case Op::Cast:
      return true;
    // Arithmetic: operands already have the result's dtype (a Where's condition is bool,
    // which converts exactly to any compute type).
    case Op::Neg: case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Abs:
    case Op::Relu: case Op::Sigmoid: case Op::Tanh: case Op::Silu: case Op::Gelu:
    case Op::GeluTanh: case Op::Erf: case Op::Sin: case Op::Cos:
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Div: case Op::Pow: case Op::Maximum:
    case Op::Minimum: case Op::Where:
      return false;
    case Op::DeviceData: case Op::Constant: case Op::Iota: case Op::RandUniform:
    case Op::RandNormal: case Op::Sum: case Op::Mean: case Op::Max: case Op::ArgMax:
    case Op::Reshape: case Op::Permute: case Op::Slice: case Op::Expand: case Op::Pad:
    case Op::Concat: case Op::Matmul: case Op::Conv2d: case Op::MaxPool2d: case Op::AvgPool2d:
    case Op::Conv2dGradInput: case Op::Conv2dGradWeight: case Op::MaxPool2dGrad:
    case Op::AvgPool2dGrad: case Op::Im2col: case Op::Gather: case Op::IndexSelect:
    case Op::ScatterAdd: case Op::OneHot: case Op::Count_:
      break;
  }
  LOOM_UNREACHABLE("fuse_elementwise: tests_operands asked of a non-elementwise op");
}

// Ops cheap enough to compute again in every fusion that reads their result: a few instructions
// per element, no transcendental function; with `costly` (Target::recompute_costly_steps)
// every elementwise op.
bool cheap_op(Op op, bool costly) {
  switch (op) {
    case Op::Add: case Op::Sub: case Op::Mul: case Op::Maximum: case Op::Minimum: case Op::Eq:
    case Op::Ne: case Op::Lt: case Op::Le: case Op::Gt: case Op::Ge: case Op::Where:
    case Op::Neg: case Op::Abs: case Op::Relu: case Op::LogicalNot: case Op::Cast:
      return true;
    default:
      return costly && ir::is_elementwise(op);
  }
}

// Values a fusion loads from memory: (slot, bytes per element of the fusion's result).
using Loads = std::vector<std::pair<int, double>>;

// How a value is computed inside a fusion (Fuser::make_recipe).
struct Recipe {
  Loads loads;
  std::vector<int> steps;  // the instructions computed, the value's own included
};

class Fuser {
 public:
  Fuser(const ir::Program& p, bool costly)
      : p_(p), n_in_(static_cast<int>(p.inputs.size())), costly_(costly) {
    readers_.resize(p.num_slots());
    is_output_.assign(p.num_slots(), false);
    for (auto o : p.outputs) is_output_[o] = true;
    for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i)
      for (auto a : p.instrs[i].args)
        if (readers_[a].empty() || readers_[a].back() != i) readers_[a].push_back(i);
  }

  ir::Program run() {
    const auto n = static_cast<int>(p_.instrs.size());
    price_recompute();
    groups_of_.assign(n, {});
    plain_.assign(n, false);
    for (int i = n; i-- > 0;) grow(i);
    return emit();
  }

 private:
  const ir::Instr* producer(int slot) const {
    return slot >= n_in_ ? &p_.instrs[slot - n_in_] : nullptr;
  }

  // The compute type of a fusion headed by `in`, if it can head one.
  std::optional<DType> root_compute(const ir::Instr& in) const {
    if (!ir::is_elementwise(in.op)) return std::nullopt;
    if (is_float(in.dtype)) return in.dtype;
    if (rounds_to_bfloat16(in, p_)) return p_.slot_type(in.args[0]).dtype;
    if (in.dtype == DType::Bool && tests_operands(in.op)) {
      auto t = p_.slot_type(in.args[0]).dtype;
      if (is_float(t)) return t;
    }
    return std::nullopt;
  }

  // A constant, possibly reshaped and broadcast: one value everywhere.
  const ir::Instr* constant_of(int slot) const {
    const ir::Instr* src = producer(slot);
    while (src && (src->op == Op::Expand || src->op == Op::Reshape)) src = producer(src->args[0]);
    return src && src->op == Op::Constant ? src : nullptr;
  }

  bool fits(const ir::Instr& in, DType compute) const {
    if (!ir::is_elementwise(in.op)) return false;
    if (rounds_to_bfloat16(in, p_)) return p_.slot_type(in.args[0]).dtype == compute;
    if (in.dtype != compute && in.dtype != DType::Bool) return false;
    bool converts_to_compute = in.op == Op::Cast && in.dtype == compute;
    if (tests_operands(in.op) && !converts_to_compute)
      for (auto a : in.args)
        if (!exact_in(p_.slot_type(a).dtype, compute)) return false;
    return true;
  }

  // Which instructions are cheap to compute again wherever they are read (recompute_): an
  // elementwise op of cheap_op whose result, computed from the values its readers' fusions
  // would load (its operands, or, for cheap operands, what they are computed from), costs no
  // more bytes of memory per element than loading the result would. A widening cast of a
  // bfloat16 value is the plain case: readers load the 2-byte value instead of its 4-byte
  // copy; so is a BatchNorm chain over a conv's bfloat16 output.
  void price_recompute() {
    const auto n = static_cast<int>(p_.instrs.size());
    recompute_.assign(n, false);
    cheaper_.assign(n, false);
    recipe_.assign(n, std::nullopt);
    std::vector<double> bytes(n, 0);  // per element, read from memory to compute it again
    std::vector<int> steps(n, 0);
    for (int i = 0; i < n; ++i) {
      const ir::Instr& in = p_.instrs[i];
      if (!ir::is_elementwise(in.op) || !cheap_op(in.op, costly_)) continue;
      double b = 0;
      int k = 1;
      for (auto a : in.args) {
        if (a >= n_in_ && recompute_[a - n_in_] && p_.slot_type(a).shape == in.shape) {
          b += bytes[a - n_in_];
          k += steps[a - n_in_];
        } else {
          Loads load;
          add_load(a, in.shape, load);
          b += bytes_of(load);
        }
      }
      bytes[i] = b;
      steps[i] = k;
      recompute_[i] = k <= kMaxRecomputeSteps && b <= static_cast<double>(dtype_size(in.dtype));
      cheaper_[i] = recompute_[i] && b < static_cast<double>(dtype_size(in.dtype));
    }
    for (int i = 0; i < n; ++i) recipe_[i] = make_recipe(i);
  }

  // What loading operand `a` of an instruction of `shape` from memory costs: nothing for a
  // constant, the source of a broadcast over its share of the elements, otherwise the
  // operand's bytes per element. Appended to `out` by slot. A small broadcast (a per-channel
  // scale, at most 1/kCachedBroadcast of the result) is read from cache, not memory, and costs
  // nothing: a BatchNorm's scale and shift then recompute in every reader.
  void add_load(int a, const Shape& shape, Loads& out) const {
    if (constant_of(a)) return;
    const ir::Instr* src = producer(a);
    if (src && src->op == Op::Expand) {
      const auto s = p_.slot_type(src->args[0]);
      const auto n_src = shape_numel(s.shape), n_out = std::max<int64_t>(1, shape_numel(shape));
      if (n_src * kCachedBroadcast <= n_out) return;
      add_to(out, src->args[0],
             static_cast<double>(dtype_size(s.dtype)) * static_cast<double>(n_src) /
                 static_cast<double>(n_out));
      return;
    }
    a = viewed_slot(a);  // a slice or permute is read through (view_load)
    add_to(out, a, static_cast<double>(dtype_size(p_.slot_type(a).dtype)));
  }

  static void add_to(Loads& out, int slot, double bytes) {
    for (const auto& l : out)
      if (l.first == slot) return;
    out.emplace_back(slot, bytes);
  }

  static double bytes_of(const Loads& loads) {
    double b = 0;
    for (const auto& l : loads) b += l.second;
    return b;
  }

  // Bytes per element of `loads` not among `have`.
  static double missing(const Loads& loads, const Loads& have) {
    double b = 0;
    for (const auto& l : loads)
      if (std::none_of(have.begin(), have.end(), [&](const auto& h) { return h.first == l.first; }))
        b += l.second;
    return b;
  }

  // How instruction i is computed from memory inside a fusion: the cheap elementwise steps
  // (cheap_op) it takes and the values they load. An operand computed by cheap steps of the
  // same shape is computed along with it where it would be anyway (it has no other reader, or
  // is recomputed in every reader): a ReLU's gradient mask over a BatchNorm's output is then
  // priced as the BatchNorm's input, which the mask's readers load already. An operand read by
  // others counts as loaded, so a residual chain is not priced as recomputed from every block
  // before it. None for other instructions; past kMaxSharedRecomputeSteps, operands are
  // loaded.
  std::optional<Recipe> make_recipe(int i) const {
    const ir::Instr& in = p_.instrs[i];
    if (!ir::is_elementwise(in.op) || !cheap_op(in.op, costly_)) return std::nullopt;
    Recipe r{{}, {i}};
    for (auto a : in.args) {
      const Recipe* sub = a >= n_in_ && recipe_[a - n_in_] ? &*recipe_[a - n_in_] : nullptr;
      if (sub && p_.slot_type(a).shape == in.shape) {
        Recipe with = r;
        for (const auto& l : sub->loads) add_to(with.loads, l.first, l.second);
        for (int s : sub->steps)
          if (std::find(with.steps.begin(), with.steps.end(), s) == with.steps.end())
            with.steps.push_back(s);
        const bool fused_anyway = readers_[a].size() == 1 || recompute_[a - n_in_];
        if (fused_anyway && static_cast<int>(with.steps.size()) <= kMaxSharedRecomputeSteps) {
          r = std::move(with);
          continue;
        }
      }
      add_load(a, in.shape, r.loads);
    }
    return r;
  }

  // What group g loads from memory once its fusion is built: the operands of its members
  // that are not members, with a value recomputed in every reader counted as what it is
  // computed from (it joins g when visited), but for instruction `except` (the value being
  // placed: whether it is recomputed there is the question), counted as loaded.
  Loads group_loads(int g, int except) const {
    Loads out;
    const auto& members = groups_[g].members;
    for (int m : members)
      for (auto a : p_.instrs[m].args) {
        if (a >= n_in_ && std::find(members.begin(), members.end(), a - n_in_) != members.end())
          continue;
        const Recipe* sub = a >= n_in_ && recipe_[a - n_in_] ? &*recipe_[a - n_in_] : nullptr;
        if (sub && recompute_[a - n_in_] && a - n_in_ != except) {
          for (const auto& l : sub->loads) add_to(out, l.first, l.second);
        } else {
          add_load(a, p_.instrs[m].shape, out);
        }
      }
    return out;
  }

  // Whether instruction i, read by the fusions `gs` (and, if `other`, by something that is not
  // a fusion), is better computed in each of them than stored once, counting bytes moved per
  // element and kStepBytes per step computed. Computing it in every reader costs its steps
  // there and the bytes of what it is computed from that the reader does not load already;
  // storing it costs one computation (unless `other` needs it stored anyway), its store and
  // one load per reader. A BatchNorm's float32 input gradient, read by its sum and by the
  // rounding for the conv, is recomputed from the bfloat16 values those already load; the
  // ReLU's bool mask, a byte to load and six steps to compute, is stored.
  bool shares_loads(int i, const std::vector<int>& gs, bool other) const {
    const auto& r = recipe_[i];
    if (!r || gs.size() + (other ? 1 : 0) < 2) return false;
    const double size = static_cast<double>(dtype_size(p_.instrs[i].dtype));
    const double compute = kStepBytes * static_cast<double>(r->steps.size());
    double recompute = 0;
    for (int g : gs) {
      Loads loads = group_loads(g, i);
      recompute += compute + missing(r->loads, loads);
      for (const auto& l : r->loads) add_to(loads, l.first, l.second);
      const auto streams = std::count_if(loads.begin(), loads.end(),
                                         [](const auto& l) { return l.second >= 1; });
      if (streams > kMaxSharedStreams) return false;
    }
    const double stored =
        size * static_cast<double>(gs.size()) + (other ? 0 : size + bytes_of(r->loads) + compute);
    return recompute < stored;
  }

  bool can_join(int i, int g) const {
    const ir::Instr& in = p_.instrs[i];
    return groups_[g].members.size() < kMaxMembers && in.shape == p_.instrs[groups_[g].root].shape &&
           fits(in, groups_[g].compute);
  }

  // Instructions are visited last to first, so all of i's readers are placed already. i joins
  // its readers' fusion when they all belong to one. A cheap value (price_recompute) read by
  // several fusions joins each of them instead, so it is computed where it is read and its
  // result is not stored and loaded back; it still heads a fusion of its own (or stays a plain
  // instruction) when something else reads it: an instruction that is no fusion, or the caller.
  // Otherwise i heads a fusion of its own (if it can).
  void grow(int i) {
    const ir::Instr& in = p_.instrs[i];
    const int slot = n_in_ + i;
    bool other = is_output_[slot];
    std::vector<int> gs;
    for (int r : readers_[slot]) {
      if (groups_of_[r].empty() || plain_[r]) other = true;
      for (int g : groups_of_[r])
        if (std::find(gs.begin(), gs.end(), g) == gs.end()) gs.push_back(g);
    }
    auto fits_all = [&] {
      for (int g : gs)
        if (!can_join(i, g)) return false;
      return true;
    };
    // A cheap value that is stored anyway (`other` reads it) is recomputed in its readers only
    // where that reads fewer bytes than loading it: at a tie (a ReLU over a residual sum, whose
    // ReLU a conv reads) the readers load the stored value, and what it is computed from need
    // not be stored for them.
    const bool recompute = recompute_[i] && (!other || cheaper_[i]);
    const bool join = !gs.empty() && fits_all() &&
                      ((gs.size() == 1 && !other) || recompute || shares_loads(i, gs, other));
    if (join)
      for (int g : gs) {
        groups_of_[i].push_back(g);
        groups_[g].members.push_back(i);
      }
    if (join && !other) return;
    if (auto compute = root_compute(in)) {
      groups_of_[i].push_back(static_cast<int>(groups_.size()));
      groups_.push_back({*compute, i, {i}});
    } else if (join) {
      plain_[i] = true;  // read by its fusions' copies and, as itself, by the others
    }
  }

  // Whether a fused load can read through `in`: a Slice, or a Permute that keeps the
  // innermost dimension innermost, so the load still reads runs of contiguous elements
  // (attention's [B,T,H,D] <-> [B,H,T,D]). A transpose of the innermost dimension (a layout
  // change) keeps its own kernel, which moves tiles where a load would gather element by
  // element.
  static bool read_through(const ir::Instr* in) {
    if (!in) return false;
    if (in->op == Op::Slice) return true;
    if (in->op != Op::Permute) return false;
    const auto& perm = in->attr.get<ir::PermuteAttr>().perm;
    return !perm.empty() && perm.back() == static_cast<int64_t>(perm.size()) - 1;
  }

  // The slot a load of `slot` reads: through every Slice and Permute read_through takes.
  int viewed_slot(int slot) const {
    for (const ir::Instr* src = producer(slot); read_through(src); src = producer(slot))
      slot = src->args[0];
    return slot;
  }

  // A load of the value in `slot` read through its chain of slices and permutes: their source
  // with the strides and offset that pick the value's elements, dimensions merged; none if it
  // needs more than kMaxFusedRank dimensions.
  std::optional<ir::FusedLoad> view_load(int slot) const {
    std::vector<const ir::Instr*> chain;  // outermost (the value's producer) first
    for (const ir::Instr* src = producer(slot); read_through(src); src = producer(src->args[0]))
      chain.push_back(src);
    const auto base = p_.slot_type(chain.back()->args[0]);
    // A source of 2^31 elements or more keeps its slices: the CUDA kernels size their index
    // arithmetic by the result, which a slice's source can outgrow.
    if (shape_numel(base.shape) >= (int64_t{1} << 31)) return std::nullopt;
    std::vector<int64_t> strides(base.shape.size());
    int64_t acc = 1, offset = 0;
    for (std::size_t d = base.shape.size(); d-- > 0;) {
      strides[d] = acc;
      acc *= base.shape[d];
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const ir::Instr& v = **it;
      if (v.op == Op::Permute) {
        const auto& perm = v.attr.get<ir::PermuteAttr>().perm;
        std::vector<int64_t> permuted(perm.size());
        for (std::size_t d = 0; d < perm.size(); ++d)
          permuted[d] = strides[static_cast<std::size_t>(perm[d])];
        strides = std::move(permuted);
      } else {  // Slice: start at `starts`, every `steps`-th element
        const auto& a = v.attr.get<ir::SliceAttr>();
        for (std::size_t d = 0; d < strides.size(); ++d) {
          offset += a.starts[d] * strides[d];
          strides[d] *= a.steps[d];
        }
      }
    }
    return merged_load(p_.slot_type(slot).shape, strides, base.dtype, offset);
  }

  // A load over `shape` placing coordinate d at strides[d] from `offset`, with the dimensions
  // of size 1 dropped and those that are contiguous in the operand merged; none if it needs
  // more than kMaxFusedRank dimensions.
  static std::optional<ir::FusedLoad> merged_load(const Shape& shape,
                                                  const std::vector<int64_t>& strides,
                                                  DType dtype, int64_t offset = 0) {
    std::vector<int64_t> sizes, merged;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      if (!sizes.empty() && merged.back() == strides[d] * shape[d]) {
        sizes.back() *= shape[d];
        merged.back() = strides[d];
      } else {
        sizes.push_back(shape[d]);
        merged.push_back(strides[d]);
      }
    }
    if (sizes.empty()) sizes = {1}, merged = {1};
    if (sizes.size() > ir::kMaxFusedRank) return std::nullopt;
    return ir::FusedLoad{-1, dtype, std::move(sizes), std::move(merged), offset};
  }

  // A broadcast load of an Expand's source over the Expand's shape, dimensions merged; none if
  // it needs more than kMaxFusedRank dimensions.
  std::optional<ir::FusedLoad> broadcast_load(const ir::Instr& expand) const {
    auto src = p_.slot_type(expand.args[0]);
    const Shape& out = expand.shape;
    int64_t acc = 1;
    std::vector<int64_t> src_strides(out.size());
    for (std::size_t d = out.size(); d-- > 0;) {
      src_strides[d] = src.shape[d] == 1 ? 0 : acc;
      acc *= src.shape[d];
    }
    return merged_load(out, src_strides, src.dtype);
  }

  // A constant's value as its own dtype stores it (the kernel then converts to the compute type).
  static double stored_value(double v, DType t) {
    switch (t) {
      case DType::Bool: return v != 0 ? 1 : 0;
      case DType::Int32:
      case DType::Int64: return std::trunc(v);
      case DType::Float32: return static_cast<float>(v);
      case DType::Float64: return v;
      case DType::BFloat16: return round_to_bfloat16(static_cast<float>(v));
    }
    return v;
  }

  struct Group {
    DType compute;
    int root;
    std::vector<int> members;
  };

  // The fused instruction for group g; `slot_map` maps old slots to the new program's.
  ir::Instr build(const Group& g, const std::vector<int>& slot_map) const {
    auto members = g.members;
    std::sort(members.begin(), members.end());
    auto in_group = [&](int slot) {
      return slot >= n_in_ && std::binary_search(members.begin(), members.end(), slot - n_in_);
    };
    auto fusion = std::make_shared<ir::Fusion>();
    fusion->compute = g.compute;
    fusion->shape = p_.instrs[g.root].shape;
    ir::Instr out{p_.instrs[g.root].op, p_.instrs[g.root].dtype, p_.instrs[g.root].shape,
              p_.instrs[g.root].attr, {}, -1, nullptr};
    std::map<int, int> value_of;  // old slot -> value
    std::map<int, int> arg_of;    // new slot -> index into out.args
    auto add_arg = [&](int old_slot) {
      int s = slot_map[old_slot];
      auto [it, fresh] = arg_of.emplace(s, static_cast<int>(out.args.size()));
      if (fresh) out.args.push_back(s);
      return it->second;
    };
    // Loads first: values [0, loads).
    for (int m : members)
      for (auto a : p_.instrs[m].args) {
        if (in_group(a) || constant_of(a) || value_of.count(a)) continue;
        const ir::Instr* src = producer(a);
        std::optional<ir::FusedLoad> load;
        if (src && src->op == Op::Expand) load = broadcast_load(*src);
        if (load) {
          load->arg = add_arg(src->args[0]);
        } else if (read_through(src) && (load = view_load(a))) {
          load->arg = add_arg(viewed_slot(a));
        } else {
          auto t = p_.slot_type(a);
          load = ir::FusedLoad{add_arg(a), t.dtype, {shape_numel(t.shape)}, {1}};
        }
        value_of[a] = static_cast<int>(fusion->loads.size());
        fusion->loads.push_back(std::move(*load));
      }
    auto next_value = [&] { return static_cast<int>(fusion->loads.size() + fusion->steps.size()); };
    for (int m : members) {
      const ir::Instr& in = p_.instrs[m];
      ir::FusedStep step{in.op, -1, -1, -1, 0, in.dtype};
      int* operand[] = {&step.a, &step.b, &step.c};
      for (std::size_t k = 0; k < in.args.size(); ++k) {
        int a = in.args[k];
        if (!value_of.count(a)) {  // a constant not seen yet
          const ir::Instr* c = constant_of(a);
          assert(c && "fusion: operand neither loaded nor computed");
          value_of[a] = next_value();
          fusion->steps.push_back({Op::Constant, -1, -1, -1, stored_value(c->attr.get<ir::ScalarAttr>().value, c->dtype),
                                   c->dtype});
        }
        *operand[k] = value_of[a];
      }
      value_of[n_in_ + m] = next_value();
      fusion->steps.push_back(step);
    }
    allocate_registers(*fusion);
    out.fusion = std::move(fusion);
    return out;
  }

  // Scratch registers by liveness. A step's register is taken before its operands' are
  // released, so a step never writes over what it reads.
  static void allocate_registers(ir::Fusion& f) {
    const auto n_loads = static_cast<int>(f.loads.size());
    const auto n_values = n_loads + static_cast<int>(f.steps.size());
    std::vector<int> last_use(n_values, -1);
    for (int k = 0; k < static_cast<int>(f.steps.size()); ++k)
      for (int v : {f.steps[k].a, f.steps[k].b, f.steps[k].c})
        if (v >= 0) last_use[v] = k;
    f.register_of.assign(n_values, -1);
    std::vector<int> free;
    auto take = [&] {
      if (free.empty()) return f.num_registers++;
      int r = free.back();
      free.pop_back();
      return r;
    };
    for (int v = 0; v < n_loads; ++v) {
      const auto& l = f.loads[v];
      bool direct = l.dtype == f.compute && l.flat();
      if (!direct) f.register_of[v] = take();
    }
    for (int k = 0; k < static_cast<int>(f.steps.size()); ++k) {
      f.register_of[n_loads + k] = take();
      const auto& s = f.steps[k];
      for (int v : {s.a, s.b, s.c}) {
        bool dies_here = v >= 0 && last_use[v] == k && f.register_of[v] >= 0;
        // An operand named twice (x * x) is released once.
        if (dies_here && std::find(free.begin(), free.end(), f.register_of[v]) == free.end())
          free.push_back(f.register_of[v]);
      }
    }
  }

  ir::Program emit() const {
    ir::Program out;
    out.hash = p_.hash;
    out.inputs = p_.inputs;
    out.graph_nodes = p_.graph_nodes;
    std::vector<int> slot_map(p_.num_slots(), -1);
    for (int s = 0; s < n_in_; ++s) slot_map[s] = s;
    for (int i = 0; i < static_cast<int>(p_.instrs.size()); ++i) {
      // The fusion i heads (a root is the last group it joined), if any.
      const int g = groups_of_[i].empty() || groups_[groups_of_[i].back()].root != i
                        ? -1
                        : groups_of_[i].back();
      if (g < 0 && !groups_of_[i].empty() && !plain_[i]) continue;  // computed in its readers
      ir::Instr in;
      if (g >= 0) {
        in = build(groups_[g], slot_map);
      } else {
        in = p_.instrs[i];
        for (auto& a : in.args) a = slot_map[a];
      }
      slot_map[n_in_ + i] = n_in_ + static_cast<int>(out.instrs.size());
      out.instrs.push_back(std::move(in));
    }
    for (auto o : p_.outputs) out.outputs.push_back(slot_map[o]);
    return out;
  }

  const ir::Program& p_;
  const int n_in_;
  const bool costly_;  // Target::recompute_costly_steps: see cheap_op
  std::vector<std::vector<int>> readers_;  // per slot: instructions that read it, ascending
  std::vector<bool> is_output_;  // per slot
  std::vector<std::vector<int>> groups_of_;  // per instruction: the fusions computing it
  std::vector<bool> plain_;      // per instruction: also emitted as itself, unfused
  std::vector<bool> recompute_;  // per instruction: cheap to compute in each reader's fusion
  std::vector<bool> cheaper_;    // ... from fewer bytes than loading it takes
  std::vector<std::optional<Recipe>> recipe_;  // per instruction: see make_recipe
  std::vector<Group> groups_;
};

}  // namespace

ir::Program fuse_elementwise(ir::Program p, const ir::Target& target) {
  // LOOM_RECOMPUTE_COSTLY, read once: "0" or "1" overrides the target's choice.
  static const std::string setting = ir::env_setting("LOOM_RECOMPUTE_COSTLY", "", {"0", "1"});
  const bool costly = setting.empty() ? target.recompute_costly_steps : setting == "1";
  return Fuser(p, costly).run();
}

}  // namespace loom::compiler
