// Random bfloat16 operands for the runtime's bfloat16 kernel tests: n values uniform in
// [-1, 1), rounded to bfloat16, the same for the same seed.
#pragma once

#include <loom/bfloat16.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace loom::runtime {

inline std::vector<bfloat16> random_bf16(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<bfloat16> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = bfloat16(dist(gen));
  return v;
}

}  // namespace loom::runtime
