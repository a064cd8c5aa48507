// The bfloat16 weight gradient on vdpbf16ps (conv_weight_bf16.h):
//   grad_w[o][c][i][j] = sum over images n and output positions (y, x) of
//                        grad_out[n][y][x][o] * x[n][y*sh + i - ph][x*sw + j - pw][c]
// vdpbf16ps multiplies pairs: lane c of a vector holds x of images 2m and 2m+1 at channel c,
// and the broadcast holds grad_out of the same two images at channel o, so one instruction adds
// both images' products into 16 channels' float32 sums. Staging makes those pairs: a piece of
// image pairs is interleaved into per-thread buffers (x padded with zeros, so no tap checks
// bounds), then every register tile runs over the whole piece: 8 output channels x the 3
// kernel columns of one kernel row x 16 input channels, 24 sums, 3 loads and 8 broadcasts per
// 24 dot products. Each tile's sums are kept together (tile_offset), and transposed to
// [O,C,kh,kw] when rounded.
#include "runtime/cpu/conv/conv_weight_bf16.h"

#include "runtime/cpu/kernels_impl.h"

#include <immintrin.h>

#include <loom/error.h>

#include <algorithm>
#include <bit>
#include <cstring>

namespace loom::runtime {

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
namespace {

constexpr int64_t kLanes = 16;   // float32 sums per vector: input channels
constexpr int64_t kTileO = 8;    // output channels per register tile
constexpr int64_t kTaps = 3;     // kernel columns per register tile: the kernel's width
constexpr int64_t kMaxRows = 7;  // kernel rows
// Bytes one tile streams through per piece of image pairs: its block of 16 input channels and
// of 8 output channels, kept in L2 (1 MiB per core on the development machine) while the
// other tiles of the block reuse it. The whole piece may be larger.
constexpr int64_t kTileBytes = 512 * 1024;
// Weights of up to this many elements split the images into kImageChunks partial sums, added
// in order at the end; wider ones split the output channels into at most kMaxGroups groups
// instead (each task then stages every image, which is cheap next to its sums there).
constexpr int64_t kMaxChunkedWeights = 64 * 64 * 9;
constexpr int64_t kImageChunks = 8;
constexpr int64_t kMaxGroups = 4;

struct Plan {
  int64_t pairs;            // image pairs, the last one half when the batch is odd
  int64_t chunks;           // image-pair ranges, each its own partial sum
  int64_t groups, group_o;  // output-channel groups, channels per group (a multiple of 16)
  int64_t hp, wp;           // the padded input plane
  int64_t weights;          // floats of one partial sum (tile_offset's layout)
};

Plan make_plan(const ConvGeometry& g) {
  Plan p;
  p.pairs = (g.n + 1) / 2;
  p.hp = g.h + 2 * g.ph;
  p.wp = g.w + 2 * g.pw;
  p.weights = g.o * g.kh * g.kw * g.c;
  if (p.weights <= kMaxChunkedWeights) {
    p.chunks = std::min(kImageChunks, p.pairs);
    p.groups = 1;
    p.group_o = g.o;
  } else {
    const int64_t blocks = g.o / kLanes;
    p.chunks = 1;
    p.group_o = kLanes * ceil_div(blocks, std::min(kMaxGroups, blocks));
    p.groups = ceil_div(g.o, p.group_o);
  }
  return p;
}

const uint16_t* bits(const bfloat16* p) { return reinterpret_cast<const uint16_t*>(p); }

// The 16 values at a and the 16 at b (b null: zeros, a missing image) as 16 pairs, a's low.
__m512i interleave(const uint16_t* a, const uint16_t* b) {
  alignas(64) static constexpr uint16_t kOrder[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                       21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i hi =
      b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)) : _mm256_setzero_si256();
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  return _mm512_permutexvar_epi16(_mm512_load_si512(kOrder), both);
}

// A staged piece of np image pairs, each block of channels by itself so that a tile streams
// through contiguous memory:
//   xs [C/16][np][hp][wp][16]: x's pairs, the padding zero;
//   gs [width/8][np][oh][ow][8]: grad_out's pairs for the group's output channels.
struct Piece {
  uint32_t* xs;
  uint32_t* gs;
  int64_t np, width;
};

void stage_x(const ConvGeometry& g, const Plan& p, const bfloat16* x, int64_t m, Piece& s) {
  const int64_t plane = g.h * g.w * g.c, padded = p.hp * p.wp * kLanes;
  const auto zero = [](uint32_t* dst, int64_t n) {
    std::memset(dst, 0, static_cast<std::size_t>(n) * sizeof(uint32_t));
  };
  for (int64_t q = 0; q < s.np; ++q) {
    const int64_t image = 2 * (m + q);
    const uint16_t* a = bits(x) + image * plane;
    const uint16_t* b = image + 1 < g.n ? a + plane : nullptr;
    for (int64_t cb = 0; cb < g.c / kLanes; ++cb) {
      uint32_t* base = s.xs + (cb * s.np + q) * padded;
      zero(base, g.ph * p.wp * kLanes);
      zero(base + (g.ph + g.h) * p.wp * kLanes, (p.hp - g.ph - g.h) * p.wp * kLanes);
      for (int64_t y = 0; y < g.h; ++y) {
        uint32_t* row = base + (y + g.ph) * p.wp * kLanes;
        zero(row, g.pw * kLanes);
        zero(row + (g.pw + g.w) * kLanes, (p.wp - g.pw - g.w) * kLanes);
        row += g.pw * kLanes;
        const int64_t from = y * g.w * g.c + cb * kLanes;
        for (int64_t i = 0; i < g.w; ++i, row += kLanes) {
          const int64_t at = from + i * g.c;
          _mm512_storeu_si512(row, interleave(a + at, b ? b + at : nullptr));
        }
      }
    }
  }
}

void stage_grad(const ConvGeometry& g, const bfloat16* grad, int64_t m, int64_t o0, Piece& s) {
  const int64_t positions = g.oh * g.ow, plane = positions * g.o;
  for (int64_t q = 0; q < s.np; ++q) {
    const int64_t image = 2 * (m + q);
    const uint16_t* a = bits(grad) + image * plane + o0;
    const uint16_t* b = image + 1 < g.n ? a + plane : nullptr;
    for (int64_t i = 0; i < positions; ++i)
      for (int64_t ob = 0; ob < s.width; ob += 2 * kTileO) {
        const int64_t at = i * g.o + ob;
        const __m512i pairs = interleave(a + at, b ? b + at : nullptr);
        uint32_t* dst = s.gs + ((ob / kTileO * s.np + q) * positions + i) * kTileO;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_castsi512_si256(pairs));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + s.np * positions * kTileO),
                            _mm512_extracti64x4_epi64(pairs, 1));
      }
  }
}

