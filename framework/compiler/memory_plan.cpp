#include "compiler/memory_plan.h"

#include "ir/op.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace loom::compiler {
namespace {

constexpr int64_t kAlignment = 64;  // a cache line: kernels' vector loads never straddle two values

struct Block {
  int first, last;  // instructions, inclusive
  int64_t bytes;
  int64_t offset = -1;
};

// Lowest offset where `b` overlaps no placed block that is alive at the same time.
int64_t first_fit(const Block& b, const std::vector<const Block*>& placed) {
  std::vector<const Block*> busy;
  for (const Block* p : placed)
    if (p->first <= b.last && b.first <= p->last) busy.push_back(p);
  std::sort(busy.begin(), busy.end(), [](auto x, auto y) { return x->offset < y->offset; });
  int64_t at = 0;
  for (const Block* p : busy) {
    if (p->offset >= at + b.bytes) break;
    at = std::max(at, p->offset + p->bytes);
  }
  return at;
}

// How many donors a result lists: the first dead one is usually the input it overwrites.
constexpr std::size_t kMaxDonors = 4;

// Whether instruction `in` (writing its result over the index space of `numel` elements)
// reads `slot` (through `owner`) only element for element: a fused elementwise kernel whose
// every load of it is one contiguous run over the whole result.
bool reads_in_place(const ir::Instr& in, int slot, const std::vector<int>& owner, int64_t numel) {
  if (!in.fusion || ir::op_info(in.op).group == ir::OpGroup::Reduce) return false;
  bool reads = false;
  for (const auto& l : in.fusion->loads) {
    if (owner[in.args[l.arg]] != slot) continue;
    reads = true;
    if (!l.flat() || l.sizes[0] != numel) return false;
  }
  for (std::size_t k = 0; k < in.args.size(); ++k) {
    if (owner[in.args[k]] != slot) continue;
    bool loaded = false;
    for (const auto& l : in.fusion->loads) loaded = loaded || l.arg == static_cast<int>(k);
    if (!loaded) return false;  // an operand the steps do not load: read some other way
  }
  return reads;
}

void plan_donors(ir::Program& p, const std::vector<int>& owner, const std::vector<bool>& escapes,
                 const std::vector<int>& last) {
  const auto n_in = static_cast<int>(p.inputs.size());
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    auto& in = p.instrs[i];
    const int s = n_in + i;
    if (!escapes[s] || owner[s] != s || in.op == ir::Op::Reshape) continue;
    const int64_t numel = shape_numel(in.shape);
    if (numel == 0) continue;
    std::vector<int> in_place, dead;
    for (int d = 0; d < n_in; ++d) {
      const auto& t = p.inputs[d];
      // An input that is itself an output already has a tensor to hold it.
      if (escapes[d] || t.dtype != in.dtype || shape_numel(t.shape) != numel) continue;
      if (last[d] < i) dead.push_back(d);
      else if (last[d] == i && reads_in_place(in, d, owner, numel)) in_place.push_back(d);
    }
    // An input this kernel reads in place is the one it overwrites (p - lr * g): first.
    for (int d : in_place)
      if (in.donors.size() < kMaxDonors) in.donors.push_back(d);
    for (int d : dead)
      if (in.donors.size() < kMaxDonors) in.donors.push_back(d);
  }
}

}  // namespace

ir::Program plan_memory(ir::Program p) {
  const auto n_in = static_cast<int>(p.inputs.size());
  const auto n = static_cast<int>(p.instrs.size());
  // The value each slot's memory belongs to: itself, or what its reshape chain starts from.
  std::vector<int> owner(p.num_slots());
  std::iota(owner.begin(), owner.end(), 0);
  for (int i = 0; i < n; ++i)
    if (p.instrs[i].op == ir::Op::Reshape) owner[n_in + i] = owner[p.instrs[i].args[0]];

  std::vector<bool> escapes(p.num_slots(), false);
  for (auto o : p.outputs) escapes[owner[o]] = true;
  std::vector<int> last(p.num_slots(), -1);
  for (int i = 0; i < n; ++i) {
    last[owner[n_in + i]] = std::max(last[owner[n_in + i]], i);
    for (auto a : p.instrs[i].args) last[owner[a]] = std::max(last[owner[a]], i);
  }

  std::vector<Block> blocks;
  std::vector<int> block_of(p.num_slots(), -1);
  for (int i = 0; i < n; ++i) {
    int s = n_in + i;
    const auto& in = p.instrs[i];
    if (owner[s] != s || escapes[s]) continue;
    auto bytes = static_cast<int64_t>(shape_numel(in.shape) * dtype_size(in.dtype));
    bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    block_of[s] = static_cast<int>(blocks.size());
    blocks.push_back({i, last[s], bytes});
  }
  // Largest first: big blocks packed first leave gaps the small ones fill.
  std::vector<Block*> order;
  for (auto& b : blocks) order.push_back(&b);
  std::stable_sort(order.begin(), order.end(), [](auto x, auto y) { return x->bytes > y->bytes; });
  std::vector<const Block*> placed;
  p.arena_bytes = 0;
  for (Block* b : order) {
    b->offset = first_fit(*b, placed);
    placed.push_back(b);
    p.arena_bytes = std::max(p.arena_bytes, b->offset + b->bytes);
  }
  for (int i = 0; i < n; ++i) {
    int b = block_of[owner[n_in + i]];
    p.instrs[i].arena_offset = b >= 0 ? blocks[b].offset : -1;
  }
  plan_donors(p, owner, escapes, last);
  return p;
}

}  // namespace loom::compiler
