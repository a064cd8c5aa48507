// Private to loom's channels-last Winograd kernels (conv_winograd_bf16.cpp on AVX512_BF16,
// conv_winograd_f32.cpp on AVX2): the conv both passes run as a forward conv, its output tiles
// (2x2, or 4x4 for F(4x4, 3x3)), and the F(2x2, 3x3) and F(4x4, 3x3) transforms (Lavin & Gray
// 2016), written once over a vector type V and its arithmetic `Ops` (static add, sub, mul,
// set1), so each kernel instantiates them with its own registers:
//
//   struct Avx2 { static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); } ... };
//   winograd::input_transform<Avx2>(d);   // d: the 16 vectors of a 4x4 tile, in place
#pragma once

#include "runtime/cpu/conv/conv_common.h"

#include <algorithm>
#include <cstdint>

namespace loom::runtime::winograd {

// Positions in the input tile of F(m x m, 3x3).
constexpr int64_t xi_of(int64_t m) { return (m + 2) * (m + 2); }

inline constexpr int64_t kXi = xi_of(2);   // positions in a 4x4 tile: F(2x2, 3x3)
inline constexpr int64_t kXi4 = xi_of(4);  // positions in a 6x6 tile: F(4x4, 3x3)

// The conv both passes run: the forward conv itself, or the input gradient's (of grad_out,
// with the kernel flipped, its channels swapped and the padding 2 - p).
struct Conv {
  int64_t n, ci, h, w;    // input [n, h, w, ci]
  int64_t co, oh, ow;     // output [n, oh, ow, co]
  int64_t ph, pw;         // padding
  int64_t m;              // output tile side: 2 or 4
  int64_t th, tw, tiles;  // m x m output tiles down, across and in all
  // Weight (output channel k, input channel c, tap t = 3i + j) at w[k * k_step + c * c_step +
  // t], or at tap 8 - t when flipped.
  int64_t k_step, c_step;
  bool flip;
  int64_t block;  // tiles per task: each kernel sets it for its buffers
};

inline Conv conv_of(const ConvGeometry& g, ConvPass pass, int64_t m = 2) {
  Conv v;
  v.n = g.n;
  if (pass == ConvPass::kForward) {
    v.ci = g.c, v.h = g.h, v.w = g.w, v.co = g.o, v.oh = g.oh, v.ow = g.ow, v.ph = g.ph;
    v.pw = g.pw, v.k_step = g.c * 9, v.c_step = 9, v.flip = false;
  } else {
    v.ci = g.o, v.h = g.oh, v.w = g.ow, v.co = g.c, v.oh = g.h, v.ow = g.w, v.ph = 2 - g.ph;
    v.pw = 2 - g.pw, v.k_step = 9, v.c_step = g.c * 9, v.flip = true;
  }
  v.m = m;
  v.th = (v.oh + m - 1) / m;
  v.tw = (v.ow + m - 1) / m;
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
  return {t / per_image, r / v.tw * v.m, r % v.tw * v.m};
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

// ---- F(4x4, 3x3): 6x6 input tiles, 36 products for 16 outputs (points 0, +-1, +-2) ----

// u = G g G^T: the 6x6 transformed kernel from its 9 taps g[3 i + j], G = [1/4 0 0; -1/6 -1/6
// -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1].
template <class Ops, class V>
inline void transform_kernel4(const V g[9], V u[kXi4]) {
  const auto column = [](V a, V b, V c, V r[6]) {
    const V sixth = Ops::set1(1.0f / 6), minus_sixth = Ops::set1(-1.0f / 6);
    const V outer = Ops::add(a, c), near = Ops::add(Ops::mul(Ops::set1(0.25f), a), c);
    const V half_b = Ops::mul(Ops::set1(0.5f), b);
    r[0] = Ops::mul(Ops::set1(0.25f), a);
    r[1] = Ops::mul(minus_sixth, Ops::add(outer, b));
    r[2] = Ops::mul(minus_sixth, Ops::sub(outer, b));
    r[3] = Ops::mul(sixth, Ops::add(near, half_b));
    r[4] = Ops::mul(sixth, Ops::sub(near, half_b));
    r[5] = c;
  };
  V t[3][6];  // (G g)^T: t[j][i]
  for (int j = 0; j < 3; ++j) column(g[j], g[3 + j], g[6 + j], t[j]);
  for (int i = 0; i < 6; ++i) {  // (G g) G^T
    V r[6];
    column(t[0][i], t[1][i], t[2][i], r);
    for (int j = 0; j < 6; ++j) u[6 * i + j] = r[j];
  }
}

// r = B^T x for six vectors, B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0;
// 0 2 -1 -2 1 0; 0 4 0 -5 0 1]; x and r may be the same vectors.
template <class Ops, class V>
inline void input_column4(V x0, V x1, V x2, V x3, V x4, V x5, V* r0, V* r1, V* r2, V* r3, V* r4,
                          V* r5) {
  const V four = Ops::set1(4.0f), five = Ops::set1(5.0f);
  const V t1 = Ops::sub(x4, Ops::mul(four, x2)), t2 = Ops::sub(x3, Ops::mul(four, x1));
  const V t3 = Ops::sub(x4, x2), t4 = Ops::mul(Ops::set1(2.0f), Ops::sub(x3, x1));
  *r0 = Ops::add(Ops::sub(Ops::mul(four, x0), Ops::mul(five, x2)), x4);
  *r1 = Ops::add(t1, t2);
  *r2 = Ops::sub(t1, t2);
  *r3 = Ops::add(t3, t4);
  *r4 = Ops::sub(t3, t4);
  *r5 = Ops::add(Ops::sub(Ops::mul(four, x1), Ops::mul(five, x3)), x5);
}

// B^T d B for a 6x6 tile: d[6 i + j] = load(i, j), and store(6 i + j, result). Each column's
// loads go straight into its transform and each result straight to its store, so only the 36
// intermediate vectors pass through memory (AVX2 has 16 registers). Filling an array of the
// 36 inputs first and transforming it in place stored each vector twice as often: the stores
// had bound the AVX2 input transform (kernel_bench's F(4x4) passes at 16 to 64 channels, old
// and new alternated call by call in one process: 2-17% faster a pass this way).
//
// Columns of B^T d depend on the input column alone, so a tile 4 columns right of the last
// one shares its first two with that tile's last two: `cols` keeps them, a ring of 8
// columns indexed by the input column modulo 8 (`base`, a multiple of 4, is the tile's first
// column there), and only columns `first` to 5 are computed: 2 for the tile right of the last
// one, 0 for any other: either way the same arithmetic on the same inputs.
template <class Ops, class V, class Load, class Store>
inline void input_transform4(Load load, Store store, V (*cols)[6], int base, int first) {
  for (int j = first; j < 6; ++j) {  // B^T d
    V* t = cols[(base + j) & 7];
    input_column4<Ops>(load(0, j), load(1, j), load(2, j), load(3, j), load(4, j), load(5, j),
                       &t[0], &t[1], &t[2], &t[3], &t[4], &t[5]);
  }
  const V* t[6];
  for (int j = 0; j < 6; ++j) t[j] = cols[(base + j) & 7];
  for (int i = 0; i < 6; ++i) {  // (B^T d) B
    V r[6];
    input_column4<Ops>(t[0][i], t[1][i], t[2][i], t[3][i], t[4][i], t[5][i], &r[0], &r[1],
                       &r[2], &r[3], &r[4], &r[5]);
    for (int j = 0; j < 6; ++j) store(6 * i + j, r[j]);
  }
}

// y = A^T x for six vectors, A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1].
template <class Ops, class V>
inline void output_column4(V x0, V x1, V x2, V x3, V x4, V x5, V y[4]) {
  const V a = Ops::add(x1, x2), b = Ops::sub(x1, x2), c = Ops::add(x3, x4), d = Ops::sub(x3, x4);
  y[0] = Ops::add(Ops::add(x0, a), c);
  y[1] = Ops::add(b, Ops::mul(Ops::set1(2.0f), d));
  y[2] = Ops::add(a, Ops::mul(Ops::set1(4.0f), c));
  y[3] = Ops::add(Ops::add(b, Ops::mul(Ops::set1(8.0f), d)), x5);
}

// y = A^T M A: the 4x4 outputs y[i][j] of a tile from its 36 products, m(xi) giving M_xi.
template <class Ops, class V, class M>
inline void output_transform4(M m, V y[4][4]) {
  V s[6][4];  // (A^T M)^T: s[j][i]
  for (int j = 0; j < 6; ++j)  // A^T M
    output_column4<Ops>(m(j), m(6 + j), m(12 + j), m(18 + j), m(24 + j), m(30 + j), s[j]);
  for (int i = 0; i < 4; ++i)  // (A^T M) A
    output_column4<Ops>(s[0][i], s[1][i], s[2][i], s[3][i], s[4][i], s[5][i], y[i]);
}

// The output transform of tiles [t0, t0 + nt) of F(T x T, 3x3), vectors of `lanes` output
// channels at offsets q in [0, width) from output channel k0: y = A^T M A with M_xi from m(tile,
// q, xi) (the tile counted from t0), then store(at, q, y) for each of the tile's outputs inside
// the plane, at the element offset `at` of its output channel k0 + q in the output [N, Ho, Wo,
// O].
template <class Ops, class V, int T = 2, class M, class Store>
void output_tiles(const Conv& v, int64_t t0, int64_t nt, int64_t k0, int64_t width,
                  int64_t lanes, M m, Store store) {
  static_assert(T == 2 || T == 4, "F(2x2, 3x3) or F(4x4, 3x3)");
  for (int64_t tl = 0; tl < nt; ++tl) {
    const TileAt at = tile_at(v, t0 + tl);
    const int64_t rows = std::min<int64_t>(T, v.oh - at.y);
    const int64_t cols = std::min<int64_t>(T, v.ow - at.x);
    const int64_t first = ((at.n * v.oh + at.y) * v.ow + at.x) * v.co + k0;
    for (int64_t q = 0; q < width; q += lanes) {
      V y[T][T];
      const auto mq = [&](int64_t xi) { return m(tl, q, xi); };
      if constexpr (T == 2) output_transform<Ops>(mq, y);
      else output_transform4<Ops>(mq, y);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t row = first + i * v.ow * v.co + q;
        for (int64_t j = 0; j < cols; ++j) store(row + j * v.co, q, y[i][j]);
      }
    }
  }
}

}  // namespace loom::runtime::winograd
