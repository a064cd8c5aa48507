// The CUDA backend (backend.h's contract on an NVIDIA GPU). Programs are generated as CUDA C
// (codegen.h), compiled by NVRTC (nvrtc.h) when the engine compiles them, and run on one
// compute stream per device; copies run on a copy stream, so the copy of the next batch
// overlaps the current step. A launch thread queues each program's kernels and returns; a
// completion thread waits for the GPU and signals the program's outputs, in queue order.
#pragma once

#include "runtime/backend.h"

#include <memory>
#include <string>

namespace loom::runtime::cuda {

// How many CUDA devices the process sees; 0 with `why_none` saying why (no driver, no GPU).
int device_count(std::string* why_none);

std::unique_ptr<Backend> make_cuda_backend(int index);

}  // namespace loom::runtime::cuda
