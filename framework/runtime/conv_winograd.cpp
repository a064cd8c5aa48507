// Winograd F(2x2, 3x3) (Lavin & Gray 2016): a 2x2 output tile of a 3x3 conv reads a 4x4 input
// tile d, and
//   Y = A^T [ (G g G^T) . (B^T d B) ] A       (. elementwise, 16 products)
// with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; h h h; h -h h; 0 0 1]
// (h = 1/2) and A^T = [1 1 1 0; 0 1 -1 -1]. Summed over input channels, the 16 elementwise
// products become 16 GEMMs, one per position xi of the 4x4 tile:
//   forward:  M_xi [O, tiles] = U_xi [O, C] * V_xi [C, tiles],  U = G g G^T, V = B^T d B
//   weight:   dU_xi [O, C] = dM_xi [O, tiles] * V_xi^T,          dM = A dY A^T, dg = G^T dU G
// Tiles go in blocks of whole tile rows (images side by side), each block transformed, run
// through the 16 GEMMs and transformed back while it is in cache. The transforms run along a
// row of tiles, so the compiler vectorises them across tiles.
#include "runtime/conv_winograd.h"

#include "runtime/kernels_impl.h"

#include <Eigen/Core>

#include <algorithm>

namespace loom::runtime {
namespace {

constexpr int64_t kXi = 16;  // positions in a 4x4 tile
// Tiles per block: the forward's transformed input and output for a block should stay in
// L2, and the GEMMs should be wide enough that packing U_xi (O x C, once per block) costs
// little next to the multiplies.
constexpr int64_t kBlockFloats = 1 << 18;
constexpr int64_t kMinBlockTiles = 32;
// The weight gradient's tasks: blocks of input channels, then chunks of tile rows, each
// chunk a partial sum of 16*O*C floats (at most kMaxPartialFloats in all) added in chunk
// order. A fixed number, not the thread count, so the result is the same on any machine.
constexpr int64_t kWeightTasks = 8;
constexpr int64_t kMinWeightChannels = 64;
constexpr int64_t kMaxPartialFloats = int64_t{1} << 24;

// c [m, n] (= or +=) a [m, k] * b, b stored [k, n] or, when tb, [n, k]; rows of each are their
// width apart unless given.
void multiply(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
              bool tb, float* c, bool accumulate) {
  using Stride = Eigen::OuterStride<>;
  const ConstStridedMap<float> am(a, m, k, Stride(lda));
  Map<float> cm(c, m, n);
  if (tb) {
    const ConstMap<float> bm(b, n, k);
    if (accumulate) cm.noalias() += am * bm.transpose();
    else cm.noalias() = am * bm.transpose();
  } else {
    const ConstMap<float> bm(b, k, n);
    if (accumulate) cm.noalias() += am * bm;
    else cm.noalias() = am * bm;
  }
}

struct Tiling {
  int64_t th, tw;         // tiles per image along y and x
  int64_t width;          // padded input row: 2*tw + 2 columns from -pw
  int64_t rows;           // tile rows in all: n * th
  int64_t rows_per_block;
};

Tiling tiling(const ConvGeometry& g, int64_t floats_per_tile) {
  Tiling t;
  t.th = ceil_div(g.oh, 2);
  t.tw = ceil_div(g.ow, 2);
  t.width = 2 * t.tw + 2;
  t.rows = g.n * t.th;
  const int64_t tiles = std::max(kMinBlockTiles, kBlockFloats / std::max<int64_t>(1, floats_per_tile));
  t.rows_per_block = std::clamp<int64_t>(tiles / t.tw, 1, t.rows);
  return t;
}

// Input rows y0 .. y0+3 of a plane [h, w], columns -pw .. width-pw-1, zero outside the plane.
void load_rows(const float* plane, int64_t h, int64_t w, int64_t y0, int64_t pw, int64_t width,
               float* rows) {
  const int64_t lo = std::min(pw, width), hi = std::clamp(w + pw, lo, width);
  for (int64_t k = 0; k < 4; ++k) {
    float* r = rows + k * width;
    const int64_t y = y0 + k;
    if (y < 0 || y >= h) {
      std::fill(r, r + width, 0.f);
      continue;
    }
    std::fill(r, r + lo, 0.f);
    std::copy(plane + y * w + (lo - pw), plane + y * w + (hi - pw), r + lo);
    std::fill(r + hi, r + width, 0.f);
  }
}

// V = B^T d B for the tw tiles of a row of tiles, whose 4x4 inputs are columns 2t .. 2t+3 of
// `rows` (4 rows, `width` apart): V_xi of tile t goes to v[xi * stride + t].
void input_transform(const float* __restrict rows, int64_t width, int64_t tw,
                     float* __restrict v, int64_t stride) {
  const float* r0 = rows;
  const float* r1 = rows + width;
  const float* r2 = rows + 2 * width;
  const float* r3 = rows + 3 * width;
  for (int64_t t = 0; t < tw; ++t) {
    float u[4][4];
    for (int j = 0; j < 4; ++j) {
      const float d0 = r0[2 * t + j], d1 = r1[2 * t + j], d2 = r2[2 * t + j], d3 = r3[2 * t + j];
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
}

// Y = A^T M A for the tw tiles of a row of tiles, M_xi of tile t at m[xi * stride + t]: the
// two output rows, 2*tw columns each.
void output_transform(const float* __restrict m, int64_t stride, int64_t tw, float* __restrict y0,
                      float* __restrict y1) {
  for (int64_t t = 0; t < tw; ++t) {
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
}

// dM = A dY A^T for the tw tiles of a row of tiles, dY the two grad_out rows g0, g1 (2*tw
// columns, zero past the output): dM_xi of tile t goes to dm[xi * stride + t].
void grad_output_transform(const float* __restrict g0, const float* __restrict g1, int64_t tw,
                           float* __restrict dm, int64_t stride) {
  for (int64_t t = 0; t < tw; ++t) {
    const float a = g0[2 * t], b = g0[2 * t + 1], c = g1[2 * t], d = g1[2 * t + 1];
    // Rows of A dY: (a, b), (a + c, b + d), (a - c, b - d), (-c, -d); then each row (p, q)
    // times A^T: (p, p + q, p - q, -q).
    const float p[4] = {a, a + c, a - c, -c}, q[4] = {b, b + d, b - d, -d};
    for (int i = 0; i < 4; ++i) {
      dm[(4 * i + 0) * stride + t] = p[i];
      dm[(4 * i + 1) * stride + t] = p[i] + q[i];
      dm[(4 * i + 2) * stride + t] = p[i] - q[i];
      dm[(4 * i + 3) * stride + t] = -q[i];
    }
  }
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

// V [16][cn][tiles] for input channels [c0, c0+cn) of tile rows [r0, r1); `rows` holds 4
// padded input rows.
void transform_inputs(const ConvGeometry& g, const Tiling& t, const float* x, int64_t c0,
                      int64_t cn, int64_t r0, int64_t r1, float* v, float* rows) {
  const int64_t tiles = (r1 - r0) * t.tw;
  for (int64_t c = 0; c < cn; ++c)
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t img = r / t.th, ty = r % t.th;
      load_rows(x + (img * g.c + c0 + c) * g.h * g.w, g.h, g.w, 2 * ty - g.ph, g.pw, t.width,
                rows);
      input_transform(rows, t.width, t.tw, v + c * tiles + (r - r0) * t.tw, cn * tiles);
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
  const Tiling t = tiling(g, kXi * (nc + no));
  float* u = scratch<float>(kXi * no * nc, Scratch::kPacked);  // [16][O][C]
  parallel_range(no * nc, 1024, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) weight_transform(w + i * 9, u + i, no * nc);
  });
  const int64_t blocks = ceil_div(t.rows, t.rows_per_block);
  const int64_t max_tiles = t.rows_per_block * t.tw;
  const int64_t plane = g.oh * g.ow;
  parallel_range(blocks, 1, [&](int64_t s, int64_t e) {
    float* v = scratch<float>(kXi * nc * max_tiles + 4 * t.width, Scratch::kTaskInput);
    float* rows = v + kXi * nc * max_tiles;
    float* m = scratch<float>(kXi * no * max_tiles + 4 * t.tw, Scratch::kTaskAcc);
    float* y0 = m + kXi * no * max_tiles;
    float* y1 = y0 + 2 * t.tw;
    for (int64_t b = s; b < e; ++b) {
      const int64_t r0 = b * t.rows_per_block, r1 = std::min(t.rows, r0 + t.rows_per_block);
      const int64_t tiles = (r1 - r0) * t.tw;
      transform_inputs(g, t, x, 0, nc, r0, r1, v, rows);
      for (int64_t xi = 0; xi < kXi; ++xi)
        multiply(no, tiles, nc, u + xi * no * nc, nc, v + xi * nc * tiles, false,
                 m + xi * no * tiles, false);
      for (int64_t o = 0; o < no; ++o)
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t img = r / t.th, ty = r % t.th;
          output_transform(m + o * tiles + (r - r0) * t.tw, no * tiles, t.tw, y0, y1);
          float* dst = out + (img * no + o) * plane + 2 * ty * g.ow;
          std::copy(y0, y0 + g.ow, dst);
          if (2 * ty + 1 < g.oh) std::copy(y1, y1 + g.ow, dst + g.ow);
        }
    }
  });
  return true;
}

bool conv2d_grad_weight_winograd(const ConvGeometry& g, const float* x, const float* grad_out,
                                 float* grad_w) {
  if (!winograd_applies(g)) return false;
  const int64_t nc = g.c, no = g.o;
  // Blocks of input channels first (each task transforms grad_out again, a small cost next
  // to its GEMMs where blocks are wide), then chunks of tile rows.
  const int64_t cblocks = std::clamp<int64_t>(nc / kMinWeightChannels, 1, kWeightTasks);
  const int64_t cpb = ceil_div(nc, cblocks);
  const Tiling t = tiling(g, kXi * (cpb + no));
  const int64_t wsize = kXi * no * nc;
  int64_t chunks = std::clamp<int64_t>(ceil_div(kWeightTasks, cblocks), 1,
                                       std::max<int64_t>(1, kMaxPartialFloats / wsize));
  chunks = std::min(chunks, t.rows);
  const int64_t rows_per_chunk = ceil_div(t.rows, chunks);
  chunks = ceil_div(t.rows, rows_per_chunk);
  const int64_t max_tiles = std::min(t.rows_per_block, rows_per_chunk) * t.tw;
  float* partial = scratch<float>(chunks * wsize, Scratch::kPartial);  // [chunk][16][O][C]
  const int64_t plane = g.oh * g.ow;
  parallel_range(chunks * cblocks, 1, [&](int64_t s, int64_t e) {
    float* v = scratch<float>(kXi * cpb * max_tiles + 4 * t.width, Scratch::kTaskInput);
    float* rows = v + kXi * cpb * max_tiles;
    float* dm = scratch<float>(kXi * no * max_tiles + 4 * t.tw, Scratch::kTaskGrad);
    float* g0 = dm + kXi * no * max_tiles;
    float* g1 = g0 + 2 * t.tw;
    float* acc = scratch<float>(kXi * no * cpb, Scratch::kTaskAcc);  // [16][O][cn]
    std::fill(g0, g0 + 4 * t.tw, 0.f);  // columns past the output stay zero
    for (int64_t task = s; task < e; ++task) {
      const int64_t chunk = task / cblocks, c0 = (task % cblocks) * cpb;
      const int64_t cn = std::min(cpb, nc - c0);
      const int64_t first = chunk * rows_per_chunk, last = std::min(t.rows, first + rows_per_chunk);
      for (int64_t r0 = first; r0 < last; r0 += t.rows_per_block) {
        const int64_t r1 = std::min(last, r0 + t.rows_per_block);
        const int64_t tiles = (r1 - r0) * t.tw;
        transform_inputs(g, t, x, c0, cn, r0, r1, v, rows);
        for (int64_t o = 0; o < no; ++o)
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t img = r / t.th, ty = r % t.th;
            const float* src = grad_out + (img * no + o) * plane + 2 * ty * g.ow;
            std::copy(src, src + g.ow, g0);
            if (2 * ty + 1 < g.oh) std::copy(src + g.ow, src + 2 * g.ow, g1);
            else std::fill(g1, g1 + g.ow, 0.f);
            grad_output_transform(g0, g1, t.tw, dm + o * tiles + (r - r0) * t.tw, no * tiles);
          }
        for (int64_t xi = 0; xi < kXi; ++xi)
          multiply(no, cn, tiles, dm + xi * no * tiles, tiles, v + xi * cn * tiles, true,
                   acc + xi * no * cn, r0 != first);
      }
      float* dst = partial + chunk * wsize;
      for (int64_t xi = 0; xi < kXi; ++xi)
        for (int64_t o = 0; o < no; ++o)
          std::copy(acc + (xi * no + o) * cn, acc + (xi * no + o + 1) * cn,
                    dst + (xi * no + o) * nc + c0);
    }
  });
  parallel_range(no * nc, 1024, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      float du[kXi];
      for (int64_t xi = 0; xi < kXi; ++xi) {
        float sum = partial[xi * no * nc + i];
        for (int64_t k = 1; k < chunks; ++k) sum += partial[k * wsize + xi * no * nc + i];
        du[xi] = sum;
      }
      weight_grad_transform(du, 1, grad_w + i * 9);
    }
  });
  return true;
}

}  // namespace loom::runtime
