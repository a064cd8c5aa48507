// The CPU backend: programs interpreted instruction by instruction on one device thread, with
// the kernels of this folder; memory from the caching allocator (allocator.h).
#pragma once

#include "runtime/backend.h"

#include <memory>

namespace loom::runtime {

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace loom::runtime
