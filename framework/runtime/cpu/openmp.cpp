// loom::openmp_passive_or_reexec (loom/openmp.h).
#include <loom/openmp.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

namespace loom {

void openmp_passive_or_reexec(int argc, char** argv) {
  // Set: by the user, or by the call below in the image that made this one (so at most one
  // restart).
  if (std::getenv("OMP_WAIT_POLICY")) return;
  if (argc < 1 || !argv || argv[argc] != nullptr) return;  // not main's arguments
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  std::fflush(nullptr);  // nothing buffered may be lost with this image
  execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "loom: warning: could not restart with OMP_WAIT_POLICY=passive (%s); OpenMP "
               "threads will spin between oneDNN calls\n",
               std::strerror(errno));
}

}  // namespace loom
