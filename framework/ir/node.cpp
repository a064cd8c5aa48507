#include "ir/node.h"

#include "ir/shape_infer.h"

#include <loom/error.h>

#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace loom::ir {

uint64_t hash_combine(uint64_t seed, uint64_t value) {
  // splitmix64-style mixing: cheap and well distributed.
  uint64_t x = seed ^ (value + 0x9E3779B97F4A7C15ULL + (seed << 6) + (seed >> 2));
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

namespace {

uint64_t hash_header(Op op, DType dtype, const Shape& shape, const Attr& attr) {
  uint64_t h = hash_combine(static_cast<uint64_t>(op), static_cast<uint64_t>(dtype));
  h = hash_combine(h, shape.size());
  for (auto d : shape) h = hash_combine(h, static_cast<uint64_t>(d));
  return hash_combine(h, hash_attr(attr));
}

// The intern table is keyed by operand identity (not operand structure), so distinct
// leaves of one shape never crowd one bucket.
struct InternTable {
  std::mutex mutex;
  std::unordered_multimap<uint64_t, std::pair<const Node*, std::weak_ptr<const Node>>> map;
};

InternTable& table() {
  static auto* t = new InternTable;  // leaked: nodes may die during static destruction
  return *t;
}

uint64_t identity_key(uint64_t header, const std::vector<NodePtr>& operands) {
  uint64_t h = header;
  for (auto& o : operands) h = hash_combine(h, reinterpret_cast<uintptr_t>(o.get()));
  return h;
}

uint64_t identity_key_of(const Node& n) {
  return identity_key(hash_header(n.op(), n.dtype(), n.shape(), n.attr()), n.operands());
}

bool same(const Node& n, Op op, DType dtype, const Shape& shape, const Attr& attr,
          const std::vector<NodePtr>& operands) {
  if (n.op() != op || n.dtype() != dtype || n.shape() != shape || !(n.attr() == attr) ||
      n.operands().size() != operands.size())
    return false;
  for (std::size_t i = 0; i < operands.size(); ++i)
    if (n.operands()[i] != operands[i]) return false;
  return true;
}

}  // namespace

Node::~Node() {
  if (interned_) {
    auto& t = table();
    uint64_t key = identity_key_of(*this);
    std::lock_guard lock(t.mutex);
    auto [lo, hi] = t.map.equal_range(key);
    for (auto it = lo; it != hi; ++it) {
      if (it->second.first == this) {
        t.map.erase(it);
        break;
      }
    }
  }
  // Release operands from a loop, not by recursion: a graph built without a barrier can be a
  // chain hundreds of thousands of nodes deep.
  thread_local std::vector<NodePtr> dying;
  thread_local bool draining = false;
  for (auto& o : operands_) dying.push_back(std::move(o));
  if (draining) return;
  draining = true;
  while (!dying.empty()) {
    NodePtr last = std::move(dying.back());
    dying.pop_back();
    last.reset();  // may push its own operands onto `dying`
  }
  draining = false;
}

class NodeFactory {
 public:
  static NodePtr intern(Op op, DType dtype, Shape shape, Attr attr, std::vector<NodePtr> operands);
  static NodePtr device_data(DType dtype, Shape shape, std::shared_ptr<void> payload);
};

NodePtr NodeFactory::intern(Op op, DType dtype, Shape shape, Attr attr, std::vector<NodePtr> operands) {
  uint64_t header = hash_header(op, dtype, shape, attr);
  uint64_t key = identity_key(header, operands);
  auto& t = table();
  std::lock_guard lock(t.mutex);
  auto [lo, hi] = t.map.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    if (auto existing = it->second.second.lock();
        existing && same(*existing, op, dtype, shape, attr, operands))
      return existing;
  }
  uint64_t structural = header;
  for (auto& o : operands) structural = hash_combine(structural, o->hash());

  auto* raw = new Node();
  NodePtr node(raw);
  raw->op_ = op;
  raw->dtype_ = dtype;
  raw->shape_ = std::move(shape);
  raw->attr_ = std::move(attr);
  raw->operands_ = std::move(operands);
  raw->hash_ = structural;
  raw->interned_ = true;
  t.map.emplace(key, std::make_pair(raw, std::weak_ptr<const Node>(node)));
  return node;
}

namespace {

// A node built with another op's attribute kind is a bug in the code that built it.
void check_kind(Op op, const Attr& attr) {
  if (attr.kind() == op_info(op).attr) return;
  std::fprintf(stderr, "loom: internal error: %s takes %s, got %s\n", op_name(op),
               attr_kind_name(op_info(op).attr), attr_kind_name(attr.kind()));
  std::abort();
}

}  // namespace

NodePtr make_node(Op op, std::vector<NodePtr> operands, Attr attr) {
  check_kind(op, attr);
  auto ts = infer(op, operands, attr);
  // loom tensors have no empty dimensions: a zero size is almost always a bug upstream.
  for (auto d : ts.shape)
    if (d <= 0)
      throw Error(std::string(op_name(op)) + ": expected a result with positive sizes, got " +
                  shape_str(ts.shape));
  try {
    (void)shape_numel(ts.shape);  // counts its elements in int64, or throws
  } catch (const Error& e) {
    throw Error(std::string(op_name(op)) + ": " + e.what());
  }
  return NodeFactory::intern(op, ts.dtype, std::move(ts.shape), std::move(attr), std::move(operands));
}

NodePtr make_leaf(Op op, DType dtype, Shape shape, Attr attr) {
  assert((op == Op::Constant || op == Op::Iota) && "make_leaf is for Constant and Iota");
  check_kind(op, attr);
  for (auto d : shape)
    if (d <= 0) throw Error(std::string(op_name(op)) + ": expected positive sizes, got " +
                           shape_str(shape));
  (void)shape_numel(shape);  // counts its elements in int64, or throws
  if (op == Op::Iota && (attr.get<DimAttr>().dim < 0 ||
                         attr.get<DimAttr>().dim >= static_cast<int64_t>(shape.size())))
    throw Error("iota: expected a dimension within the rank of " + shape_str(shape));
  return NodeFactory::intern(op, dtype, std::move(shape), std::move(attr), {});
}

NodePtr make_device_data(DType dtype, Shape shape, std::shared_ptr<void> payload) {
  return NodeFactory::device_data(dtype, std::move(shape), std::move(payload));
}

NodePtr NodeFactory::device_data(DType dtype, Shape shape, std::shared_ptr<void> payload) {
  auto* raw = new Node();
  NodePtr node(raw);
  raw->op_ = Op::DeviceData;
  raw->dtype_ = dtype;
  raw->hash_ = hash_header(Op::DeviceData, dtype, shape, {});
  raw->shape_ = std::move(shape);
  raw->payload_ = std::move(payload);
  return node;
}

std::size_t interned_node_count() {
  auto& t = table();
  std::lock_guard lock(t.mutex);
  return t.map.size();
}

}  // namespace loom::ir
