// Random bfloat16 operands for the runtime's bfloat16 kernel tests: n values uniform in
// [-1, 1), rounded to bfloat16, the same for the same seed; and a conv's operands made of them.
#pragma once

#include "runtime/cpu/conv/conv_common.h"

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

// The operands of conv `g`, channels-last: x [N,H,W,C], w [O,C,kh,kw] and grad (of the output)
// [N,Ho,Wo,O] random (seeds 1, 2, 3), and a float32 bias per output channel (-0.75 to 0.75).
struct ConvOperandsBf16 {
  ConvGeometry g;
  std::vector<bfloat16> x, w, grad;
  std::vector<float> bias;
  explicit ConvOperandsBf16(const ConvGeometry& geometry)
      : g(geometry),
        x(random_bf16(g.n * g.h * g.w * g.c, 1)),
        w(random_bf16(g.o * g.c * g.kh * g.kw, 2)),
        grad(random_bf16(g.n * g.oh * g.ow * g.o, 3)) {
    for (int64_t o = 0; o < g.o; ++o) bias.push_back(static_cast<float>(o % 7) * 0.25f - 0.75f);
  }
};

}  // namespace loom::runtime
