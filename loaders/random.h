// Counter-based randomness for the loaders: every draw is a hash of its coordinates
// (seed, epoch, index, stream), so no generator state is shared between threads or epochs.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace loom::data::detail {

// SplitMix64's finaliser: a bijective 64-bit mixer with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hashes a sequence of words; the order matters.
inline uint64_t hash_words(std::initializer_list<uint64_t> words) {
  uint64_t h = 0x6a09e667f3bcc908ULL;
  for (uint64_t w : words) h = mix64(h ^ mix64(w));
  return h;
}

// A uniform integer in [0, n) from 64 random bits (Lemire's multiply-shift; the bias is below
// n / 2^64, far under anything a data loader can observe).
__extension__ typedef unsigned __int128 uint128;  // GCC/Clang; __extension__ keeps -Wpedantic quiet
inline uint64_t bounded(uint64_t bits, uint64_t n) {
  return static_cast<uint64_t>((static_cast<uint128>(bits) * n) >> 64);
}

// A sequential generator for shuffles: draw k of stream `key` is mix64(key + k * golden).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t key) : state_(key) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

}  // namespace loom::data::detail
