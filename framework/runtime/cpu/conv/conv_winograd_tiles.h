// Private to loom's channels-last Winograd kernels (conv_winograd_bf16.cpp on AVX512_BF16,
// conv_winograd_f32.cpp on AVX2): the conv both passes run as a forward conv, its 2x2 output
// tiles, and the F(2x2, 3x3) transforms (Lavin & Gray 2016), written once over a vector type V
// and its arithmetic `Ops` (static add, sub, mul, set1), so each kernel instantiates them with
// its own registers:
//
//   struct Avx2 { static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); } ... };
//   winograd::input_transform<Avx2>(d);   // d: the 16 vectors of a 4x4 tile, in place
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <cstdint>

namespace loom::runtime::winograd {

inline constexpr int64_t kXi = 16;  // positions in a 4x4 tile

// The conv both passes run: the forward conv itself, or the input gradient's (of grad_out,
// with the kernel flipped, its channels swapped and the padding 2 - p).
struct Conv {
  int64_t n, ci, h, w;    // input [n, h, w, ci]
  int64_t co, oh, ow;     // output [n, oh, ow, co]
  int64_t ph, pw;         // padding
  int64_t th, tw, tiles;  // 2x2 output tiles down, across and in all
  // Weight (output channel k, input channel c, tap t = 3i + j) at w[k * k_step + c * c_step +
  // t], or at tap 8 - t when flipped.
  int64_t k_step, c_step;
  bool flip;
  int64_t block;  // tiles per task: each kernel sets it for its buffers
};

inline Conv conv_of(const ConvGeometry& g, ConvPass pass) {
  Conv v;
  v.n = g.n;
  if (pass == ConvPass::kForward) {
    v.ci = g.c, v.h = g.h, v.w = g.w, v.co = g.o, v.oh = g.oh, v.ow = g.ow, v.ph = g.ph;
    v.pw = g.pw, v.k_step = g.c * 9, v.c_step = 9, v.flip = false;
  } else {
    v.ci = g.o, v.h = g.oh, v.w = g.ow, v.co = g.c, v.oh = g.h, v.ow = g.w, v.ph = 2 - g.ph;
    v.pw = 2 - g.pw, v.k_step = 9, v.c_step = g.c * 9, v.flip = true;
  }
  v.th = (v.oh + 1) / 2;
  v.tw = (v.ow + 1) / 2;
  v.tiles = v.n * v.th * v.tw;
  v.block = 0;
  return v;
}

struct TileAt {
  int64_t n, y, x;  // image, top-left output position
};

// Tile t, numbered along the tile rows of each image in turn.
inline TileAt tile_at(const Conv& v, int64_t t) {
  const int64_t per_image = v.th * v.tw, r = t % per_image;
  return {t / per_image, r / v.tw * 2, r % v.tw * 2};
}

// u = G g G^T: the 4x4 transformed kernel from its 9 taps g[3 i + j].
template <class Ops, class V>
inline void transform_kernel(const V g[9], V u[kXi]) {
  const V half = Ops::set1(0.5f);
  V t[4][3];  // G g
  for (int j = 0; j < 3; ++j) {
    const V outer = Ops::add(g[j], g[6 + j]);
    t[0][j] = g[j];
    t[1][j] = Ops::mul(half, Ops::add(outer, g[3 + j]));
    t[2][j] = Ops::mul(half, Ops::sub(outer, g[3 + j]));
    t[3][j] = g[6 + j];
  }
  for (int i = 0; i < 4; ++i) {  // (G g) G^T
    const V outer = Ops::add(t[i][0], t[i][2]);
    u[i * 4 + 0] = t[i][0];
    u[i * 4 + 1] = Ops::mul(half, Ops::add(outer, t[i][1]));
    u[i * 4 + 2] = Ops::mul(half, Ops::sub(outer, t[i][1]));
    u[i * 4 + 3] = t[i][2];
  }
}

// d = B^T d B, in place, for the 4x4 vectors d[4 i + j].
template <class Ops, class V>
inline void input_transform(V d[kXi]) {
  for (int j = 0; j < 4; ++j) {  // B^T d
    const V d0 = d[j], d1 = d[4 + j], d2 = d[8 + j], d3 = d[12 + j];
    d[j] = Ops::sub(d0, d2);
    d[4 + j] = Ops::add(d1, d2);
    d[8 + j] = Ops::sub(d2, d1);
    d[12 + j] = Ops::sub(d1, d3);
  }
  for (int i = 0; i < 4; ++i) {  // (B^T d) B
    V* r = d + 4 * i;
    const V r0 = r[0], r1 = r[1], r2 = r[2], r3 = r[3];
    r[0] = Ops::sub(r0, r2);
    r[1] = Ops::add(r1, r2);
    r[2] = Ops::sub(r2, r1);
    r[3] = Ops::sub(r1, r3);
  }
}

// y = A^T M A: the 2x2 outputs y[i][j] of a tile from its 16 products, m(xi) giving M_xi.
template <class Ops, class V, class M>
inline void output_transform(M m, V y[2][2]) {
  V s[2][4];  // A^T M
  for (int j = 0; j < 4; ++j) {
    const V m0 = m(j), m1 = m(4 + j), m2 = m(8 + j), m3 = m(12 + j);
    s[0][j] = Ops::add(Ops::add(m0, m1), m2);
    s[1][j] = Ops::sub(Ops::sub(m1, m2), m3);
  }
  for (int i = 0; i < 2; ++i) {  // (A^T M) A
    y[i][0] = Ops::add(Ops::add(s[i][0], s[i][1]), s[i][2]);
    y[i][1] = Ops::sub(Ops::sub(s[i][1], s[i][2]), s[i][3]);
  }
}

// The output transform of tiles [t0, t0 + nt), vectors of `lanes` output channels at offsets q
// in [0, width) from output channel k0: y = A^T M A with M_xi from m(tile, q, xi) (the tile
// counted from t0), then store(at, q, y) for each of the tile's outputs inside the plane, at
// the element offset `at` of its output channel k0 + q in the output [N, Ho, Wo, O].
template <class Ops, class V, class M, class Store>
void output_tiles(const Conv& v, int64_t t0, int64_t nt, int64_t k0, int64_t width,
                  int64_t lanes, M m, Store store) {
  for (int64_t tl = 0; tl < nt; ++tl) {
    const TileAt at = tile_at(v, t0 + tl);
    const bool down = at.y + 1 < v.oh, across = at.x + 1 < v.ow;
    const int64_t first = ((at.n * v.oh + at.y) * v.ow + at.x) * v.co + k0;
    for (int64_t q = 0; q < width; q += lanes) {
      V y[2][2];
      output_transform<Ops>([&](int64_t xi) { return m(tl, q, xi); }, y);
      for (int i = 0; i < (down ? 2 : 1); ++i) {
        const int64_t row = first + i * v.ow * v.co + q;
        store(row, q, y[i][0]);
        if (across) store(row + v.co, q, y[i][1]);
      }
    }
  }
}

}  // namespace loom::runtime::winograd
