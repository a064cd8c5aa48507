// The instructions that run through NVIDIA's libraries: Matmul through cuBLASLt, Conv2d and
// its two gradients through cuDNN. A LibraryOp is made once per instruction when its program
// is first run (descriptors, the chosen algorithm, the workspace it needs) and reused by every
// later run. An epilogue (bias, activation) is not applied here: the instruction's generated
// epilogue kernel runs after it (codegen.h).
#pragma once

#include "ir/program.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>
#include <span>

namespace loom::runtime::cuda {

// What a library call runs with: the device's handles, its compute stream, and a workspace
// the backend grows to what the largest op asks for (workspace_bytes() below).
struct LibraryContext {
  cublasLtHandle_t cublaslt = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

class LibraryOp {
 public:
  virtual ~LibraryOp() = default;
  // The workspace run() needs, in bytes (the backend provides at least this much).
  virtual std::size_t workspace_bytes() const = 0;
  // Queues the op on ctx.stream: `out` from `args` (device addresses in Instr::args order;
  // a fused bias, the last argument, is ignored here).
  virtual void run(const LibraryContext& ctx, std::span<const void* const> args,
                   void* out) const = 0;
};

// The op of instruction `i` of `p` (Matmul, Conv2d, Conv2dGradInput, Conv2dGradWeight),
// choosing its algorithm with ctx's handles. Throws loom::Error naming the op, shapes and
// dtype when the library runs no algorithm for it.
std::unique_ptr<LibraryOp> make_library_op(const ir::Program& p, int i, const LibraryContext& ctx);

}  // namespace loom::runtime::cuda
