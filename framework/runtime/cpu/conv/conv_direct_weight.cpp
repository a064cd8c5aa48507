// The weight gradient of a direct stride-1 conv (conv_direct.cpp has the layout):
//   grad_w[o][c][t] = sum over images and grid positions q of grad_out[o][q] * x[c][q + off_t]
// with grad_out zero in the grid's gap columns. The register tile is 4 output channels x 6
// (channel, tap) pairs, 10 loads per 24 FMAs; positions stay spread over vector lanes until a
// chunk of images is done. Images are split into a fixed number of chunks, each a partial sum,
// added in chunk order, so results do not depend on the thread count.
#include "runtime/cpu/conv/conv_direct.h"

#include "runtime/cpu/kernels_impl.h"

#ifdef __AVX512F__
#include "runtime/cpu/conv/conv_direct_impl.h"
#endif

#include <algorithm>

namespace loom::runtime {

#ifdef __AVX512F__
namespace {

using namespace direct;

constexpr int kTilePairs = 6;  // (channel, tap) pairs per tile
// Output and input channels per sub-block, and the floats of their rows per block of
// positions, so that a sub-block's rows stay in L1 while all of its tiles run over them.
constexpr int64_t kSubChannels = 8;
constexpr int64_t kBlockFloats = 10240;
constexpr int64_t kMinBlockVectors = 4;
// Floats of padded input and grad_out staged per task: some of L2.
constexpr int64_t kStageFloats = 98304;
constexpr int64_t kWeightChunks = 8;

// kTileO output channels x R pairs over grid vectors [v0, v1) of staged images [m0, m1):
// adds g_rows[k][q] * x_rows[r][q] into acc [R][kTileO][kLanes]. Image m's rows start
// m * g_step and m * x_step floats further on.
struct WeightSpan {
  int64_t m0, m1, g_step, x_step, v0, v1;
};

template <int R>
void weight_tile(const float* const* g_rows, const float* const* x_rows, const WeightSpan& s,
                 float* acc) {
  __m512 a[R][kTileO];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < kTileO; ++k) a[r][k] = _mm512_loadu_ps(acc + (r * kTileO + k) * kLanes);
  for (int64_t m = s.m0; m < s.m1; ++m) {
    const float* gm[kTileO];
    const float* xm[R];
    for (int k = 0; k < kTileO; ++k) gm[k] = g_rows[k] + m * s.g_step;
    for (int r = 0; r < R; ++r) xm[r] = x_rows[r] + m * s.x_step;
    for (int64_t q = s.v0 * kLanes; q < s.v1 * kLanes; q += kLanes) {
      __m512 gv[kTileO];
      for (int k = 0; k < kTileO; ++k) {
        gv[k] = _mm512_loadu_ps(gm[k] + q);
        pin(gv[k]);
      }
      for (int r = 0; r < R; ++r) {
        __m512 xv = _mm512_loadu_ps(xm[r] + q);
        pin(xv);
        for (int k = 0; k < kTileO; ++k) a[r][k] = _mm512_fmadd_ps(gv[k], xv, a[r][k]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < kTileO; ++k) _mm512_storeu_ps(acc + (r * kTileO + k) * kLanes, a[r][k]);
}

using WeightTile = void (*)(const float* const*, const float* const*, const WeightSpan&, float*);
constexpr WeightTile kWeightTiles[kTilePairs + 1] = {nullptr,        weight_tile<1>, weight_tile<2>,
                                                     weight_tile<3>, weight_tile<4>, weight_tile<5>,
                                                     weight_tile<6>};

// Sums each of `count` vectors in place: afterwards v[i] (as floats) is the sum of vector i.
// Sixteen at a time go through a tree of shuffles, about 3 instructions per vector instead of
// a full horizontal reduction each.
void sum_vectors(float* v, int64_t count) {
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const float* p = v + i * kLanes;
    __m512 a[8], b[4], c[2];
    for (int j = 0; j < 8; ++j) {
      const __m512 x = _mm512_loadu_ps(p + 2 * j * kLanes);
      const __m512 y = _mm512_loadu_ps(p + (2 * j + 1) * kLanes);
      a[j] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
    }
    for (int j = 0; j < 4; ++j)
      b[j] = _mm512_add_ps(_mm512_shuffle_ps(a[2 * j], a[2 * j + 1], 0x44),
                           _mm512_shuffle_ps(a[2 * j], a[2 * j + 1], 0xEE));
    for (int j = 0; j < 2; ++j)
      c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0x88),
                           _mm512_shuffle_f32x4(b[2 * j], b[2 * j + 1], 0xDD));
    // Written below the vectors read: sums of earlier groups sit before this group's data.
    _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], 0x88),
                                          _mm512_shuffle_f32x4(c[0], c[1], 0xDD)));
  }
  for (; i < count; ++i) v[i] = _mm512_reduce_add_ps(_mm512_loadu_ps(v + i * kLanes));
}

}  // namespace

