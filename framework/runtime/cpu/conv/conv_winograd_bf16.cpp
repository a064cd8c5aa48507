// Winograd F(2x2, 3x3) on bfloat16 channels-last activations (conv_winograd_bf16.h), with the
// transforms of conv_winograd.cpp (Lavin & Gray 2016):
//   Y = A^T [ (G g G^T) . (B^T d B) ] A,   summed over input channels: 16 GEMMs per tile
//   M_xi [tiles, O] = V_xi [tiles, C] * U_xi [C, O],   V = B^T d B,  U = G g G^T
// Channels-last, a tile's 16 transformed values are vectors of channels, so every transform is
// a vector loop over 16 channels at a time and the GEMMs need no transposes:
//   U [16][C/2][O][2]: the kernel transformed once per call, in float32, and rounded; the two
//     input channels of a pair side by side, as vdpbf16ps multiplies them.
//   V [16][tiles][C]: a block of tiles' transformed input, rounded, in a per-thread buffer;
//     a 32-bit broadcast of V is one pair of input channels of one tile.
//   M [16][tiles][64]: the block's GEMM results for 64 output channels at a time, float32,
//     transformed back (+ bias, relu), rounded and stored before the next 64.
// A register tile is R tiles x Q vectors of 16 output channels (R*Q <= 24 sums), R
// broadcasts and Q loads per R*Q dot products, over all C/2 input pairs.
#include "runtime/cpu/conv/conv_winograd_bf16.h"

#include "runtime/cpu/conv/conv_winograd_tiles.h"
#include "runtime/cpu/kernels_impl.h"

#include <immintrin.h>

#include <loom/error.h>

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

namespace loom::runtime {

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
namespace {

using winograd::Conv;
using winograd::kXi;
using winograd::TileAt;
using winograd::tile_at;

constexpr int64_t kLanes = 16;  // float32 lanes: channels per vector
constexpr int64_t kChunk = 64;  // output channels per GEMM pass over a block: up to 4 vectors
// Tiles per task: its V and M together about this many bytes, so that they stay in L2 (1 MiB
// per core on the development machine) while the GEMMs go over them.
constexpr int64_t kBlockBytes = 512 * 1024;
constexpr int64_t kMinBlock = 32, kMaxBlock = 256;

struct Avx512 {  // the transforms' arithmetic (conv_winograd_tiles.h)
  static __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static __m512 sub(__m512 a, __m512 b) { return _mm512_sub_ps(a, b); }
  static __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512 set1(float x) { return _mm512_set1_ps(x); }
};

Conv make_conv(const ConvGeometry& g, ConvPass pass) {
  Conv v = winograd::conv_of(g, pass);
  const int64_t bytes_per_tile = kXi * (v.ci * 2 + std::min(v.co, kChunk) * 4);
  v.block = std::clamp(kBlockBytes / bytes_per_tile, kMinBlock, kMaxBlock);
  return v;
}

// Lane k of the low 16 and lane k of the high 16 of 32 bfloat16 values as a pair: what
// _mm512_permutexvar_epi16 takes to interleave two vectors rounded by _mm512_cvtne2ps_pbh.
alignas(64) constexpr uint16_t kPairs[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                             21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                             11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

const uint16_t* bits(const bfloat16* p) { return reinterpret_cast<const uint16_t*>(p); }

__m512 widen(const uint16_t* p) {  // 16 bfloat16 values as float32
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void store_rounded(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      std::bit_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// ---- The kernel: U = G g G^T, rounded, [16][C/2][O][2] ----

// The 9 taps of output channels k0 .. k0+15 (lanes) and input channel c, as float32.
void load_taps(const Conv& v, const uint16_t* w, int64_t k0, int64_t c, __m512 g[9]) {
  const __m512i lane = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(static_cast<int>(v.k_step * 2)));
  const char* row = reinterpret_cast<const char*>(w + k0 * v.k_step + c * v.c_step);
  for (int t = 0; t < 9; ++t) {
    const int tap = v.flip ? 8 - t : t;
    // 32-bit gathers that stay inside each lane's 9 taps: tap 0 as the low half of taps 0-1,
    // tap s > 0 as the high half of taps s-1 and s.
    if (tap == 0) {
      const __m512i x = _mm512_i32gather_epi32(lane, row, 1);
      g[t] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    } else {
      const __m512i x = _mm512_i32gather_epi32(lane, row + 2 * tap - 2, 1);
      g[t] = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(-65536)));
    }
  }
}

void transform_kernels(const Conv& v, const uint16_t* w, uint32_t* u) {
  const int64_t pairs = v.ci / 2, kblocks = v.co / kLanes;
  parallel_range(pairs * kblocks, 8, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t cp = unit / kblocks, k0 = unit % kblocks * kLanes;
      __m512 g[9], even[kXi], odd[kXi];
      load_taps(v, w, k0, 2 * cp, g);
      winograd::transform_kernel<Avx512>(g, even);
      load_taps(v, w, k0, 2 * cp + 1, g);
      winograd::transform_kernel<Avx512>(g, odd);
      for (int64_t xi = 0; xi < kXi; ++xi) {
        const __m512i both = std::bit_cast<__m512i>(_mm512_cvtne2ps_pbh(odd[xi], even[xi]));
        _mm512_storeu_si512(u + (xi * pairs + cp) * v.co + k0,
                            _mm512_permutexvar_epi16(_mm512_load_si512(kPairs), both));
      }
    }
  });
}

