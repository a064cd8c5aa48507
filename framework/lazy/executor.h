// The graph executor: turns pending tensors into one queued program (compile cache,
// buffers handed out at once), and runs step closures. See DESIGN.md, "The step barrier".
#pragma once

#include "lazy/tensor_impl.h"

#include <memory>
#include <vector>

namespace loom::lazy {

enum class RunKind { Step, Read, Eager };

// Compiles (or finds) the graph of the tensors' pending values, gives each tensor its device
// buffer and queues the program; returns without waiting. Tensors no longer pending are
// skipped.
void run_graph(const std::vector<std::shared_ptr<TensorImpl>>& tensors, RunKind kind);

// Removes every cached program (for tests of compile counts).
void clear_compile_cache();
std::size_t compile_cache_size();

}  // namespace loom::lazy
