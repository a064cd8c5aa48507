// The bfloat16 weight gradient on vdpbf16ps (conv_weight_bf16.h):
//   grad_w[o][c][i][j] = sum over images n and output positions (y, x) of
//                        grad_out[n][y][x][o] * x[n][y*sh + i - ph][x*sw + j - pw][c]
// vdpbf16ps multiplies pairs: lane c of a vector holds x of images 2m and 2m+1 at channel c,
// and the broadcast holds grad_out of the same two images at channel o, so one instruction adds
// both images' products into 16 channels' float32 sums. Staging makes those pairs: a piece of
// image pairs is interleaved into per-thread buffers (x padded with zeros, so no tap checks
// bounds), then every register tile runs over the whole piece: 8 output channels x the 3
// kernel columns of one kernel row x 16 input channels, 24 sums, 3 loads and 8 broadcasts per
// 24 dot products. The sums are kept as [O][kh][kw][C] (vectors over C) and transposed to
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

constexpr int64_t kLanes = 16;  // float32 sums per vector: input channels
constexpr int64_t kTileO = 8;   // output channels per register tile
constexpr int64_t kTaps = 3;    // kernel columns per register tile: the kernel's width
constexpr int64_t kMaxRows = 7;  // kernel rows
// Bytes staged per task at a time: a piece of image pairs that stays in L2 (1 MiB per core on
// the development machine) while every tile runs over it.
constexpr int64_t kStageBytes = 384 * 1024;
// Weights of up to this many elements split the images into kImageChunks partial sums, added
// in order at the end; wider ones split the output channels into at most kMaxGroups groups
// instead (each task then stages every image, which is cheap next to its sums there).
constexpr int64_t kMaxChunkedWeights = 64 * 64 * 9;
constexpr int64_t kImageChunks = 8;
constexpr int64_t kMaxGroups = 8;

struct Plan {
  int64_t pairs;            // image pairs, the last one half when the batch is odd
  int64_t chunks;           // image-pair ranges, each its own partial sum
  int64_t groups, group_o;  // output-channel groups, channels per group (a multiple of 16)
  int64_t hp, wp;           // the padded input plane
  int64_t weights;          // floats of one partial sum, [O][kh][kw][C]
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

// dst[i] = a[i] | b[i] << 16 for i < n (a multiple of 16); b null: zeros (a missing image).
void interleave(const uint16_t* a, const uint16_t* b, uint32_t* dst, int64_t n) {
  alignas(64) static constexpr uint16_t kOrder[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                       21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26,
                                                       11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i order = _mm512_load_si512(kOrder);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i));
    const __m256i hi =
        b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)) : _mm256_setzero_si256();
    const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    _mm512_storeu_si512(dst + i, _mm512_permutexvar_epi16(order, both));
  }
}

// Stages pairs [m, m + np) of x into xs, [np][hp][wp][C] pairs, the padding zero.
void stage_x(const ConvGeometry& g, const Plan& p, const bfloat16* x, int64_t m, int64_t np,
             uint32_t* xs) {
  const int64_t row = g.w * g.c, plane = g.h * row, padded_row = p.wp * g.c;
  const auto zero = [](uint32_t* dst, int64_t n) {
    std::memset(dst, 0, static_cast<std::size_t>(n) * sizeof(uint32_t));
  };
  for (int64_t q = 0; q < np; ++q) {
    const int64_t image = 2 * (m + q);
    const uint16_t* a = bits(x) + image * plane;
    const uint16_t* b = image + 1 < g.n ? a + plane : nullptr;
    uint32_t* base = xs + q * p.hp * padded_row;
    zero(base, g.ph * padded_row);
    zero(base + (g.ph + g.h) * padded_row, (p.hp - g.ph - g.h) * padded_row);
    for (int64_t y = 0; y < g.h; ++y) {
      uint32_t* dst = base + (y + g.ph) * padded_row;
      zero(dst, g.pw * g.c);
      zero(dst + (g.pw + g.w) * g.c, (p.wp - g.pw - g.w) * g.c);
      interleave(a + y * row, b ? b + y * row : nullptr, dst + g.pw * g.c, row);
    }
  }
}

// Stages pairs [m, m + np) of grad_out's channels [o0, o1) into gs, [np][oh][ow][o1 - o0].
void stage_grad(const ConvGeometry& g, const bfloat16* grad, int64_t m, int64_t np, int64_t o0,
                int64_t o1, uint32_t* gs) {
  const int64_t positions = g.oh * g.ow, plane = positions * g.o, width = o1 - o0;
  for (int64_t q = 0; q < np; ++q) {
    const int64_t image = 2 * (m + q);
    const uint16_t* a = bits(grad) + image * plane;
    const uint16_t* b = image + 1 < g.n ? a + plane : nullptr;
    uint32_t* dst = gs + q * positions * width;
    if (width == g.o) {
      interleave(a, b, dst, plane);
      continue;
    }
    for (int64_t i = 0; i < positions; ++i)
      interleave(a + i * g.o + o0, b ? b + i * g.o + o0 : nullptr, dst + i * width, width);
  }
}

