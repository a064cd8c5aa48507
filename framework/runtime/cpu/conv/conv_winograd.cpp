// Winograd F(2x2, 3x3) (Lavin & Gray 2016): a 2x2 output tile of a 3x3 conv reads a 4x4 input
// tile d, and
//   Y = A^T [ (G g G^T) . (B^T d B) ] A       (. elementwise, 16 products)
// with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; h h h; h -h h; 0 0 1]
// (h = 1/2) and A^T = [1 1 1 0; 0 1 -1 -1]. Summed over input channels, the 16 elementwise
// products become 16 GEMMs, one per position xi of the 4x4 tile:
//   forward:  M_xi [O, tiles] = U_xi [O, C] * V_xi [C, tiles],  U = G g G^T, V = B^T d B
//   weight:   dU_xi [O, C] = dM_xi [O, tiles] * V_xi^T,          dM = A dY A^T, dg = G^T dU G
// Tiles go in blocks of whole tile rows (images side by side), each block transformed, run
// through the 16 GEMMs and transformed back while it is in cache. The transforms are vector
// loops across a block's tiles (AVX-512, with a scalar path for other builds); the forward's
// GEMMs run on a register-tile kernel of their own, the weight gradient's on gemm.h.
//
// Next to the best of the direct and im2col kernels at ResNet shapes (kernel_bench, one thread):
// 1.1 to 1.6x faster with 64 to 512 channels on 4x4 to 32x32 planes; slower at 16 and 32 channels,
// where the GEMMs (inner dimension C or O) are too thin and the transforms, which move 16 floats
// per tile and channel, weigh more.
#include "runtime/cpu/conv/conv_winograd.h"

#include "runtime/cpu/gemm.h"
#include "runtime/cpu/kernels_impl.h"

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include <algorithm>

