// bfloat16 on the host: how loom stores a DType::BFloat16 element and converts it.
//
//   loom::bfloat16 h(3.14159f);     // rounded to nearest even: 3.140625
//   float f = static_cast<float>(h);  // exact: every bfloat16 is a float32
//
// A bfloat16 is the upper 16 bits of a float32. Conversion from float32 rounds to nearest,
// ties to even; NaN stays NaN (quiet, sign kept), infinities stay infinite, and finite values
// beyond the largest bfloat16 (about 3.39e38) become infinite, as in PyTorch.
#pragma once

#include <bit>
#include <cstdint>

namespace loom {

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float f) : bits(round_bits(f)) {}
  // Implicit, as the conversion is exact, so a bfloat16 reads like a float in arithmetic.
  operator float() const { return std::bit_cast<float>(uint32_t{bits} << 16); }

  static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }

  // The bits of f rounded to bfloat16, nearest even.
  static constexpr uint16_t round_bits(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

static_assert(sizeof(bfloat16) == 2, "bfloat16 is two bytes");

// f rounded to the nearest bfloat16, as a float32 (what a bfloat16 store then load gives).
inline float round_to_bfloat16(float f) {
  return std::bit_cast<float>(uint32_t{bfloat16::round_bits(f)} << 16);
}

}  // namespace loom
