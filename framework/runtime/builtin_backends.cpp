// The backends built into the library, one registration line each. A new device's backend
// is a folder below runtime/ and a line here (under its build option).
#include "runtime/cpu/cpu_backend.h"
#include "runtime/registry.h"

namespace loom::runtime {

void register_builtin_backends() {
  register_backend("cpu", 1, [](int) { return make_cpu_backend(); });
}

}  // namespace loom::runtime