namespace loom::runtime {
namespace {

constexpr int64_t kXi = 16;     // positions in a 4x4 tile
constexpr int64_t kLanes = 16;  // floats per AVX-512 vector
// Tiles per block: the forward's transformed input and output for a block should stay in
// L2, and the GEMMs should be wide enough that packing U_xi (O x C, once per block) costs
// little next to the multiplies.
constexpr int64_t kBlockFloats = 1 << 17;
constexpr int64_t kMinBlockTiles = 96;
// The weight gradient's blocks are its GEMMs' inner dimension.
constexpr int64_t kWeightBlockFloats = 1 << 18;
// With both channel counts at least kWholeMinChannels and up to kWholeFloats floats of
// transformed input and grad_out for all the tiles together, the weight gradient transforms
// them once and runs one GEMM per xi over all the tiles (ResNet-18's 256 and 512 channels:
// 1.1 to 1.2x faster than blocks of channels that each transform grad_out again; slower at
// 64 and 128 channels, whose many tiles then leave the cache).
constexpr int64_t kWholeMinChannels = 256;
constexpr int64_t kWholeFloats = int64_t{1} << 23;
// It then takes output channels kWholeBlockO at a time, so that their dU [16][ob][C] stays in
// cache until its transform reads it (a whole [16][O][C] went out to memory and back: 10%
// slower).
constexpr int64_t kWholeBlockO = 64;
// Otherwise the weight gradient's tasks are blocks of input channels, then chunks of tile
// rows, each chunk a partial sum of 16*O*C floats (at most kMaxPartialFloats in all) added in
// chunk order. A fixed number, not the thread count, so the result is the same on any
// machine.
constexpr int64_t kWeightTasks = 8;
constexpr int64_t kMinWeightChannels = 64;
constexpr int64_t kMaxPartialFloats = int64_t{1} << 24;

// c [m, n] (= or +=) a [m, k] * b, b stored [k, n] or, when tb, [n, k]; rows of b and c are
// their width apart. The path for builds without AVX-512.
[[maybe_unused]] void multiply(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                               const float* b, bool tb, float* c, bool accumulate) {
  gemm(false, tb, m, n, k, a, lda, b, tb ? k : n, c, n, accumulate);
}

#ifdef __AVX512F__
// The forward's GEMMs M_xi = U_xi * V_xi run on a register tile of 4 output channels x 6
// vectors of tiles, as the direct kernels do (conv_direct.cpp): 24 accumulators, 4 weight
// broadcasts and 6 loads per 24 FMAs, with U_xi packed as [O/4][C][4] and no packing of V.
// Eigen's GEMM, packing both operands for each of the 16 products per block, ran at about
// 60% of that rate.
constexpr int kTileO = 4;
constexpr int kTileVectors = 6;

inline void pin(__m512& v) {
  asm("" : "+v"(v));  // keep the loaded vector in a register (see conv_direct_impl.h)
}

// m[k][16j ..] = sum over c of u[c][k] * v[c][16j ..] for k < rows, j < V; v's rows ld floats
// apart, m's mld.
template <int V>
void gemm_tile(const float* v, int64_t ld, int64_t nc, const float* u, float* m, int64_t mld,
               int64_t rows) {
  __m512 acc[kTileO][V];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  for (int64_t c = 0; c < nc; ++c, u += kTileO, v += ld) {
    __m512 w[kTileO];
    for (int k = 0; k < kTileO; ++k) w[k] = _mm512_set1_ps(u[k]);
    for (int j = 0; j < V; ++j) {
      __m512 x = _mm512_loadu_ps(v + j * kLanes);
      pin(x);
      for (int k = 0; k < kTileO; ++k) acc[k][j] = _mm512_fmadd_ps(w[k], x, acc[k][j]);
    }
  }
  for (int k = 0; k < rows; ++k)
    for (int j = 0; j < V; ++j) _mm512_storeu_ps(m + k * mld + j * kLanes, acc[k][j]);
}

using GemmTile = void (*)(const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
constexpr GemmTile kGemmTiles[kTileVectors + 1] = {nullptr,       gemm_tile<1>, gemm_tile<2>,
                                                   gemm_tile<3>, gemm_tile<4>, gemm_tile<5>,
                                                   gemm_tile<6>};

// M [16][O][ld] = U * V [16][C][ld], U packed [16][O/4][C][4]; ld a multiple of 16.
void forward_gemms(const float* u, const float* v, int64_t nc, int64_t no, int64_t ld, float* m) {
  const int64_t otiles = ceil_div(no, kTileO), vectors = ld / kLanes;
  for (int64_t xi = 0; xi < kXi; ++xi) {
    const float* uxi = u + xi * otiles * kTileO * nc;
    const float* vxi = v + xi * nc * ld;
    float* mxi = m + xi * no * ld;
    for (int64_t v0 = 0; v0 < vectors; v0 += kTileVectors) {
      const int64_t nv = std::min<int64_t>(kTileVectors, vectors - v0);
      for (int64_t ot = 0; ot < otiles; ++ot)
        kGemmTiles[nv](vxi + v0 * kLanes, ld, nc, uxi + ot * kTileO * nc,
                       mxi + ot * kTileO * ld + v0 * kLanes, ld,
                       std::min<int64_t>(kTileO, no - ot * kTileO));
    }
  }
}

#endif

struct Tiling {
  int64_t th, tw;  // tiles per image along y and x
  int64_t rows;    // tile rows in all: n * th
  int64_t rows_per_block;
};

Tiling tiling(const ConvGeometry& g, int64_t floats_per_tile, int64_t block_floats) {
  Tiling t;
  t.th = ceil_div(g.oh, 2);
  t.tw = ceil_div(g.ow, 2);
  t.rows = g.n * t.th;
  const int64_t tiles =
      std::max(kMinBlockTiles, block_floats / std::max<int64_t>(1, floats_per_tile));
  // As many blocks as that takes, evened out.
  const int64_t blocks = ceil_div(t.rows, std::clamp<int64_t>(tiles / t.tw, 1, t.rows));
  t.rows_per_block = ceil_div(t.rows, blocks);
  return t;
}

// Per-tile transforms of tiles [0, tiles) of a block, tiles numbered along tile rows. The
// input is staged per tile row as P_k = columns [0, 2*tw) and Q_k = columns [2, 2*tw+2) of
// the tile row's input row k (columns counted from -pw, zero outside the plane): then the
// 4 columns of tile t are P_k[2t], P_k[2t+1], Q_k[2t], Q_k[2t+1] at index 2t of the block's
// staged rows, whichever tile row t is in, so the transforms run over the block's tiles as
// one vector loop. The output and grad_out rows are staged the same way, 2 columns per tile.

// Stages one input row: p[i] = src[first + i] and q[i] = src[first + 2 + i] for i in [0, n),
// zero where the index is outside [0, size) or src is null. May write up to kLanes - 1 floats
// past p + n and q + n.
inline void stage_row(const float* src, int64_t size, int64_t first, int64_t n, float* p,
                      float* q) {
#ifdef __AVX512F__
  if (!src) {
    for (int64_t i = 0; i < n; i += kLanes) {
      _mm512_storeu_ps(p + i, _mm512_setzero_ps());
      _mm512_storeu_ps(q + i, _mm512_setzero_ps());
    }
    return;
  }
  auto chunk = [&](int64_t at) {  // src[at .. at+kLanes), zero outside [0, size)
    if (at >= 0 && at + kLanes <= size) return _mm512_loadu_ps(src + at);
    const int64_t a = std::clamp<int64_t>(-at, 0, kLanes),
                  b = std::clamp<int64_t>(size - at, a, kLanes);
    const auto mask = static_cast<__mmask16>(((1u << b) - 1) & ~((1u << a) - 1));
    // Lanes outside [a, b) are masked off and never read.
    return mask ? _mm512_maskz_loadu_ps(mask, src + at) : _mm512_setzero_ps();
  };
  for (int64_t i = 0; i < n; i += kLanes) {
    _mm512_storeu_ps(p + i, chunk(first + i));
    _mm512_storeu_ps(q + i, chunk(first + 2 + i));
  }
#else
  for (int64_t i = 0; i < n; ++i) {
    p[i] = src && first + i >= 0 && first + i < size ? src[first + i] : 0.f;
    q[i] = src && first + 2 + i >= 0 && first + 2 + i < size ? src[first + 2 + i] : 0.f;
  }
#endif
}

// dst[i] = src[i] for i in [0, n), zero for [n, m) and where src is null; may write up to
// kLanes - 1 floats past dst + m.
inline void stage_grad_row(const float* src, int64_t n, int64_t m, float* dst) {
#ifdef __AVX512F__
  for (int64_t i = 0; i < m; i += kLanes) {
    __m512 v = _mm512_setzero_ps();
    if (src && i + kLanes <= n) v = _mm512_loadu_ps(src + i);
    else if (src && i < n)
      v = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (n - i)) - 1), src + i);
    _mm512_storeu_ps(dst + i, v);
  }
#else
  for (int64_t i = 0; i < m; ++i) dst[i] = src && i < n ? src[i] : 0.f;
#endif
}

