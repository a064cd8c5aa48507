// The device that device-neutral tests run on: LOOM_TEST_DEVICE ("cuda", "cuda:1", ...), the
// CPU by default. ctest runs the op harness and the PyTorch training references a second time
// on the CUDA device this way (tests/CMakeLists.txt). When the named device is not there (no
// GPU, no driver), the first call prints one line saying why and ends the test binary with
// exit code 77, which ctest reports as skipped.
#pragma once

#include "runtime/registry.h"

#include <loom/dtype.h>
#include <loom/error.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace loom::test {

inline Device test_device() {
  static const Device device = [] {
    const char* name = std::getenv("LOOM_TEST_DEVICE");
    if (!name || !*name) return Device{};
    try {
      const Device d = parse_device(name);
      runtime::backend(d);  // made now, so a missing device is found before any test runs
      return d;
    } catch (const Error& e) {
      std::printf("LOOM_TEST_DEVICE=%s: skipped: %s\n", name, e.what());
      std::fflush(stdout);
      std::_Exit(77);
    }
  }();
  return device;
}

}  // namespace loom::test