bool conv2d_grad_weight_direct(const ConvGeometry& g, const float* x, const float* grad_out,
                               float* grad_w, const uint8_t* used) {
  const Flat f = flat_layout(g);
  if (f.ntaps == 0) return false;
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t otiles = ceil_div(og, kTileO), g_rows_total = otiles * kTileO;
  const int64_t vectors = ceil_div(f.q, kLanes), gq = vectors * kLanes;
  const Pairs pairs = make_pairs(cg, f.ntaps, used);
  const int64_t wsize = g.o * cg * f.ntaps;
  const int64_t acc_floats = otiles * pairs.count * kTileO * kLanes;
  const int64_t osub = std::min(og, kSubChannels), csub = std::min(cg, kSubChannels);
  const int64_t sub_tiles = ceil_div(osub, kTileO);
  const int64_t per_chunk = ceil_div(g.n, std::min(g.n, kWeightChunks));
  const int64_t chunks = ceil_div(g.n, per_chunk);
  // Images staged at once (padded input and grad_out), and the blocks the tiles run over: a
  // few whole images when they are small, else vectors of one image.
  const int64_t stage =
      std::clamp<int64_t>(kStageFloats / (cg * f.plane + g_rows_total * gq), 1, per_chunk);
  const int64_t image_floats = (osub + csub) * gq;
  const int64_t block_images = std::max<int64_t>(1, kBlockFloats / image_floats);
  const int64_t block =
      image_floats <= kBlockFloats
          ? vectors
          : std::max(kMinBlockVectors,
                     (kBlockFloats / (osub + csub) - f.tap[f.ntaps - 1]) / kLanes);
  float* partial = scratch<float>(chunks * wsize, Scratch::kPartial);
  parallel_range(chunks * g.groups, 1, [&](int64_t s, int64_t e) {
    float* xp = scratch<float>(cg * stage * f.plane, Scratch::kTaskInput);
    float* gp = scratch<float>(g_rows_total * stage * gq, Scratch::kTaskGrad);
    float* acc = scratch<float>(acc_floats, Scratch::kTaskAcc);
    // Zero padding (input) and gap columns, rows past og and positions past q (grad_out).
    std::fill(xp, xp + cg * stage * f.plane, 0.f);
    std::fill(gp, gp + g_rows_total * stage * gq, 0.f);
    // Where each pair reads in the first staged image.
    const float** x_rows = scratch<const float*>(pairs.count, Scratch::kTaskInput);
    for (int64_t p = 0; p < pairs.count; ++p)
      x_rows[p] = xp + pairs.channel[p] * stage * f.plane + f.origin + f.tap[pairs.tap[p]];
    for (int64_t task = s; task < e; ++task) {
      const int64_t chunk = task / g.groups, grp = task % g.groups;
      std::fill(acc, acc + acc_floats, 0.f);
      const int64_t i_end = std::min(g.n, (chunk + 1) * per_chunk);
      for (int64_t i0 = chunk * per_chunk; i0 < i_end; i0 += stage) {
        const int64_t staged = std::min(stage, i_end - i0);
        for (int64_t m = 0; m < staged; ++m) {
          scatter_rows(x + ((i0 + m) * g.c + grp * cg) * g.h * g.w, cg, g.h, g.w, xp + m * f.plane,
                       stage * f.plane, f.data, f.wp);
          scatter_rows(grad_out + ((i0 + m) * g.o + grp * og) * g.oh * g.ow, og, g.oh, g.ow,
                       gp + m * gq, stage * gq, 0, f.wp);
        }
        for (int64_t ot0 = 0; ot0 < otiles; ot0 += sub_tiles)
          for (int64_t c0 = 0; c0 < cg; c0 += csub)
            for (int64_t m0 = 0; m0 < staged; m0 += block_images)
              for (int64_t v0 = 0; v0 < vectors; v0 += block) {
                const WeightSpan span{m0, std::min(staged, m0 + block_images), gq, f.plane,
                                      v0, std::min(vectors, v0 + block)};
                const int64_t p1 = pairs.start[std::min(cg, c0 + csub)];
                for (int64_t ot = ot0; ot < std::min(otiles, ot0 + sub_tiles); ++ot) {
                  const float* g_rows[kTileO];
                  for (int k = 0; k < kTileO; ++k) g_rows[k] = gp + (ot * kTileO + k) * stage * gq;
                  for (int64_t p0 = pairs.start[c0]; p0 < p1; p0 += kTilePairs)
                    kWeightTiles[std::min<int64_t>(kTilePairs, p1 - p0)](
                        g_rows, x_rows + p0, span, acc + (ot * pairs.count + p0) * kTileO * kLanes);
                }
              }
      }
      sum_vectors(acc, acc_floats / kLanes);
      float* dst = partial + chunk * wsize + grp * og * cg * f.ntaps;
      std::fill(dst, dst + og * cg * f.ntaps, 0.f);  // pairs not summed over
      for (int64_t o = 0; o < og; ++o)
        for (int64_t p = 0; p < pairs.count; ++p)
          dst[(o * cg + pairs.channel[p]) * f.ntaps + pairs.tap[p]] =
              acc[(o / kTileO * pairs.count + p) * kTileO + o % kTileO];
    }
  });
  parallel_range(wsize, kGrainElementwise, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      float sum = partial[i];
      for (int64_t c = 1; c < chunks; ++c) sum += partial[c * wsize + i];
      grad_w[i] = sum;
    }
  });
  return true;
}

#else  // no AVX-512: the callers' general path runs

bool conv2d_grad_weight_direct(const ConvGeometry&, const float*, const float*, float*,
                               const uint8_t*) {
  return false;
}

#endif

}  // namespace loom::runtime