#ifdef __AVX512F__
const __m512i kEven = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
const __m512i kOdd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
const __m512i kLow = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
const __m512i kHigh =
    _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);

inline __mmask16 tail_mask(int64_t left) {
  return left >= kLanes ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}
#endif

// V = B^T d B of tiles [0, tiles) from the staged rows p[k], q[k]: V_xi of tile t goes to
// v[xi * stride + t].
void input_transform(const float* const* p, const float* const* q, int64_t tiles, float* v,
                     int64_t stride) {
#ifdef __AVX512F__
  for (int64_t t = 0; t < tiles; t += kLanes) {
    __m512 d[4][4];
    for (int k = 0; k < 4; ++k) {
      const __m512 p0 = _mm512_loadu_ps(p[k] + 2 * t), p1 = _mm512_loadu_ps(p[k] + 2 * t + kLanes);
      const __m512 q0 = _mm512_loadu_ps(q[k] + 2 * t), q1 = _mm512_loadu_ps(q[k] + 2 * t + kLanes);
      d[k][0] = _mm512_permutex2var_ps(p0, kEven, p1);
      d[k][1] = _mm512_permutex2var_ps(p0, kOdd, p1);
      d[k][2] = _mm512_permutex2var_ps(q0, kEven, q1);
      d[k][3] = _mm512_permutex2var_ps(q0, kOdd, q1);
    }
    __m512 u[4][4];
    for (int j = 0; j < 4; ++j) {
      u[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
      u[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
      u[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
      u[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
    }
    const __mmask16 m = tail_mask(tiles - t);
    for (int i = 0; i < 4; ++i) {
      _mm512_mask_storeu_ps(v + (4 * i + 0) * stride + t, m, _mm512_sub_ps(u[i][0], u[i][2]));
      _mm512_mask_storeu_ps(v + (4 * i + 1) * stride + t, m, _mm512_add_ps(u[i][1], u[i][2]));
      _mm512_mask_storeu_ps(v + (4 * i + 2) * stride + t, m, _mm512_sub_ps(u[i][2], u[i][1]));
      _mm512_mask_storeu_ps(v + (4 * i + 3) * stride + t, m, _mm512_sub_ps(u[i][1], u[i][3]));
    }
  }
#else
  for (int64_t t = 0; t < tiles; ++t) {
    float u[4][4];
    for (int j = 0; j < 4; ++j) {
      const int64_t at = 2 * t + (j & 1);
      const float* const* src = j < 2 ? p : q;
      const float d0 = src[0][at], d1 = src[1][at], d2 = src[2][at], d3 = src[3][at];
      u[0][j] = d0 - d2;
      u[1][j] = d1 + d2;
      u[2][j] = d2 - d1;
      u[3][j] = d1 - d3;
    }
    for (int i = 0; i < 4; ++i) {
      v[(4 * i + 0) * stride + t] = u[i][0] - u[i][2];
      v[(4 * i + 1) * stride + t] = u[i][1] + u[i][2];
      v[(4 * i + 2) * stride + t] = u[i][2] - u[i][1];
      v[(4 * i + 3) * stride + t] = u[i][1] - u[i][3];
    }
  }
#endif
}

// Y = A^T M A of tiles [0, tiles), M_xi of tile t at m[xi * stride + t] (readable up to
// kLanes - 1 floats past the last tile): output rows 0 and 1 of tile t go to y0[2t], y0[2t+1]
// and y1[2t], y1[2t+1] (written up to 2*kLanes - 1 floats past the last tile).
void output_transform(const float* m, int64_t stride, int64_t tiles, float* y0, float* y1) {
#ifdef __AVX512F__
  for (int64_t t = 0; t < tiles; t += kLanes) {
    __m512 s0[4], s1[4];
    for (int j = 0; j < 4; ++j) {
      const __m512 m0 = _mm512_loadu_ps(m + j * stride + t),
                   m1 = _mm512_loadu_ps(m + (4 + j) * stride + t),
                   m2 = _mm512_loadu_ps(m + (8 + j) * stride + t),
                   m3 = _mm512_loadu_ps(m + (12 + j) * stride + t);
      s0[j] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
      s1[j] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
    }
    const __m512 a0 = _mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]),
                 b0 = _mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3]),
                 a1 = _mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]),
                 b1 = _mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3]);
    _mm512_storeu_ps(y0 + 2 * t, _mm512_permutex2var_ps(a0, kLow, b0));
    _mm512_storeu_ps(y0 + 2 * t + kLanes, _mm512_permutex2var_ps(a0, kHigh, b0));
    _mm512_storeu_ps(y1 + 2 * t, _mm512_permutex2var_ps(a1, kLow, b1));
    _mm512_storeu_ps(y1 + 2 * t + kLanes, _mm512_permutex2var_ps(a1, kHigh, b1));
  }
