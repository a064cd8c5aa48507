// Direct stride-1 convolution in float32 with AVX-512, on a padded flat layout (forward here,
// the weight gradient in conv_direct_weight.cpp).
//
// Each input plane is copied once into a zero-padded plane whose rows are W + gap floats
// apart, the gap (max of the left and right padding) shared between neighbouring rows. On
// that grid, output position q = oy*wp + ox reads tap (i, j) at q + i*dh*wp + j*dw + a
// constant, so a tap is a fixed offset and a conv is a sum of shifted planes:
//   forward:  out[o][q]       = sum over (c, t) of w[o][c][t] * x[c][q + off_t]
//   weight:   grad_w[o][c][t] = sum over q of grad_out[o][q] * x[c][q + off_t]
// Grid columns ox >= Wo are padding: the forward computes and drops them (1/(W+1) of the
// work for a 3x3 "same" conv), the weight gradient zeroes grad_out there so they add nothing.
// The forward's register tile is 4 output channels x 96 positions: 24 accumulators, 4
// weight broadcasts and 6 input loads per 24 FMAs.
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

constexpr int kTileVectors = 6;  // vectors of positions per tile

// Where each vector of grid positions goes in the [Ho, Wo] output: the lanes that are real
// outputs (mask) and the output index of the first of them. Real lanes are consecutive in the
// output, since the dropped columns are exactly the row gaps.
struct VectorSlot {
  int64_t out;
  __mmask16 mask;
};

void vector_slots(const ConvGeometry& g, const Flat& f, VectorSlot* slots) {
  for (int64_t v = 0; v * kLanes < f.q; ++v) {
    const int64_t q0 = v * kLanes;
    unsigned mask = 0;
    for (int64_t l = 0; l < kLanes && q0 + l < f.q; ++l)
      if ((q0 + l) % f.wp < g.ow) mask |= 1u << l;
    slots[v] = {q0 / f.wp * g.ow + std::min(q0 % f.wp, g.ow), static_cast<__mmask16>(mask)};
  }
}

inline void store_slot(float* out, const VectorSlot& s, __m512 v) {
  if (s.mask == 0xFFFF) return _mm512_storeu_ps(out + s.out, v);
  const auto n = static_cast<unsigned>(__builtin_popcount(s.mask));
  _mm512_mask_storeu_ps(out + s.out, static_cast<__mmask16>((1u << n) - 1),
                        _mm512_maskz_compress_ps(s.mask, v));
}

// kTileO output channels x V vectors of positions from grid vector v0. `x` is the image's
// first padded plane at the origin; pair p reads x + offset[p] and weighs by w[p][kTileO].
template <int V>
void forward_tile(const float* x, const int64_t* offset, int64_t pairs, const float* w, int64_t v0,
                  const VectorSlot* slots, float* const* out_rows) {
  __m512 acc[kTileO][V];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const float* xq = x + v0 * kLanes;
  for (int64_t p = 0; p < pairs; ++p, w += kTileO) {
    const float* src = xq + offset[p];
    __m512 wv[kTileO];
    for (int k = 0; k < kTileO; ++k) wv[k] = _mm512_set1_ps(w[k]);
    for (int v = 0; v < V; ++v) {
      __m512 xv = _mm512_loadu_ps(src + v * kLanes);
      pin(xv);
      for (int k = 0; k < kTileO; ++k) acc[k][v] = _mm512_fmadd_ps(wv[k], xv, acc[k][v]);
    }
  }
  for (int k = 0; k < kTileO; ++k)
    if (out_rows[k])
      for (int v = 0; v < V; ++v) store_slot(out_rows[k], slots[v0 + v], acc[k][v]);
}

using ForwardTile = void (*)(const float*, const int64_t*, int64_t, const float*, int64_t,
                             const VectorSlot*, float* const*);
constexpr ForwardTile kForwardTiles[kTileVectors + 1] = {
    nullptr,         forward_tile<1>, forward_tile<2>, forward_tile<3>,
    forward_tile<4>, forward_tile<5>, forward_tile<6>};

}  // namespace

bool direct_applies(const ConvGeometry& g) {
  return flat_layout(g).ntaps > 0;
}

bool conv2d_direct(const ConvGeometry& g, const float* x, const float* w, float* out,
                   const uint8_t* used) {
  const Flat f = flat_layout(g);
  if (f.ntaps == 0) return false;
  const int64_t cg = g.c / g.groups, og = g.o / g.groups;
  const int64_t otiles = ceil_div(og, kTileO), vectors = ceil_div(f.q, kLanes);
  const Pairs pairs = make_pairs(cg, f.ntaps, used);
  const int64_t tile_floats = pairs.count * kTileO;
  // Per pair, its offset in the padded planes; per (group, tile of output channels), the
  // weights as [pair][kTileO], zero past og.
  auto* offset = scratch<int64_t>(pairs.count, Scratch::kWeights);
  for (int64_t p = 0; p < pairs.count; ++p)
    offset[p] = pairs.channel[p] * f.plane + f.tap[pairs.tap[p]];
  float* packed = scratch<float>(g.groups * otiles * tile_floats, Scratch::kPacked);
  for (int64_t grp = 0; grp < g.groups; ++grp)
    for (int64_t ot = 0; ot < otiles; ++ot)
      for (int64_t p = 0; p < pairs.count; ++p)
        for (int64_t k = 0; k < kTileO; ++k) {
          const int64_t o = ot * kTileO + k;
          packed[(grp * otiles + ot) * tile_floats + p * kTileO + k] =
              o < og ? w[((grp * og + o) * cg + pairs.channel[p]) * f.ntaps + pairs.tap[p]] : 0.f;
        }
  auto* slots = scratch<VectorSlot>(vectors, Scratch::kPacked);
  vector_slots(g, f, slots);
  const int64_t out_plane = g.oh * g.ow;
  parallel_range(g.n * g.groups, 1, [&](int64_t s, int64_t e) {
    float* xp = scratch<float>(cg * f.plane, Scratch::kTaskInput);
    std::fill(xp, xp + cg * f.plane, 0.f);
    for (int64_t task = s; task < e; ++task) {
      const int64_t img = task / g.groups, grp = task % g.groups;
      scatter_rows(x + (img * g.c + grp * cg) * g.h * g.w, cg, g.h, g.w, xp, f.plane, f.data, f.wp);
      float* o_img = out + (img * g.o + grp * og) * out_plane;
      // Blocks of positions outermost, so a block's input rows stay in cache for every tile.
      for (int64_t v0 = 0; v0 < vectors; v0 += kTileVectors) {
        const int64_t nv = std::min<int64_t>(kTileVectors, vectors - v0);
        for (int64_t ot = 0; ot < otiles; ++ot) {
          float* rows[kTileO];
          for (int k = 0; k < kTileO; ++k) {
            const int64_t o = ot * kTileO + k;
            rows[k] = o < og ? o_img + o * out_plane : nullptr;
          }
          kForwardTiles[nv](xp + f.origin, offset, pairs.count,
                            packed + (grp * otiles + ot) * tile_floats, v0, slots, rows);
        }
      }
    }
  });
  return true;
}

#else  // no AVX-512: the callers' general path runs

bool direct_applies(const ConvGeometry&) {
  return false;
}
bool conv2d_direct(const ConvGeometry&, const float*, const float*, float*, const uint8_t*) {
  return false;
}

#endif

}  // namespace loom::runtime
