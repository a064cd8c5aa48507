// Counter-based random numbers: element i is a pure function of (seed, i), so results do
// not depend on the thread count, on how TBB splits the loop, or on what else the graph holds.
//
//   bits(seed, c) = mix(mix(seed) + (c + 1) * 0x9E3779B97F4A7C15)     (all mod 2^64)
//   mix(z)        = the SplitMix64 finalizer:
//                   z ^= z >> 30; z *= 0xBF58476D1CE4E5B9;
//                   z ^= z >> 27; z *= 0x94D049BB133111EB; z ^= z >> 31
// i.e. bits(seed, c) is output c of a SplitMix64 generator whose state starts at mix(seed)
// (mixing the seed first keeps seeds 0, 1, 2, ... from giving shifted copies of one stream).
//
//   rand  (uniform in [0, 1)):  float64  u = (bits(seed, i) >> 11) * 2^-53
//                               float32  u = (bits(seed, i) >> 40) * 2^-24
//   randn (Box-Muller, in double, then rounded to the dtype):
//     u1 = ((bits(seed, 2i) >> 11) + 1) * 2^-53        in (0, 1], so log(u1) is finite
//     u2 =  (bits(seed, 2i + 1) >> 11) * 2^-53         in [0, 1)
//     z  = sqrt(-2 ln u1) * cos(2 pi u2)
#include "runtime/cpu/kernels_impl.h"

#include <cmath>

namespace loom::runtime {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

uint64_t mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t bits(uint64_t key, uint64_t counter) { return mix(key + (counter + 1) * kGolden); }

constexpr double kTwoPow53 = 1.0 / 9007199254740992.0;  // 2^-53
constexpr float kTwoPow24 = 1.0f / 16777216.0f;         // 2^-24

uint64_t seed_key(const TensorView& seed) {
  return mix(static_cast<uint64_t>(*seed.as<const int64_t>()));
}

}  // namespace

void rand_uniform_kernel(const TensorView& seed, const TensorView& out) {
  const uint64_t key = seed_key(seed);
  visit_float("rand", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.as<T>();
    parallel_range(out.numel(), kGrainTranscendental, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint64_t r = bits(key, static_cast<uint64_t>(i));
        if constexpr (sizeof(T) == 4)
          po[i] = static_cast<float>(r >> 40) * kTwoPow24;
        else
          po[i] = static_cast<double>(r >> 11) * kTwoPow53;
      }
    });
  });
}

void rand_normal_kernel(const TensorView& seed, const TensorView& out) {
  const uint64_t key = seed_key(seed);
  constexpr double kTwoPi = 6.28318530717958647692;
  visit_float("randn", out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* po = out.as<T>();
    parallel_range(out.numel(), kGrainTranscendental, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto c = static_cast<uint64_t>(i);
        const double u1 = static_cast<double>((bits(key, 2 * c) >> 11) + 1) * kTwoPow53;
        const double u2 = static_cast<double>(bits(key, 2 * c + 1) >> 11) * kTwoPow53;
        po[i] = static_cast<T>(std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2));
      }
    });
  });
}

}  // namespace loom::runtime