#else
  for (int64_t t = 0; t < tiles; ++t) {
    float s0[4], s1[4];
    for (int j = 0; j < 4; ++j) {
      const float m0 = m[j * stride + t], m1 = m[(4 + j) * stride + t],
                  m2 = m[(8 + j) * stride + t], m3 = m[(12 + j) * stride + t];
      s0[j] = m0 + m1 + m2;
      s1[j] = m1 - m2 - m3;
    }
    y0[2 * t] = s0[0] + s0[1] + s0[2];
    y0[2 * t + 1] = s0[1] - s0[2] - s0[3];
    y1[2 * t] = s1[0] + s1[1] + s1[2];
    y1[2 * t + 1] = s1[1] - s1[2] - s1[3];
  }
#endif
}

// dM = A dY A^T of tiles [0, tiles), dY of tile t at g0[2t], g0[2t+1] (its first row) and
// g1[2t], g1[2t+1]: dM_xi of tile t goes to dm[xi * stride + t].
void grad_output_transform(const float* g0, const float* g1, int64_t tiles, float* dm,
                           int64_t stride) {
  // Rows of A dY: (a, b), (a + c, b + d), (a - c, b - d), (-c, -d); then each row (p, q)
  // times A^T: (p, p + q, p - q, -q).
#ifdef __AVX512F__
  for (int64_t t = 0; t < tiles; t += kLanes) {
    const __m512 g00 = _mm512_loadu_ps(g0 + 2 * t), g01 = _mm512_loadu_ps(g0 + 2 * t + kLanes);
    const __m512 g10 = _mm512_loadu_ps(g1 + 2 * t), g11 = _mm512_loadu_ps(g1 + 2 * t + kLanes);
    const __m512 a = _mm512_permutex2var_ps(g00, kEven, g01),
                 b = _mm512_permutex2var_ps(g00, kOdd, g01),
                 c = _mm512_permutex2var_ps(g10, kEven, g11),
                 d = _mm512_permutex2var_ps(g10, kOdd, g11);
    const __m512 zero = _mm512_setzero_ps();
    const __m512 p[4] = {a, _mm512_add_ps(a, c), _mm512_sub_ps(a, c), _mm512_sub_ps(zero, c)};
    const __m512 q[4] = {b, _mm512_add_ps(b, d), _mm512_sub_ps(b, d), _mm512_sub_ps(zero, d)};
    const __mmask16 m = tail_mask(tiles - t);
    for (int i = 0; i < 4; ++i) {
      _mm512_mask_storeu_ps(dm + (4 * i + 0) * stride + t, m, p[i]);
      _mm512_mask_storeu_ps(dm + (4 * i + 1) * stride + t, m, _mm512_add_ps(p[i], q[i]));
      _mm512_mask_storeu_ps(dm + (4 * i + 2) * stride + t, m, _mm512_sub_ps(p[i], q[i]));
      _mm512_mask_storeu_ps(dm + (4 * i + 3) * stride + t, m, _mm512_sub_ps(zero, q[i]));
    }
  }
#else
  for (int64_t t = 0; t < tiles; ++t) {
    const float a = g0[2 * t], b = g0[2 * t + 1], c = g1[2 * t], d = g1[2 * t + 1];
    const float p[4] = {a, a + c, a - c, -c}, q[4] = {b, b + d, b - d, -d};
    for (int i = 0; i < 4; ++i) {
      dm[(4 * i + 0) * stride + t] = p[i];
      dm[(4 * i + 1) * stride + t] = p[i] + q[i];
      dm[(4 * i + 2) * stride + t] = p[i] - q[i];
      dm[(4 * i + 3) * stride + t] = -q[i];
    }
  }
#endif
}