// The piece's sums for output channels [ob, ob + 8) of the group, kernel row i and input
// channels [16 cb, 16 cb + 16): stored into the tile's 24 vectors at `sums` ([8][kw][16], the
// channel k and kernel column j at (k * kw + j) * 16) on the first piece, added on later ones.
void tile(const ConvGeometry& g, const Plan& p, const Piece& s, int64_t i, int64_t cb,
          int64_t ob, float* sums, bool first) {
  __m512 acc[kTileO][kTaps];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const int64_t column = g.sw * kLanes, positions = g.oh * g.ow;
  for (int64_t q = 0; q < s.np; ++q)
    for (int64_t y = 0; y < g.oh; ++y) {
      const uint32_t* xr = s.xs + ((cb * s.np + q) * p.hp + y * g.sh + i) * p.wp * kLanes;
      const uint32_t* gr = s.gs + ((ob / kTileO * s.np + q) * positions + y * g.ow) * kTileO;
      for (int64_t x = 0; x < g.ow; ++x, xr += column, gr += kTileO) {
        __m512bh xv[kTaps];
        for (int64_t j = 0; j < kTaps; ++j)
          xv[j] = std::bit_cast<__m512bh>(_mm512_loadu_si512(xr + j * kLanes));
        for (int64_t k = 0; k < kTileO; ++k) {
          const auto gv = std::bit_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(gr[k])));
          for (int64_t j = 0; j < kTaps; ++j) acc[k][j] = _mm512_dpbf16_ps(acc[k][j], xv[j], gv);
        }
      }
    }
  for (int64_t k = 0; k < kTileO; ++k)
    for (int64_t j = 0; j < kTaps; ++j) {
      float* dst = sums + (k * kTaps + j) * kLanes;
      _mm512_storeu_ps(dst, first ? acc[k][j] : _mm512_add_ps(_mm512_loadu_ps(dst), acc[k][j]));
    }
}

// Where a tile's sums start in a partial sum, [O/8][C/16][kh][8][kw][16] floats: each tile's
// 24 vectors together, so that storing them moves whole cache lines.
int64_t tile_offset(const ConvGeometry& g, int64_t o, int64_t cb, int64_t i) {
  return (((o / kTileO) * (g.c / kLanes) + cb) * g.kh + i) * kTileO * kTaps * kLanes;
}

struct StagedX;  // thread_scratch tags
struct StagedGrad;
struct Partials;

