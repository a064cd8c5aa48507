// IR nodes: immutable and hash-consed. make_node returns the existing node when one with
// the same (op, dtype, shape, attr, operands) is alive, so equal subexpressions are one node.
// DeviceData leaves are never shared: each is bound to its own buffer (an opaque payload
// that the IR does not look at) and hashes by dtype and shape only, so the next step's
// graph, with new buffers of the same shapes, hashes the same.
#pragma once

#include "ir/attr.h"
#include "ir/op.h"

#include <loom/dtype.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace loom::ir {

class Node;
using NodePtr = std::shared_ptr<const Node>;

class Node {
 public:
  Op op() const { return op_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<NodePtr>& operands() const { return operands_; }
  const NodePtr& operand(std::size_t i) const { return operands_[i]; }
  const Attr& attr() const { return attr_; }
  // Structural hash: op, dtype, shape, attr and operand hashes (leaves: dtype and shape).
  uint64_t hash() const { return hash_; }
  // DeviceData only: the buffer this leaf stands for (owned by the lazy layer).
  const std::shared_ptr<void>& payload() const { return payload_; }

  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

 private:
  friend class NodeFactory;  // node.cpp: the only code that builds nodes
  Node() = default;

  Op op_ = Op::Constant;
  DType dtype_ = DType::Float32;
  Shape shape_;
  std::vector<NodePtr> operands_;
  Attr attr_;
  uint64_t hash_ = 0;
  std::shared_ptr<void> payload_;
  bool interned_ = false;
};

// Infers dtype and shape (throws loom::Error on bad input) and hash-conses.
NodePtr make_node(Op op, std::vector<NodePtr> operands, Attr attr = {});
// Constant and Iota leaves (hash-consed; their dtype and shape are given).
NodePtr make_leaf(Op op, DType dtype, Shape shape, Attr attr = {});
// A fresh DeviceData leaf, never shared.
NodePtr make_device_data(DType dtype, Shape shape, std::shared_ptr<void> payload);

// Number of interned nodes alive (for tests).
std::size_t interned_node_count();

uint64_t hash_combine(uint64_t seed, uint64_t value);

}  // namespace loom::ir