// U = G g G^T of one 3x3 kernel: U_xi goes to u[xi * stride].
void weight_transform(const float* g, float* u, int64_t stride) {
  float r[4][3];  // G g
  for (int j = 0; j < 3; ++j) {
    r[0][j] = g[j];
    r[1][j] = 0.5f * (g[j] + g[3 + j] + g[6 + j]);
    r[2][j] = 0.5f * (g[j] - g[3 + j] + g[6 + j]);
    r[3][j] = g[6 + j];
  }
  for (int i = 0; i < 4; ++i) {
    u[(4 * i + 0) * stride] = r[i][0];
    u[(4 * i + 1) * stride] = 0.5f * (r[i][0] + r[i][1] + r[i][2]);
    u[(4 * i + 2) * stride] = 0.5f * (r[i][0] - r[i][1] + r[i][2]);
    u[(4 * i + 3) * stride] = r[i][2];
  }
}

// dg = G^T dU G of one kernel, dU_xi read from du[xi * stride].
void weight_grad_transform(const float* du, int64_t stride, float* g) {
  float r[3][4];  // G^T dU
  for (int j = 0; j < 4; ++j) {
    const float d0 = du[j * stride], d1 = du[(4 + j) * stride], d2 = du[(8 + j) * stride],
                d3 = du[(12 + j) * stride];
    r[0][j] = d0 + 0.5f * (d1 + d2);
    r[1][j] = 0.5f * (d1 - d2);
    r[2][j] = 0.5f * (d1 + d2) + d3;
  }
  for (int i = 0; i < 3; ++i) {
    g[3 * i + 0] = r[i][0] + 0.5f * (r[i][1] + r[i][2]);
    g[3 * i + 1] = 0.5f * (r[i][1] - r[i][2]);
    g[3 * i + 2] = 0.5f * (r[i][1] + r[i][2]) + r[i][3];
  }
}

// Floats of staging a block of `tiles` tiles takes: 8 staged rows of 2 columns per tile, each
// with room for the vector loops to run past its end.
int64_t stage_floats(int64_t tiles) {
  return 8 * (2 * tiles + 2 * kLanes);
}

