// loom::openmp_passive_or_reexec (loom/openmp.h).
#include <loom/openmp.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace loom {
namespace {

// libgomp's workers spin this many times (about 20 microseconds) after a parallel region
// before they sleep: long enough to catch the next oneDNN call when convs come back to back
// (ResNet-20's short ones), too short to take a core from the TBB kernel between them.
// loom_bench, ResNet-20 captured steps, alternated 4 times with plain passive (0 spins):
// float32 153 against 167 ms, bfloat16 61.9 against 68.2 ms (2026-11-24, 2-core Sapphire
// Rapids); ResNet-18 even. 10,000 spins did no better than 2,000; 50,000 no better than none in
// float32 and worse in bfloat16.
constexpr const char* kSpinCount = "2000";

}  // namespace

void openmp_passive_or_reexec(int argc, char** argv) {
  // Set: by the user, or by the call below in the image that made this one (so at most one
  // restart).
  if (std::getenv("OMP_WAIT_POLICY")) return;
  if (argc < 1 || !argv || argv[argc] != nullptr) return;  // not main's arguments
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  // A short spin first (libgomp: about 100 spins a microsecond), unless the user chose one.
  if (!std::getenv("GOMP_SPINCOUNT")) setenv("GOMP_SPINCOUNT", kSpinCount, 1);
  std::fflush(nullptr);  // nothing buffered may be lost with this image
  execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "loom: warning: could not restart with OMP_WAIT_POLICY=passive (%s); OpenMP "
               "threads will spin between oneDNN calls\n",
               std::strerror(errno));
}

}  // namespace loom