// One staged piece: np pairs of padded x ([np][hp][wp][C]) and of grad_out ([np][oh][ow][width]).
struct Piece {
  const uint32_t* xs;
  const uint32_t* gs;
  int64_t np, width;
};

// Adds the piece's sums for output channels [ob, ob + 8) of the group, kernel row i and input
// channels [16 cb, 16 cb + 16) into sums: sums[k * o_stride + j * kLanes...] for channel ob + k
// and kernel column j (the partial's [O][kh][kw][C] rows from this tile's corner).
void tile(const ConvGeometry& g, const Plan& p, const Piece& s, int64_t i, int64_t cb,
          int64_t ob, float* sums, int64_t o_stride) {
  __m512 acc[kTileO][kTaps];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const int64_t column = g.sw * g.c;
  for (int64_t q = 0; q < s.np; ++q)
    for (int64_t y = 0; y < g.oh; ++y) {
      const uint32_t* xr = s.xs + ((q * p.hp + y * g.sh + i) * p.wp) * g.c + cb * kLanes;
      const uint32_t* gr = s.gs + ((q * g.oh + y) * g.ow) * s.width + ob;
      for (int64_t x = 0; x < g.ow; ++x, xr += column, gr += s.width) {
        __m512bh xv[kTaps];
        for (int64_t j = 0; j < kTaps; ++j)
          xv[j] = std::bit_cast<__m512bh>(_mm512_loadu_si512(xr + j * g.c));
        for (int64_t k = 0; k < kTileO; ++k) {
          const auto gv = std::bit_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(gr[k])));
          for (int64_t j = 0; j < kTaps; ++j) acc[k][j] = _mm512_dpbf16_ps(acc[k][j], xv[j], gv);
        }
      }
    }
  for (int64_t k = 0; k < kTileO; ++k)
    for (int64_t j = 0; j < kTaps; ++j) {
      float* dst = sums + k * o_stride + j * g.c;
      _mm512_storeu_ps(dst, _mm512_add_ps(_mm512_loadu_ps(dst), acc[k][j]));
    }
}

struct StagedX;  // thread_scratch tags
struct StagedGrad;
struct Partials;

// One task: image pairs [m0, m1) into `sums` ([O][kh][kw][C]) for output channels [o0, o1).
void run_task(const ConvGeometry& g, const Plan& p, const bfloat16* x, const bfloat16* grad,
              int64_t m0, int64_t m1, int64_t o0, int64_t o1, float* sums) {
  const int64_t o_stride = g.kh * g.kw * g.c, width = o1 - o0;
  std::memset(sums + o0 * o_stride, 0, static_cast<std::size_t>(width * o_stride) * sizeof(float));
  const int64_t pair_bytes = (p.hp * p.wp * g.c + g.oh * g.ow * width) * 4;
  const int64_t step = std::clamp<int64_t>(kStageBytes / pair_bytes, 1, m1 - m0);
  uint32_t* xs = thread_scratch<uint32_t, StagedX>(static_cast<std::size_t>(step * p.hp * p.wp * g.c));
  uint32_t* gs =
      thread_scratch<uint32_t, StagedGrad>(static_cast<std::size_t>(step * g.oh * g.ow * width));
  for (int64_t m = m0; m < m1; m += step) {
    const int64_t np = std::min(step, m1 - m);
    stage_x(g, p, x, m, np, xs);
    stage_grad(g, grad, m, np, o0, o1, gs);
    const Piece piece{xs, gs, np, width};
    for (int64_t cb = 0; cb < g.c / kLanes; ++cb)
      for (int64_t ob = 0; ob < width; ob += kTileO)
        for (int64_t i = 0; i < g.kh; ++i)
          tile(g, p, piece, i, cb, ob,
               sums + (o0 + ob) * o_stride + i * g.kw * g.c + cb * kLanes, o_stride);
  }
}

// grad_w[o][c][t] = the chunks' sums at [o][t][c], added in chunk order and rounded.
void finish(const ConvGeometry& g, const Plan& p, const float* partials, bfloat16* grad_w) {
  const int64_t taps = g.kh * g.kw;
  parallel_range(g.o, 8, [&](int64_t begin, int64_t end) {
    alignas(64) uint16_t rounded[kLanes * kMaxRows * kTaps];
    for (int64_t o = begin; o < end; ++o)
      for (int64_t cb = 0; cb < g.c / kLanes; ++cb) {
        for (int64_t t = 0; t < taps; ++t) {
          const float* src = partials + (o * taps + t) * g.c + cb * kLanes;
          __m512 v = _mm512_loadu_ps(src);
          for (int64_t k = 1; k < p.chunks; ++k)
            v = _mm512_add_ps(v, _mm512_loadu_ps(src + k * p.weights));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(rounded + t * kLanes),
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
