// loom::use_deterministic_algorithms (loom/lazy.h): one flag that the kernels read as they run.
#include <loom/lazy.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace loom {
namespace {

std::atomic<bool>& deterministic() {
  static std::atomic<bool> on = [] {
    const char* v = std::getenv("LOOM_DETERMINISTIC");
    return v && std::strcmp(v, "0") != 0 && *v != '\0';
  }();
  return on;
}

}  // namespace

void use_deterministic_algorithms(bool on) { deterministic().store(on, std::memory_order_relaxed); }

bool are_deterministic_algorithms_enabled() {
  return deterministic().load(std::memory_order_relaxed);
}

}  // namespace loom