// One task: image pairs [m0, m1) into `sums` (a partial sum) for output channels [o0, o1).
void run_task(const ConvGeometry& g, const Plan& p, const bfloat16* x, const bfloat16* grad,
              int64_t m0, int64_t m1, int64_t o0, int64_t o1, float* sums) {
  const int64_t width = o1 - o0;
  // A tile streams through its channel block's share of the piece, which stays in L2 while
  // the tiles of the other output channels and kernel rows go over it again.
  const int64_t tile_bytes = (p.hp * p.wp * kLanes + g.oh * g.ow * kTileO) * 4;
  const int64_t step = std::clamp<int64_t>(kTileBytes / tile_bytes, 1, m1 - m0);
  const auto floats = [](int64_t n) { return static_cast<std::size_t>(n); };
  Piece piece{thread_scratch<uint32_t, StagedX>(floats(step * p.hp * p.wp * g.c)),
              thread_scratch<uint32_t, StagedGrad>(floats(step * g.oh * g.ow * width)), 0, width};
  for (int64_t m = m0; m < m1; m += step) {
    piece.np = std::min(step, m1 - m);
    stage_x(g, p, x, m, piece);
    stage_grad(g, grad, m, o0, piece);
    for (int64_t cb = 0; cb < g.c / kLanes; ++cb)
      for (int64_t ob = 0; ob < width; ob += kTileO)
        for (int64_t i = 0; i < g.kh; ++i)
          tile(g, p, piece, i, cb, ob, sums + tile_offset(g, o0 + ob, cb, i), m == m0);
  }
}

// grad_w[o][c][i][j] = the chunks' sums (tile_offset's layout), added in chunk order and
// rounded.
void finish(const ConvGeometry& g, const Plan& p, const float* partials, bfloat16* grad_w) {
  const int64_t taps = g.kh * kTaps;
  parallel_range(g.o, 8, [&](int64_t begin, int64_t end) {
    alignas(64) uint16_t rounded[kLanes * kMaxRows * kTaps];
    for (int64_t o = begin; o < end; ++o)
      for (int64_t cb = 0; cb < g.c / kLanes; ++cb) {
        for (int64_t i = 0; i < g.kh; ++i)
          for (int64_t j = 0; j < kTaps; ++j) {
            const float* src =
                partials + tile_offset(g, o, cb, i) + ((o % kTileO) * kTaps + j) * kLanes;
            __m512 v = _mm512_loadu_ps(src);
            for (int64_t k = 1; k < p.chunks; ++k)
              v = _mm512_add_ps(v, _mm512_loadu_ps(src + k * p.weights));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(rounded + (i * kTaps + j) * kLanes),
                                std::bit_cast<__m256i>(_mm512_cvtneps_pbh(v)));
          }
        bfloat16* dst = grad_w + (o * g.c + cb * kLanes) * taps;
        for (int64_t c = 0; c < kLanes; ++c)
          for (int64_t t = 0; t < taps; ++t)
            dst[c * taps + t] = bfloat16::from_bits(rounded[t * kLanes + c]);
      }
  });
}

}  // namespace

bool bf16_weight_grad_applies(const ConvGeometry& g) {
  return g.groups == 1 && g.kw == kTaps && g.kh <= kMaxRows && g.dh == 1 && g.dw == 1 &&
         g.c % kLanes == 0 && g.o % kLanes == 0 && g.n > 0 && g.oh > 0 && g.ow > 0;
}

void conv2d_grad_weight_bf16(const ConvGeometry& g, const bfloat16* x, const bfloat16* grad_out,
                             bfloat16* grad_w) {
  const Plan p = make_plan(g);
  float* partials = thread_scratch<float, Partials>(static_cast<std::size_t>(p.chunks * p.weights));
  parallel_range(p.chunks * p.groups, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t k = u / p.groups, group = u % p.groups;
      const int64_t o0 = group * p.group_o, o1 = std::min(g.o, o0 + p.group_o);
      run_task(g, p, x, grad_out, k * p.pairs / p.chunks, (k + 1) * p.pairs / p.chunks, o0, o1,
               partials + k * p.weights);
    }
  });
  finish(g, p, partials, grad_w);
}

#else  // no AVX512_BF16 in this build: oneDNN runs every bfloat16 weight gradient

bool bf16_weight_grad_applies(const ConvGeometry&) { return false; }

void conv2d_grad_weight_bf16(const ConvGeometry&, const bfloat16*, const bfloat16*, bfloat16*) {
  throw Error("conv2d_grad_weight_bf16: this build has no AVX512_BF16 kernel (check "
              "bf16_weight_grad_applies first)");
}

#endif

}  // namespace loom::runtime
