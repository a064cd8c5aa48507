// loom_demo: the accumulation loop of the engine's first acceptance test, run as a program.
// Each iteration traces `z += x + y`; mark_step() compiles the step once and reuses it.
//
//   loom_demo [steps] [size]
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/openmp.h>
#include <loom/tensor.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace {

// A positive integer that is the whole of `text`, or a loom::Error naming `what`.
int64_t positive(const char* text, const char* what) {
  int64_t v = 0;
  const char* end = text + std::strlen(text);
  auto [at, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || at != end || v <= 0)
    throw loom::Error(std::string(what) + ": expected a positive integer, got '" + text + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  loom::openmp_passive_or_reexec(argc, argv);
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::cout << "usage: loom_demo [STEPS] [SIZE]\n"
                 "Runs STEPS (default 100) steps of z += x + y over vectors of SIZE (default 65536) floats,\n"
                 "marking a step after each, and prints the mean of z (about STEPS/2) and loom's metrics:\n"
                 "one compile, then cache hits.\n";
    return 0;
  }
  try {
    if (argc > 3) throw loom::Error(std::string("unexpected argument '") + argv[3] + "' (see --help)");
    int64_t steps = argc > 1 ? positive(argv[1], "STEPS") : 100;
    int64_t size = argc > 2 ? positive(argv[2], "SIZE") : 1 << 16;
    std::cout << "loom_demo: " << steps << " steps of z += x + y over " << size << " floats\n";

    auto z = loom::zeros({size});
    loom::mark_step();  // z on the device, so every step below traces the same graph
    for (int64_t i = 0; i < steps; ++i) {
      auto x = loom::uniform({size}, -1, 1, /*seed=*/2 * i);
      auto y = loom::full({size}, 0.5);
      z += x + y;
      loom::mark_step();
      if ((i + 1) % 25 == 0 || i + 1 == steps)
        loom::add_step_closure([i, steps] { std::cout << "  step " << i + 1 << "/" << steps << '\n'; });
    }
    loom::mark_step();
    loom::wait_device_ops();
    double mean = loom::mean(z).item<double>();
    // E[x] = 0 and y = 0.5, so mean(z) is about steps / 2.
    std::cout << "mean(z) = " << mean << " (expected about " << steps * 0.5 << ")\n\n";
    std::cout << loom::metrics::report();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
    return 1;
  }
}
