// Helpers shared by the engine tests.
#pragma once

#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "lazy/executor.h"
#include "lazy/tensor_impl.h"
#include "runtime/backend.h"
#include "runtime/registry.h"

#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/tensor.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom::test {

// The Program the CPU backend runs for `g`: compiled for its target.
inline ir::Program compile_for_cpu(const ir::Graph& g) {
  return compiler::compile(g, runtime::backend(Device{}).target());
}

// Runs `g` compiled for `target` (a variant of a device's, to check another device's program
// shape on the CPU) on the CPU backend; each output's bytes, in the graph's output order.
inline std::vector<std::vector<unsigned char>> run_on_cpu(const ir::Graph& g,
                                                          const ir::Target& target) {
  auto& be = runtime::backend(Device{});
  auto exe = be.compile(compiler::compile(g, target));
  runtime::BufferList inputs, outputs;
  for (auto i : g.inputs)
    inputs.push_back(std::static_pointer_cast<runtime::DeviceBuffer>(g.nodes[i]->payload()));
  auto ready = std::make_shared<runtime::Completion>();
  for (auto o : g.outputs) {
    auto buf = std::make_shared<runtime::DeviceBuffer>();
    buf->dtype = g.nodes[o]->dtype();
    buf->shape = g.nodes[o]->shape();
    buf->ready = ready;
    outputs.push_back(buf);
  }
  be.execute(exe, inputs, outputs);
  be.synchronize();
  std::vector<std::vector<unsigned char>> bytes;
  for (const auto& buf : outputs) {
    const auto& storage = buf->wait("run_on_cpu");
    bytes.emplace_back(shape_numel(buf->shape) * dtype_size(buf->dtype));
    be.copy_out(storage, bytes.back().data(), bytes.back().size());
  }
  return bytes;
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