// V [16][cn][ld] for input channels [c0, c0+cn) of tile rows [r0, r1) (tiles <= ld; columns
// past the tiles are left as they are: the forward's GEMMs run over them and drop them).
void transform_inputs(const ConvGeometry& g, const Tiling& t, const float* x, int64_t c0,
                      int64_t cn, int64_t r0, int64_t r1, float* v, int64_t ld, float* stage) {
  const int64_t tiles = (r1 - r0) * t.tw, row = 2 * t.tw, span = 2 * tiles + 2 * kLanes;
  const float* p[4];
  const float* q[4];
  for (int k = 0; k < 4; ++k) {
    p[k] = stage + 2 * k * span;
    q[k] = stage + (2 * k + 1) * span;
  }
  for (int64_t c = 0; c < cn; ++c) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / t.th, ty = r % t.th;
      const float* plane = x + (img * g.c + c0 + c) * g.h * g.w;
      for (int k = 0; k < 4; ++k) {
        const int64_t y = 2 * ty - g.ph + k;
        const float* src = y >= 0 && y < g.h ? plane + y * g.w : nullptr;
        stage_row(src, g.w, -g.pw, row, stage + 2 * k * span + (r - r0) * row,
                  stage + (2 * k + 1) * span + (r - r0) * row);
      }
    }
    input_transform(p, q, tiles, v + c * ld, cn * ld);
  }
}

// Output channels [o0, o0+on) of tile rows [r0, r1) from M [16][on][ld].
void transform_outputs(const ConvGeometry& g, const Tiling& t, const float* m, int64_t ld,
                       int64_t o0, int64_t on, int64_t r0, int64_t r1, float* out, float* stage) {
  const int64_t tiles = (r1 - r0) * t.tw, row = 2 * t.tw, span = 2 * tiles + 2 * kLanes;
  float* y0 = stage;
  float* y1 = stage + span;
  const int64_t plane = g.oh * g.ow;
  for (int64_t o = 0; o < on; ++o) {
    output_transform(m + o * ld, on * ld, tiles, y0, y1);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / t.th, ty = r % t.th;
      float* dst = out + (img * g.o + o0 + o) * plane + 2 * ty * g.ow;
      std::copy(y0 + (r - r0) * row, y0 + (r - r0) * row + g.ow, dst);
      if (2 * ty + 1 < g.oh) std::copy(y1 + (r - r0) * row, y1 + (r - r0) * row + g.ow, dst + g.ow);
    }
  }
}

// dM [16][O][ld] of tile rows [r0, r1) from grad_out.
void transform_grad_outputs(const ConvGeometry& g, const Tiling& t, const float* grad_out,
                            int64_t r0, int64_t r1, float* dm, int64_t ld, float* stage) {
  const int64_t tiles = (r1 - r0) * t.tw, row = 2 * t.tw, span = 2 * tiles + 2 * kLanes;
  float* g0 = stage;
  float* g1 = stage + span;
  for (int64_t o = 0; o < g.o; ++o) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / t.th, ty = r % t.th;
      const float* src = grad_out + ((img * g.o + o) * g.oh + 2 * ty) * g.ow;
      stage_grad_row(src, g.ow, row, g0 + (r - r0) * row);
      stage_grad_row(2 * ty + 1 < g.oh ? src + g.ow : nullptr, g.ow, row, g1 + (r - r0) * row);
    }
    grad_output_transform(g0, g1, tiles, dm + o * ld, g.o * ld);
  }
}

}  // namespace

bool winograd_applies(const ConvGeometry& g) {
  return g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 &&
         g.groups == 1 && g.ph >= 0 && g.pw >= 0 && g.oh == g.h + 2 * g.ph - 2 &&
         g.ow == g.w + 2 * g.pw - 2 && g.oh > 0 && g.ow > 0 && g.c > 0 && g.o > 0;
}

