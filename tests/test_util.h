// Helpers shared by the engine tests.
#pragma once

#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "lazy/executor.h"
#include "lazy/tensor_impl.h"
#include "runtime/registry.h"

#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/tensor.h>

#include <gtest/gtest.h>

#include <string>

namespace loom::test {

// The Program the CPU backend runs for `g`: compiled for its target.
inline ir::Program compile_for_cpu(const ir::Graph& g) {
  return compiler::compile(g, runtime::backend(Device{}).target());
}

// Starts a test from a clean engine: nothing queued, empty compile cache, zero metrics.
inline void fresh_engine() {
  wait_device_ops();
  lazy::clear_compile_cache();
  metrics::reset();
}

// The graph that would compute `t` now (t must be pending).
inline ir::Graph graph_of(const Tensor& t) {
  auto n = t.impl()->pending();
  EXPECT_NE(n, nullptr) << "expected a pending tensor";
  return ir::build_graph({n});
}

inline int count_ops(const ir::Graph& g, ir::Op op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node->op() == op;
  return n;
}

// How many of a compiled program's instructions run `op`.
inline int count_instrs(const ir::Program& p, ir::Op op) {
  int n = 0;
  for (const auto& in : p.instrs) n += in.op == op;
  return n;
}

// Runs `fn` and returns the loom::Error message it throws (fails the test if none).
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error";
  return {};
}

}  // namespace loom::test
