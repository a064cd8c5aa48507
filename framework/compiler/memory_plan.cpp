#include "compiler/memory_plan.h"

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

}  // namespace

Program plan_memory(Program p) {
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
  return p;
}

}  // namespace loom::compiler