bool conv2d_winograd(const ConvGeometry& g, const float* x, const float* w, float* out) {
  if (!winograd_applies(g)) return false;
  const int64_t nc = g.c, no = g.o;
  const Tiling t = tiling(g, kXi * (nc + no), kBlockFloats);
#ifdef __AVX512F__
  // U packed [16][O/4][C][4] for forward_gemms, zero past O; blocks padded to whole vectors.
  const int64_t urows = ceil_div(no, kTileO) * kTileO;
  float* u = scratch<float>(kXi * urows * nc, Scratch::kPacked);
  if (urows != no) std::fill(u, u + kXi * urows * nc, 0.f);
  auto u_at = [&](int64_t o, int64_t c) { return u + (o / kTileO * nc + c) * kTileO + o % kTileO; };
  const int64_t ustride = urows * nc;
  auto ld_of = [](int64_t tiles) { return ceil_div(tiles, kLanes) * kLanes; };
#else
  float* u = scratch<float>(kXi * no * nc, Scratch::kPacked);  // [16][O][C]
  auto u_at = [&](int64_t o, int64_t c) { return u + o * nc + c; };
  const int64_t ustride = no * nc;
  auto ld_of = [](int64_t tiles) { return tiles; };
#endif
  parallel_range(no * nc, 1024, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) weight_transform(w + i * 9, u_at(i / nc, i % nc), ustride);
  });
  const int64_t blocks = ceil_div(t.rows, t.rows_per_block);
  const int64_t max_ld = ld_of(t.rows_per_block * t.tw);
  parallel_range(blocks, 1, [&](int64_t s, int64_t e) {
    float* v = scratch<float>(kXi * nc * max_ld, Scratch::kTaskInput);
    // M, with room for the output transform's vectors to read past its last row.
    float* m = scratch<float>(kXi * no * max_ld + kLanes, Scratch::kTaskAcc);
    float* stage = scratch<float>(stage_floats(max_ld), Scratch::kTaskGrad);
    for (int64_t b = s; b < e; ++b) {
      const int64_t r0 = b * t.rows_per_block, r1 = std::min(t.rows, r0 + t.rows_per_block);
      const int64_t ld = ld_of((r1 - r0) * t.tw);
      transform_inputs(g, t, x, 0, nc, r0, r1, v, ld, stage);
#ifdef __AVX512F__
      forward_gemms(u, v, nc, no, ld, m);
#else
      for (int64_t xi = 0; xi < kXi; ++xi)
        multiply(no, ld, nc, u + xi * no * nc, nc, v + xi * nc * ld, false, m + xi * no * ld,
                 false);
#endif
      transform_outputs(g, t, m, ld, 0, no, r0, r1, out, stage);
    }
  });
  return true;
}

namespace {

// grad_w [O][C][3][3] = G^T dU G, dU summed over `chunks` partial sums `wsize` floats apart,
// dU_xi of (o, c) at partial[(o*C + c) * pair_stride + xi * xi_stride].
void finish_weight_grad(int64_t no, int64_t nc, const float* partial, int64_t chunks,
                        int64_t wsize, int64_t pair_stride, int64_t xi_stride, float* grad_w) {
  parallel_range(no * nc, 1024, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      float du[kXi];
      for (int64_t xi = 0; xi < kXi; ++xi) {
        const float* p = partial + i * pair_stride + xi * xi_stride;
        float sum = p[0];
        for (int64_t k = 1; k < chunks; ++k) sum += p[k * wsize];
        du[xi] = sum;
      }
      weight_grad_transform(du, 1, grad_w + i * 9);
    }
  });
}

// Where the transformed input and grad_out of all tiles together are small (few tiles: wide
// channels on small planes), they are computed once, in parallel over blocks of tile rows,
// and each dU_xi is then one GEMM over all the tiles: no partial sums, and no transform
// repeated per block of channels.
void grad_weight_whole(const ConvGeometry& g, const float* x, const float* grad_out,
                       float* grad_w) {
  const int64_t nc = g.c, no = g.o;
  const Tiling t = tiling(g, kXi * (nc + no), kBlockFloats);
  const int64_t tiles = t.rows * t.tw;
  float* v = scratch<float>(kXi * nc * tiles, Scratch::kPhases);   // [16][C][tiles]
  float* dm = scratch<float>(kXi * no * tiles, Scratch::kDerived);  // [16][O][tiles]
  const int64_t blocks = ceil_div(t.rows, t.rows_per_block);
  parallel_range(blocks, 1, [&](int64_t s, int64_t e) {
    float* stage = scratch<float>(stage_floats(t.rows_per_block * t.tw), Scratch::kTaskGrad);
    for (int64_t b = s; b < e; ++b) {
      const int64_t r0 = b * t.rows_per_block, r1 = std::min(t.rows, r0 + t.rows_per_block);
      transform_inputs(g, t, x, 0, nc, r0, r1, v + r0 * t.tw, tiles, stage);
      transform_grad_outputs(g, t, grad_out, r0, r1, dm + r0 * t.tw, tiles, stage);
    }
  });
  // Then per block of output channels, dU [16][ob][C] (in cache) and its transform.
  const int64_t ob = std::min(no, kWholeBlockO);
  parallel_range(ceil_div(no, ob), 1, [&](int64_t s, int64_t e) {
    float* du = scratch<float>(kXi * ob * nc, Scratch::kTaskAcc);
    for (int64_t b = s; b < e; ++b) {
      const int64_t o0 = b * ob, on = std::min(ob, no - o0);
      for (int64_t xi = 0; xi < kXi; ++xi)
        gemm(false, true, on, nc, tiles, dm + (xi * no + o0) * tiles, tiles, v + xi * nc * tiles,
             tiles, du + xi * on * nc, nc, false);
      for (int64_t i = 0; i < on * nc; ++i) {
        float d[kXi];
        for (int64_t xi = 0; xi < kXi; ++xi) d[xi] = du[xi * on * nc + i];
        weight_grad_transform(d, 1, grad_w + (o0 * nc + i) * 9);
      }
    }
  });
}

}  // namespace

