// loom_demo: the accumulation loop of the engine's first acceptance test, run as a program.
// Each iteration traces `z += x + y`; mark_step() compiles the step once and reuses it.
//
//   loom_demo [steps] [size]
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/openmp.h>
#include <loom/tensor.h>

#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  loom::openmp_passive_or_reexec(argc, argv);
  try {
    int64_t steps = argc > 1 ? std::stoll(argv[1]) : 100;
    int64_t size = argc > 2 ? std::stoll(argv[2]) : 1 << 16;
    if (steps <= 0 || size <= 0) throw loom::Error("loom_demo: expected positive steps and size");
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