// ---- The input: V = B^T d B, rounded, [16][block][C] ----

// The block's tiles [t0, t0 + nt) transformed into vs. Channels go 32 at a time where C
// allows: one 64-byte load per position, its even and odd channels widened as two vectors
// (a shift and a mask), transformed apart and put back in order when rounded.
void transform_input(const Conv& v, const uint16_t* in, int64_t t0, int64_t nt, uint16_t* vs) {
  const __m512i order = _mm512_load_si512(kPairs), high = _mm512_set1_epi32(-65536);
  const int64_t xi_step = v.block * v.ci, wide = v.ci / 32 * 32;
  for (int64_t tl = 0; tl < nt; ++tl) {
    const TileAt at = tile_at(v, t0 + tl);
    const int64_t y0 = at.y - v.ph, x0 = at.x - v.pw;
    const uint16_t* src[kXi];  // each position's channels, null outside the plane
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        const int64_t y = y0 + i, x = x0 + j;
        src[4 * i + j] =
            y >= 0 && y < v.h && x >= 0 && x < v.w ? in + ((at.n * v.h + y) * v.w + x) * v.ci
                                                   : nullptr;
      }
    uint16_t* dst = vs + tl * v.ci;
    for (int64_t c = 0; c < wide; c += 32) {
      __m512 even[kXi], odd[kXi];
      for (int k = 0; k < kXi; ++k) {
        const __m512i x = src[k] ? _mm512_loadu_si512(src[k] + c) : _mm512_setzero_si512();
        even[k] = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        odd[k] = _mm512_castsi512_ps(_mm512_and_si512(x, high));
      }
      winograd::input_transform<Avx512>(even);
      winograd::input_transform<Avx512>(odd);
      for (int k = 0; k < kXi; ++k) {
        const __m512i both = std::bit_cast<__m512i>(_mm512_cvtne2ps_pbh(odd[k], even[k]));
        _mm512_storeu_si512(dst + k * xi_step + c, _mm512_permutexvar_epi16(order, both));
      }
    }
    for (int64_t c = wide; c < v.ci; c += kLanes) {
      __m512 d[kXi];
      for (int k = 0; k < kXi; ++k) d[k] = src[k] ? widen(src[k] + c) : _mm512_setzero_ps();
      winograd::input_transform<Avx512>(d);
      for (int k = 0; k < kXi; ++k) store_rounded(dst + k * xi_step + c, d[k]);
    }
  }
}

// ---- The GEMMs: M_xi [rows][16 Q] = V_xi [rows][C] * U_xi [C][16 Q] ----

// a: R rows of `pairs` input-channel pairs, lda apart; b: U_xi at the chunk's first output
// channel, ldb apart per pair; m: R rows of Q vectors, kChunk floats apart.
template <int R, int Q>
void gemm_tile(const uint32_t* a, int64_t lda, const uint32_t* b, int64_t ldb, int64_t pairs,
               float* m) {
  __m512 acc[R][Q];
  for (auto& row : acc)
    for (auto& s : row) s = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p, ++a, b += ldb) {
    __m512bh u[Q];
    for (int q = 0; q < Q; ++q)
      u[q] = std::bit_cast<__m512bh>(_mm512_loadu_si512(b + q * kLanes));
    for (int r = 0; r < R; ++r) {
      const auto x = std::bit_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[r * lda])));
      for (int q = 0; q < Q; ++q) acc[r][q] = _mm512_dpbf16_ps(acc[r][q], x, u[q]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < Q; ++q) _mm512_storeu_ps(m + r * kChunk + q * kLanes, acc[r][q]);
}

using GemmTile = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, int64_t, float*);

template <int Q>
constexpr int kRows = Q >= 4 ? 6 : Q == 3 ? 8 : 12;  // R*Q sums, at most 24

template <int Q, int... R>
constexpr std::array<GemmTile, sizeof...(R)> tiles_of(std::integer_sequence<int, R...>) {
  return {&gemm_tile<R + 1, Q>...};
}