bool conv2d_grad_weight_winograd(const ConvGeometry& g, const float* x, const float* grad_out,
                                 float* grad_w) {
  if (!winograd_applies(g)) return false;
  const int64_t nc = g.c, no = g.o;
  const int64_t tiles = g.n * ceil_div(g.oh, 2) * ceil_div(g.ow, 2);
  if (std::min(nc, no) >= kWholeMinChannels && kXi * (nc + no) * tiles <= kWholeFloats) {
    grad_weight_whole(g, x, grad_out, grad_w);
    return true;
  }
  // Blocks of input channels first (each task transforms grad_out again, a small cost next
  // to its GEMMs where blocks are wide), then chunks of tile rows, each a partial sum.
  const int64_t cblocks = std::clamp<int64_t>(nc / kMinWeightChannels, 1, kWeightTasks);
  const int64_t cpb = ceil_div(nc, cblocks);
  const Tiling t = tiling(g, kXi * (cpb + no), kWeightBlockFloats);
  const int64_t wsize = kXi * no * nc;
  int64_t chunks = std::clamp<int64_t>(ceil_div(kWeightTasks, cblocks), 1,
                                       std::max<int64_t>(1, kMaxPartialFloats / wsize));
  chunks = std::min(chunks, t.rows);
  const int64_t rows_per_chunk = ceil_div(t.rows, chunks);
  chunks = ceil_div(t.rows, rows_per_chunk);
  const int64_t max_tiles = std::min(t.rows_per_block, rows_per_chunk) * t.tw;
  // [chunk][O][C][16]: the sum over chunks and the final transform read 16 floats in a row.
  float* partial = scratch<float>(chunks * wsize, Scratch::kPartial);
  parallel_range(chunks * cblocks, 1, [&](int64_t s, int64_t e) {
    float* v = scratch<float>(kXi * cpb * max_tiles, Scratch::kTaskInput);
    float* dm = scratch<float>(kXi * no * max_tiles, Scratch::kTaskGrad);
    float* acc = scratch<float>(kXi * no * cpb + stage_floats(max_tiles), Scratch::kTaskAcc);
    float* stage = acc + kXi * no * cpb;
    for (int64_t task = s; task < e; ++task) {
      const int64_t chunk = task / cblocks, c0 = (task % cblocks) * cpb;
      const int64_t cn = std::min(cpb, nc - c0);
      const int64_t first = chunk * rows_per_chunk, last = std::min(t.rows, first + rows_per_chunk);
      for (int64_t r0 = first; r0 < last; r0 += t.rows_per_block) {
        const int64_t r1 = std::min(last, r0 + t.rows_per_block);
        const int64_t n = (r1 - r0) * t.tw;
        transform_inputs(g, t, x, c0, cn, r0, r1, v, n, stage);
        transform_grad_outputs(g, t, grad_out, r0, r1, dm, n, stage);
        for (int64_t xi = 0; xi < kXi; ++xi)  // acc [16][O][cn]
          gemm(false, true, no, cn, n, dm + xi * no * n, n, v + xi * cn * n, n,
               acc + xi * no * cn, cn, r0 != first);
      }
      float* dst = partial + chunk * wsize;
      for (int64_t o = 0; o < no; ++o)
        for (int64_t ci = 0; ci < cn; ++ci)
          for (int64_t xi = 0; xi < kXi; ++xi)
            dst[(o * nc + c0 + ci) * kXi + xi] = acc[(xi * no + o) * cn + ci];
    }
  });
  finish_weight_grad(no, nc, partial, chunks, wsize, kXi, 1, grad_w);
  return true;
}

}  // namespace loom::runtime
