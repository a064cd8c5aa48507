// The backends built into the library, one registration line each. A new device's backend
// is a folder below runtime/ and a line here (under its build option).
#include "runtime/cpu/cpu_backend.h"
#include "runtime/registry.h"

#ifdef LOOM_WITH_CUDA
#include "runtime/cuda/cuda_backend.h"
#endif

namespace loom::runtime {

void register_builtin_backends() {
  register_backend("cpu", 1, [](int) { return make_cpu_backend(); });
#ifdef LOOM_WITH_CUDA
  // Built with the CUDA backend: one device per GPU the driver shows; none (saying why) on a
  // machine without a GPU or a driver.
  std::string why_none;
  const int gpus = cuda::device_count(&why_none);
  register_backend("cuda", gpus, [](int index) { return cuda::make_cuda_backend(index); },
                   why_none);
#endif
}

}  // namespace loom::runtime