// The block's nt rows of V_xi times the chunk's Q vectors of U_xi, kRows<Q> rows at a time.
template <int Q>
void gemm_rows(const Conv& v, const uint32_t* a, const uint32_t* b, int64_t nt, float* m) {
  static constexpr auto kTiles = tiles_of<Q>(std::make_integer_sequence<int, kRows<Q>>{});
  const int64_t pairs = v.ci / 2;
  for (int64_t r = 0; r < nt; r += kRows<Q>) {
    const int64_t rows = std::min<int64_t>(kRows<Q>, nt - r);
    kTiles[static_cast<std::size_t>(rows - 1)](a + r * pairs, pairs, b, v.co, pairs,
                                               m + r * kChunk);
  }
}

// ---- The output: Y = A^T M A (+ bias, relu), rounded ----

void transform_output(const Conv& v, const float* ms, int64_t t0, int64_t nt, int64_t k0,
                      int64_t width, const float* bias, bool relu, uint16_t* out) {
  const int64_t xi_step = v.block * kChunk;
  const auto finish = [&](__m512 r, int64_t q) {
    if (bias) r = _mm512_add_ps(r, _mm512_loadu_ps(bias + k0 + q));
    return relu ? _mm512_max_ps(r, _mm512_setzero_ps()) : r;
  };
  winograd::output_tiles<Avx512, __m512>(
      v, t0, nt, k0, width, kLanes,
      [&](int64_t tl, int64_t q, int64_t xi) {
        return _mm512_loadu_ps(ms + tl * kChunk + q + xi * xi_step);
      },
      [&](int64_t at, int64_t q, __m512 y) { store_rounded(out + at, finish(y, q)); });
}

struct KernelTag;  // thread_scratch tags
struct InputTag;
struct ProductTag;

// Tiles [t0, t0 + nt): transformed, multiplied and transformed back, 64 output channels at a
// time.
void run_block(const Conv& v, const uint16_t* in, const uint32_t* u, int64_t t0, int64_t nt,
               const float* bias, bool relu, uint16_t* out) {
  const auto size = [](int64_t n) { return static_cast<std::size_t>(n); };
  uint16_t* vs = thread_scratch<uint16_t, InputTag>(size(kXi * v.block * v.ci));
  float* ms = thread_scratch<float, ProductTag>(size(kXi * v.block * kChunk));
  transform_input(v, in, t0, nt, vs);
  const auto* a = reinterpret_cast<const uint32_t*>(vs);
  const int64_t pairs = v.ci / 2;
  for (int64_t k0 = 0; k0 < v.co; k0 += kChunk) {
    const int64_t width = std::min(kChunk, v.co - k0);
    for (int64_t xi = 0; xi < kXi; ++xi) {
      const uint32_t* axi = a + xi * v.block * pairs;
      const uint32_t* bxi = u + xi * pairs * v.co + k0;
      float* mxi = ms + xi * v.block * kChunk;
      switch (width / kLanes) {
        case 1: gemm_rows<1>(v, axi, bxi, nt, mxi); break;
        case 2: gemm_rows<2>(v, axi, bxi, nt, mxi); break;
        case 3: gemm_rows<3>(v, axi, bxi, nt, mxi); break;
        default: gemm_rows<4>(v, axi, bxi, nt, mxi); break;
      }
    }
    transform_output(v, ms, t0, nt, k0, width, bias, relu, out);
  }
}

}  // namespace

bool bf16_winograd_applies(const ConvGeometry& g) {
  return g.groups == 1 && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 &&
         g.dw == 1 && g.ph >= 0 && g.ph <= 2 && g.pw >= 0 && g.pw <= 2 && g.c % kLanes == 0 &&
         g.o % kLanes == 0 && g.n > 0 && g.oh > 0 && g.ow > 0 && g.h > 0 && g.w > 0;
}

void conv2d_winograd_bf16(const ConvGeometry& g, ConvPass pass, const bfloat16* in,
                          const bfloat16* w, bfloat16* out, const float* bias, bool relu) {
  if (pass == ConvPass::kGradWeight)
    throw Error("conv2d_winograd_bf16: runs the forward and the input gradient only");
  const Conv v = make_conv(g, pass);
  auto* u = thread_scratch<uint32_t, KernelTag>(static_cast<std::size_t>(kXi * v.ci / 2 * v.co));
  transform_kernels(v, bits(w), u);
  auto* dst = reinterpret_cast<uint16_t*>(out);
  const int64_t blocks = ceil_div(v.tiles, v.block);
  parallel_range(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * v.block;
      run_block(v, bits(in), u, t0, std::min(v.block, v.tiles - t0), bias, relu, dst);
    }
  });
}

#else  // no AVX512_BF16 in this build: oneDNN runs every bfloat16 conv

bool bf16_winograd_applies(const ConvGeometry&) { return false; }

void conv2d_winograd_bf16(const ConvGeometry&, ConvPass, const bfloat16*, const bfloat16*,
                          bfloat16*, const float*, bool) {
  throw Error("conv2d_winograd_bf16: this build has no AVX512_BF16 kernel (check "
              "bf16_winograd_applies first)");
}

#endif

}  // namespace loom::runtime
