// Winograd F(T x T, 3x3), T = 4 or 2, on float32 channels-last activations with AVX2 and FMA
// (conv_winograd_f32.h), laid out as conv_winograd_bf16.cpp (Lavin & Gray 2016), for P =
// (T + 2)^2 transformed positions xi (36 or 16):
//   Y = A^T [ (G g G^T) . (B^T d B) ] A,   summed over input channels: P GEMMs per tile
//   M_xi [tiles, O] = V_xi [tiles, C] * U_xi [C, O],   V = B^T d B,  U = G g G^T
//   U [P][C][O]: the kernel transformed once per call, shared by every task.
//   V [P][block][C]: a block of tiles' transformed input, in a per-thread buffer.
//   M [P][block][64]: the block's GEMM results for 64 output channels at a time, transformed
//     back (+ bias, relu) and stored before the next 64.
// With fewer tiles than output channels the tasks are chunks of output channels instead
// (run_by_chunks). A register tile is R tiles x Q vectors of 8 output channels (R <= 6, Q <= 2:
// 12 sums, Q loads and one broadcast at a time in AVX2's 16 registers), over slices of up to
// 256 input channels (gemm). The weight gradient (F(3x3, T x T), below) reuses the input
// transform and the register tile. Each function taking T is instantiated for both sizes; the
// transforms' arithmetic is in conv_winograd_tiles.h (T = 4's weight gradient's own below).
#include "runtime/cpu/conv/conv_winograd_f32.h"

#include "runtime/cpu/conv/conv_winograd_tiles.h"
#include "runtime/cpu/kernels_impl.h"

#include <immintrin.h>

#include <loom/error.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>

namespace loom::runtime {

#if defined(__AVX2__) && defined(__FMA__)
namespace {

using winograd::Conv;
using winograd::TileAt;
using winograd::tile_at;
using winograd::xi_of;

constexpr int64_t kLanes = 8;   // float32 lanes: channels per vector
constexpr int64_t kChunk = 64;  // output channels per GEMM pass over a block
constexpr int64_t kRows = 6;    // tiles per register tile
// Tiles per task: its V and M together about this many bytes, so that they stay in L2 (512 KiB
// per core on the AVX2 EPYC) beside the part of U the GEMMs read; a multiple of kRows.
constexpr int64_t kBlockBytes = 256 * 1024;
constexpr int64_t kMinBlock = 12, kMaxBlock = 192;

struct Avx2 {  // the transforms' arithmetic (conv_winograd_tiles.h)
  static __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static __m256 sub(__m256 a, __m256 b) { return _mm256_sub_ps(a, b); }
  static __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256 set1(float x) { return _mm256_set1_ps(x); }
};

Conv make_conv(const ConvGeometry& g, ConvPass pass, int64_t m) {
  Conv v = winograd::conv_of(g, pass, m);
  const int64_t bytes_per_tile = xi_of(m) * (v.ci + std::min(v.co, kChunk)) * 4;
  v.block = std::clamp(kBlockBytes / bytes_per_tile, kMinBlock, kMaxBlock) / kRows * kRows;
  return v;
}

// ---- The kernel: U = G g G^T, [P][C][O] ----

// The 9 taps of output channels k0 .. k0+7 (lanes) and input channel c.
void load_taps(const Conv& v, const float* w, int64_t k0, int64_t c, __m256 g[9]) {
  const __m256i lane = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(static_cast<int>(v.k_step)));
  const float* taps = w + k0 * v.k_step + c * v.c_step;
  for (int t = 0; t < 9; ++t) g[t] = _mm256_i32gather_ps(taps + (v.flip ? 8 - t : t), lane, 4);
}

// U of output channels [k0, k0 + width) into u [P][C][width], on the calling thread when
// `serial`, else in parallel.
template <int T>
void transform_kernels(const Conv& v, const float* w, int64_t k0, int64_t width, float* u,
                       bool serial) {
  const int64_t kblocks = width / kLanes;
  const auto units = [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t c = unit / kblocks, k = unit % kblocks * kLanes;
      __m256 g[9], t[xi_of(T)];
      load_taps(v, w, k0 + k, c, g);
      if constexpr (T == 2) winograd::transform_kernel<Avx2>(g, t);
      else winograd::transform_kernel4<Avx2>(g, t);
      for (int64_t xi = 0; xi < xi_of(T); ++xi)
        _mm256_storeu_ps(u + (xi * v.ci + c) * width + k, t[xi]);
    }
  };
  if (serial) units(0, v.ci * kblocks);
  else parallel_range(v.ci * kblocks, 16, units);
}

// ---- The input: V = B^T d B, [P][block][C] ----

struct ColumnTag;  // thread_scratch tag

// Tiles [t0, t0 + nt) transformed into vs, input channels [c0, c0 + width) (default: all): V_xi
// of the k-th at vs + xi * xi_step + k * width.
template <int T>
void transform_input(const Conv& v, const float* in, int64_t t0, int64_t nt, float* vs,
                     int64_t xi_step, int64_t c0 = 0, int64_t width = -1) {
  if (width < 0) width = v.ci;
  // F(4x4): the last columns of B^T d of each group of 8 channels, for the next tile to the
  // right (input_transform4): up to 6% faster a pass (kernel_bench's shapes at 16 to 128
  // channels, with and without it alternated call by call in one process).
  __m256(*cols)[6] = nullptr;
  if constexpr (T == 4)
    cols = reinterpret_cast<__m256(*)[6]>(thread_scratch<__m256, ColumnTag>(
        static_cast<std::size_t>(width / kLanes * 8 * 6)));
  for (int64_t tl = 0; tl < nt; ++tl) {
    const TileAt at = tile_at(v, t0 + tl);
    // Tiles go row by row through each image: the last one is to this one's left unless this
    // one starts a row (or the call).
    const bool next_in_row = tl > 0 && at.x > 0;
    const int64_t y0 = at.y - v.ph, x0 = at.x - v.pw;
    constexpr int kSide = T + 2;
    const float* src[xi_of(T)];  // each position's channels, null outside the plane
    for (int i = 0; i < kSide; ++i)
      for (int j = 0; j < kSide; ++j) {
        const int64_t y = y0 + i, x = x0 + j;
        src[kSide * i + j] =
            y >= 0 && y < v.h && x >= 0 && x < v.w ? in + ((at.n * v.h + y) * v.w + x) * v.ci
                                                   : nullptr;
      }
    float* dst = vs + tl * width;
    for (int64_t c = 0; c < width; c += kLanes) {
      if constexpr (T == 2) {
        __m256 d[xi_of(T)];
        for (int k = 0; k < xi_of(T); ++k)
          d[k] = src[k] ? _mm256_loadu_ps(src[k] + c0 + c) : _mm256_setzero_ps();
        winograd::input_transform<Avx2>(d);
        for (int k = 0; k < xi_of(T); ++k) _mm256_storeu_ps(dst + k * xi_step + c, d[k]);
      } else {
        winograd::input_transform4<Avx2, __m256>(
            [&](int i, int j) {
              const float* s = src[kSide * i + j];
              return s ? _mm256_loadu_ps(s + c0 + c) : _mm256_setzero_ps();
            },
            [&](int k, __m256 r) { _mm256_storeu_ps(dst + k * xi_step + c, r); },
            cols + c / kLanes * 8, static_cast<int>(at.x & 7), next_in_row ? 2 : 0);
      }
    }
  }
}

// ---- The GEMMs: M_xi [rows][8 Q] = V_xi [rows][C] * U_xi [C][8 Q] ----

// m [R][8Q] (+)= a [R][K] * b [K][8Q]: a's rows lda apart and its K values a_step apart (the
// forward's V_xi rows: C and 1; the weight gradient's transformed grad_out: 1 and O), b's rows
// ldb apart, m's rows ldm apart.
// With `add`, the sums start from m's values (a later slice of C).
template <int R, int Q>
void gemm_tile(const float* a, int64_t lda, int64_t a_step, const float* b, int64_t ldb,
               int64_t depth, float* m, int64_t ldm, bool add) {
  // Unrolled early (the pragmas), so that GCC keeps the sums in registers: without them it
  // stored each sum back to the stack after its FMA, a third of the FMA rate.
  __m256 acc[R][Q];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int q = 0; q < Q; ++q)
      acc[r][q] = add ? _mm256_loadu_ps(m + r * ldm + q * kLanes) : _mm256_setzero_ps();
  for (int64_t k = 0; k < depth; ++k, a += a_step, b += ldb) {
    __m256 u[Q];
#pragma GCC unroll 2
    for (int q = 0; q < Q; ++q) u[q] = _mm256_loadu_ps(b + q * kLanes);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + r * lda);
#pragma GCC unroll 2
      for (int q = 0; q < Q; ++q) acc[r][q] = _mm256_fmadd_ps(x, u[q], acc[r][q]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int q = 0; q < Q; ++q) _mm256_storeu_ps(m + r * ldm + q * kLanes, acc[r][q]);
}

using GemmTile = void (*)(const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*,
                          int64_t, bool);

template <int Q, int... R>
constexpr std::array<GemmTile, sizeof...(R)> tiles_of(std::integer_sequence<int, R...>) {
  return {&gemm_tile<R + 1, Q>...};
}

// m [rows][width] (+)= a [rows][depth] * b [depth][width] on the register tiles: kRows rows by
// 16 columns at a time (8 for a last odd vector), in slices of kSliceDepth of the depth, each
// slice's panel of b (at most 256 x 16 floats, 16 KB) staying in L1 while the rows go by; a's
// rows lda apart and its depth a_step apart, b's rows ldb apart, m's rows ldm apart. The sums
// add their slices in order, from m's values where `add`.
constexpr int64_t kSliceDepth = 256;

void gemm(const float* a, int64_t lda, int64_t a_step, const float* b, int64_t ldb,
          int64_t depth, int64_t rows, int64_t width, float* m, int64_t ldm, bool add) {
  static constexpr auto kTiles2 = tiles_of<2>(std::make_integer_sequence<int, kRows>{});
  static constexpr auto kTiles1 = tiles_of<1>(std::make_integer_sequence<int, kRows>{});
  for (int64_t q = 0; q < width; q += 2 * kLanes) {
    const auto& tiles = q + 2 * kLanes <= width ? kTiles2 : kTiles1;
    for (int64_t k0 = 0; k0 < depth; k0 += kSliceDepth) {
      const int64_t slice = std::min(kSliceDepth, depth - k0);
      for (int64_t r = 0; r < rows; r += kRows)
        tiles[static_cast<std::size_t>(std::min(kRows, rows - r) - 1)](
            a + r * lda + k0 * a_step, lda, a_step, b + k0 * ldb + q, ldb, slice,
            m + r * ldm + q, ldm, add || k0 > 0);
    }
  }
}

// ---- The output: Y = A^T M A (+ bias, relu) ----

// Tiles [t0, t0 + nt) from M (M_xi of the k-th at ms + xi * xi_step + k * kChunk) into
// output channels [k0, k0 + width).
template <int T>
void transform_output(const Conv& v, const float* ms, int64_t xi_step, int64_t t0, int64_t nt,
                      int64_t k0, int64_t width, const float* bias, bool relu, float* out) {
  const auto finish = [&](__m256 r, int64_t q) {
    if (bias) r = _mm256_add_ps(r, _mm256_loadu_ps(bias + k0 + q));
    return relu ? _mm256_max_ps(r, _mm256_setzero_ps()) : r;
  };
  winograd::output_tiles<Avx2, __m256, T>(
      v, t0, nt, k0, width, kLanes,
      [&](int64_t tl, int64_t q, int64_t xi) {
        return _mm256_loadu_ps(ms + tl * kChunk + q + xi * xi_step);
      },
      [&](int64_t at, int64_t q, __m256 y) { _mm256_storeu_ps(out + at, finish(y, q)); });
}

struct KernelTag;  // thread_scratch tags
struct InputTag;
struct ProductTag;

// M = V U for nt tiles and output channels [k0, k0 + width): V_xi at vs + xi * v_step (rows C
// apart), U_xi at u + xi * C * ldu (rows ldu apart, from output channel k0), M_xi at ms + xi *
// m_step (rows kChunk apart).
void multiply(const Conv& v, const float* vs, int64_t v_step, const float* u, int64_t ldu,
              int64_t nt, int64_t width, float* ms, int64_t m_step) {
  for (int64_t xi = 0; xi < xi_of(v.m); ++xi)
    gemm(vs + xi * v_step, v.ci, 1, u + xi * v.ci * ldu, ldu, v.ci, nt, width, ms + xi * m_step,
         kChunk, false);
}

// Tiles [t0, t0 + nt): transformed, multiplied and transformed back, 64 output channels at a
// time; u: U [P][C][O].
template <int T>
void run_block(const Conv& v, const float* in, const float* u, int64_t t0, int64_t nt,
               const float* bias, bool relu, float* out) {
  const auto size = [](int64_t n) { return static_cast<std::size_t>(n); };
  float* vs = thread_scratch<float, InputTag>(size(xi_of(T) * v.block * v.ci));
  float* ms = thread_scratch<float, ProductTag>(size(xi_of(T) * v.block * kChunk));
  transform_input<T>(v, in, t0, nt, vs, v.block * v.ci);
  for (int64_t k0 = 0; k0 < v.co; k0 += kChunk) {
    const int64_t width = std::min(kChunk, v.co - k0);
    multiply(v, vs, v.block * v.ci, u + k0, v.co, nt, width, ms, v.block * kChunk);
    transform_output<T>(v, ms, v.block * kChunk, t0, nt, k0, width, bias, relu, out);
  }
}

// Fewer tiles than output channels (small planes: ResNet-18's 512-channel 4x4 stage has 4
// tiles per image): then U outweighs V, and blocks of tiles that each read all of U (16 MB for
// 512 x 512 channels) would go to memory for it once per block. Instead every tile's V is
// transformed once into `vs`, and the tasks are chunks of 64 output channels (by blocks of
// kMaxBlock tiles), each transforming its chunk of the kernel into its own buffer (2 MB at
// 512 input channels, where it stays in cache; U is never written whole).
template <int T>
void run_by_chunks(const Conv& v, const float* in, const float* w, float* vs, const float* bias,
                   bool relu, float* out) {
  const int64_t v_step = v.tiles * v.ci;
  parallel_range(v.tiles, kRows, [&](int64_t begin, int64_t end) {
    transform_input<T>(v, in, begin, end - begin, vs + begin * v.ci, v_step);
  });
  const int64_t chunks = ceil_div(v.co, kChunk), blocks = ceil_div(v.tiles, kMaxBlock);
  parallel_range(chunks * blocks, 1, [&](int64_t begin, int64_t end) {
    const auto size = [](int64_t n) { return static_cast<std::size_t>(n); };
    float* ms = thread_scratch<float, ProductTag>(size(xi_of(T) * kMaxBlock * kChunk));
    float* u = thread_scratch<float, KernelTag>(size(xi_of(T) * v.ci * kChunk));
    int64_t made = -1;  // the chunk whose U is in u
    for (int64_t task = begin; task < end; ++task) {
      const int64_t k0 = task / blocks * kChunk, t0 = task % blocks * kMaxBlock;
      const int64_t nt = std::min(kMaxBlock, v.tiles - t0), width = std::min(kChunk, v.co - k0);
      if (made != k0) transform_kernels<T>(v, w, k0, width, u, true);
      made = k0;
      multiply(v, vs + t0 * v.ci, v_step, u, width, nt, width, ms, kMaxBlock * kChunk);
      transform_output<T>(v, ms, kMaxBlock * kChunk, t0, nt, k0, width, bias, relu, out);
    }
  });
}

// ---- The weight gradient: F(3x3, T x T), dW = G^T [ sum over tiles (A g A^T) . (B^T d B) ] G ----
//
// Each T x T tile g of grad_out and the (T+2) x (T+2) input window d under it add to the 3x3
// weight gradient of every (output, input) channel pair: dW[i][j] += sum over a, b of g[a][b]
// d[i+a][j+b], itself a Winograd product with the forward's points: P multiplies instead of 9
// T^2 (16 for 36, 36 for 144). With A the forward's A^T transposed (T = 2: [1 0; 1 1; 1 -1;
// 0 -1]) and the forward's B and G:
//   M_xi [O][C] = sum over tiles of W_xi [tile][O] * V_xi [tile][C],  W = A g A^T,  V = B^T d B
// and dW = G^T M G at the end. The tiles go in fixed groups of 4096 output positions (1024 tiles
// of 2x2, 256 of 4x4), each group's sums in a buffer of its own, added in group order at the
// end: the same bits on any thread count. A task is a group's tiles for a block of output and
// of input channels, in blocks of tiles whose W and V are transformed into per-thread buffers.
constexpr int64_t kGradGroupPositions = 4096;
constexpr int64_t grad_group_tiles(int64_t m) { return kGradGroupPositions / (m * m); }
constexpr int64_t kGradTiles = 48;      // tiles per transformed block
constexpr int64_t kGradOutBlock = 64;   // output channels per task
constexpr int64_t kGradInBlock = 128;   // input channels per task

// r = A x for four vectors, A = [1 0 0 0; 1 1 1 1; 1 -1 1 -1; 1 2 4 8; 1 -2 4 -8; 0 0 0 1]
// (F(4x4, 3x3)'s A^T transposed).
void grad_column4(__m256 x0, __m256 x1, __m256 x2, __m256 x3, __m256 r[6]) {
  const __m256 even = _mm256_add_ps(x0, x2), odd = _mm256_add_ps(x1, x3);
  const __m256 even4 = _mm256_fmadd_ps(_mm256_set1_ps(4.0f), x2, x0);
  const __m256 odd2 = _mm256_fmadd_ps(_mm256_set1_ps(8.0f), x3, _mm256_add_ps(x1, x1));
  r[0] = x0;
  r[1] = _mm256_add_ps(even, odd);
  r[2] = _mm256_sub_ps(even, odd);
  r[3] = _mm256_add_ps(even4, odd2);
  r[4] = _mm256_sub_ps(even4, odd2);
  r[5] = x3;
}

// W = A g A^T of tiles [t0, t0 + nt) for output channels [o0, o0 + width): W_xi of the k-th at
// ws + xi * xi_step + k * width. `grad` is grad_out [N, Ho, Wo, O] (the forward conv's output).
void transform_grad4(const Conv& v, const float* grad, int64_t t0, int64_t nt, int64_t o0,
                     int64_t width, float* ws, int64_t xi_step) {
  for (int64_t tl = 0; tl < nt; ++tl) {
    const TileAt at = tile_at(v, t0 + tl);
    const int64_t rows = std::min<int64_t>(4, v.oh - at.y);
    const int64_t cols = std::min<int64_t>(4, v.ow - at.x);
    const float* first = grad + ((at.n * v.oh + at.y) * v.ow + at.x) * v.co + o0;
    float* dst = ws + tl * width;
    for (int64_t o = 0; o < width; o += kLanes) {
      __m256 t[4][6];  // (A g)^T: t[j][xi]
      for (int64_t j = 0; j < 4; ++j) {
        __m256 x[4];
        for (int64_t i = 0; i < 4; ++i)
          x[i] = i < rows && j < cols ? _mm256_loadu_ps(first + (i * v.ow + j) * v.co + o)
                                      : _mm256_setzero_ps();
        grad_column4(x[0], x[1], x[2], x[3], t[j]);
      }
      for (int i = 0; i < 6; ++i) {  // (A g) A^T
        __m256 r[6];
        grad_column4(t[0][i], t[1][i], t[2][i], t[3][i], r);
        for (int j = 0; j < 6; ++j) _mm256_storeu_ps(dst + (6 * i + j) * xi_step + o, r[j]);
      }
    }
  }
}

// The same for 2x2 tiles.
void transform_grad2(const Conv& v, const float* grad, int64_t t0, int64_t nt, int64_t o0,
                     int64_t width, float* ws, int64_t xi_step) {
  for (int64_t tl = 0; tl < nt; ++tl) {
    const TileAt at = tile_at(v, t0 + tl);
    const bool down = at.y + 1 < v.oh, across = at.x + 1 < v.ow;
    const float* row0 = grad + ((at.n * v.oh + at.y) * v.ow + at.x) * v.co + o0;
    const float* row1 = down ? row0 + v.ow * v.co : row0;  // read only when down
    float* dst = ws + tl * width;
    for (int64_t o = 0; o < width; o += kLanes) {
      const __m256 zero = _mm256_setzero_ps();
      const __m256 g00 = _mm256_loadu_ps(row0 + o);
      const __m256 g01 = across ? _mm256_loadu_ps(row0 + v.co + o) : zero;
      const __m256 g10 = down ? _mm256_loadu_ps(row1 + o) : zero;
      const __m256 g11 = down && across ? _mm256_loadu_ps(row1 + v.co + o) : zero;
      __m256 t[4][2];  // A g
      const __m256 col[2][2] = {{g00, g10}, {g01, g11}};
      for (int j = 0; j < 2; ++j) {
        const __m256 a = col[j][0], b = col[j][1];
        t[0][j] = a;
        t[1][j] = _mm256_add_ps(a, b);
        t[2][j] = _mm256_sub_ps(a, b);
        t[3][j] = _mm256_sub_ps(zero, b);
      }
      for (int i = 0; i < 4; ++i) {  // (A g) A^T
        float* p = dst + 4 * i * xi_step + o;
        _mm256_storeu_ps(p, t[i][0]);
        _mm256_storeu_ps(p + xi_step, _mm256_add_ps(t[i][0], t[i][1]));
        _mm256_storeu_ps(p + 2 * xi_step, _mm256_sub_ps(t[i][0], t[i][1]));
        _mm256_storeu_ps(p + 3 * xi_step, _mm256_sub_ps(zero, t[i][1]));
      }
    }
  }
}

template <int T>
void transform_grad(const Conv& v, const float* grad, int64_t t0, int64_t nt, int64_t o0,
                    int64_t width, float* ws, int64_t xi_step) {
  if constexpr (T == 4) transform_grad4(v, grad, t0, nt, o0, width, ws, xi_step);
  else transform_grad2(v, grad, t0, nt, o0, width, ws, xi_step);
}

struct GradInputTag;  // thread_scratch tags
struct GradOutTag;

// One task: the tiles of group `group`, output channels [o0, o0 + ow), input channels [c0, c0 +
// cw), summed into ms (M_xi [O][C] of the group at ms + xi * O * C).
template <int T>
void grad_task(const Conv& v, const float* x, const float* grad, int64_t group, int64_t o0,
               int64_t ow, int64_t c0, int64_t cw, float* ms) {
  const auto size = [](int64_t n) { return static_cast<std::size_t>(n); };
  float* vs = thread_scratch<float, GradInputTag>(size(xi_of(T) * kGradTiles * kGradInBlock));
  float* ws = thread_scratch<float, GradOutTag>(size(xi_of(T) * kGradTiles * kGradOutBlock));
  const int64_t first = group * grad_group_tiles(T);
  const int64_t last = std::min(v.tiles, first + grad_group_tiles(T));
  for (int64_t t0 = first; t0 < last; t0 += kGradTiles) {
    const int64_t nt = std::min(kGradTiles, last - t0);
    transform_input<T>(v, x, t0, nt, vs, kGradTiles * cw, c0, cw);
    transform_grad<T>(v, grad, t0, nt, o0, ow, ws, kGradTiles * ow);
    for (int64_t xi = 0; xi < xi_of(T); ++xi)  // M_xi [ow][cw] += W_xi^T [ow][nt] V_xi [nt][cw]
      gemm(ws + xi * kGradTiles * ow, 1, ow, vs + xi * kGradTiles * cw, cw, nt, ow, cw,
           ms + (xi * v.co + o0) * v.ci + c0, v.ci, t0 > first);
  }
}

// y = G^T x for six vectors (F(4x4, 3x3)'s G transposed).
void weight_column4(const __m256 x[6], __m256 y[3]) {
  const __m256 sixth = _mm256_set1_ps(1.0f / 6);
  const __m256 s12 = _mm256_add_ps(x[1], x[2]), d12 = _mm256_sub_ps(x[1], x[2]);
  const __m256 s34 = _mm256_add_ps(x[3], x[4]), d34 = _mm256_sub_ps(x[3], x[4]);
  // y0 = x0/4 - (x1 + x2)/6 + (x3 + x4)/24, y1 = (x2 - x1)/6 + (x3 - x4)/12,
  // y2 = (x3 + x4 - x1 - x2)/6 + x5
  const __m256 zero = _mm256_setzero_ps();
  y[0] = _mm256_fmadd_ps(
      _mm256_set1_ps(0.25f), x[0],
      _mm256_mul_ps(sixth, _mm256_fmadd_ps(_mm256_set1_ps(0.25f), s34, _mm256_sub_ps(zero, s12))));
  y[1] = _mm256_mul_ps(sixth,
                       _mm256_fmadd_ps(_mm256_set1_ps(0.5f), d34, _mm256_sub_ps(zero, d12)));
  y[2] = _mm256_fmadd_ps(sixth, _mm256_sub_ps(s34, s12), x[5]);
}

// y[3 i + j] = (G^T M G)[i][j] for M_xi = m[xi], 6x6 (F(4x4, 3x3)'s G).
void weight_transform4(const __m256 m[winograd::kXi4], float y[9][kLanes]) {
  __m256 t[6][3];  // (G^T M)^T: t[j][i]
  for (int j = 0; j < 6; ++j) {
    const __m256 col[6] = {m[j], m[6 + j], m[12 + j], m[18 + j], m[24 + j], m[30 + j]};
    weight_column4(col, t[j]);
  }
  for (int i = 0; i < 3; ++i) {  // (G^T M) G
    const __m256 row[6] = {t[0][i], t[1][i], t[2][i], t[3][i], t[4][i], t[5][i]};
    __m256 r[3];
    weight_column4(row, r);
    for (int j = 0; j < 3; ++j) _mm256_storeu_ps(y[3 * i + j], r[j]);
  }
}

// The same for a 4x4 M (F(2x2, 3x3)'s G).
void weight_transform2(const __m256 m[winograd::kXi], float y[9][kLanes]) {
  const __m256 half = _mm256_set1_ps(0.5f);
  __m256 t[3][4];  // G^T M
  for (int j = 0; j < 4; ++j) {
    const __m256 mid = _mm256_mul_ps(half, _mm256_add_ps(m[4 + j], m[8 + j]));
    t[0][j] = _mm256_add_ps(m[j], mid);
    t[1][j] = _mm256_mul_ps(half, _mm256_sub_ps(m[4 + j], m[8 + j]));
    t[2][j] = _mm256_add_ps(mid, m[12 + j]);
  }
  for (int i = 0; i < 3; ++i) {  // (G^T M) G
    const __m256 mid = _mm256_mul_ps(half, _mm256_add_ps(t[i][1], t[i][2]));
    _mm256_storeu_ps(y[3 * i], _mm256_add_ps(t[i][0], mid));
    _mm256_storeu_ps(y[3 * i + 1], _mm256_mul_ps(half, _mm256_sub_ps(t[i][1], t[i][2])));
    _mm256_storeu_ps(y[3 * i + 2], _mm256_add_ps(mid, t[i][3]));
  }
}

// dW [O][C][3][3] = G^T M G, M the groups' sums added in group order.
template <int T>
void transform_weight_grad(const Conv& v, const float* sums, int64_t groups, float* out) {
  constexpr int64_t kPositions = xi_of(T);
  const int64_t group_step = kPositions * v.co * v.ci, xi_step = v.co * v.ci;
  parallel_range(v.co, 4, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o)
      for (int64_t c = 0; c < v.ci; c += kLanes) {
        __m256 m[kPositions];
        for (int64_t xi = 0; xi < kPositions; ++xi) {
          const float* p = sums + xi * xi_step + o * v.ci + c;
          m[xi] = _mm256_loadu_ps(p);
          for (int64_t gi = 1; gi < groups; ++gi)
            m[xi] = _mm256_add_ps(m[xi], _mm256_loadu_ps(p + gi * group_step));
        }
        float y[9][kLanes];
        if constexpr (T == 4) weight_transform4(m, y);
        else weight_transform2(m, y);
        float* dst = out + (o * v.ci + c) * 9;
        for (int64_t l = 0; l < kLanes; ++l)
          for (int k = 0; k < 9; ++k) dst[l * 9 + k] = y[k][l];
      }
  });
}

template <int T>
void run_weight_grad(const ConvGeometry& g, const float* x, const float* grad, float* out) {
  const Conv v = make_conv(g, ConvPass::kForward, T);
  const int64_t groups = ceil_div(v.tiles, grad_group_tiles(T));
  const int64_t oblocks = ceil_div(v.co, kGradOutBlock), cblocks = ceil_div(v.ci, kGradInBlock);
  const int64_t group_size = xi_of(T) * v.co * v.ci;
  struct SumsTag;
  float* sums = thread_scratch<float, SumsTag>(static_cast<std::size_t>(groups * group_size));
  parallel_range(groups * oblocks * cblocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t group = task / (oblocks * cblocks), rest = task % (oblocks * cblocks);
      const int64_t o0 = rest / cblocks * kGradOutBlock, c0 = rest % cblocks * kGradInBlock;
      grad_task<T>(v, x, grad, group, o0, std::min(kGradOutBlock, v.co - o0), c0,
                   std::min(kGradInBlock, v.ci - c0), sums + group * group_size);
    }
  });
  transform_weight_grad<T>(v, sums, groups, out);
}

void check_tile(const char* kernel, int tile) {
  if (tile != 2 && tile != 4)
    throw Error(std::string(kernel) + ": expected an output tile side of 2 or 4, got " +
                std::to_string(tile));
}

template <int T>
void run_forward(const ConvGeometry& g, ConvPass pass, const float* in, const float* w,
                 float* out, const float* bias, bool relu) {
  const Conv v = make_conv(g, pass, T);
  const auto size = [](int64_t n) { return static_cast<std::size_t>(n); };
  if (v.co > v.tiles) {
    struct AllInputTag;
    return run_by_chunks<T>(
        v, in, w, thread_scratch<float, AllInputTag>(size(xi_of(T) * v.tiles * v.ci)), bias, relu,
        out);
  }
  struct WholeKernelTag;
  float* u = thread_scratch<float, WholeKernelTag>(size(xi_of(T) * v.ci * v.co));
  transform_kernels<T>(v, w, 0, v.co, u, false);
  const int64_t blocks = ceil_div(v.tiles, v.block);
  parallel_range(blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t t0 = b * v.block;
      run_block<T>(v, in, u, t0, std::min(v.block, v.tiles - t0), bias, relu, out);
    }
  });
}

}  // namespace

bool f32_winograd_applies(const ConvGeometry& g) {
  return g.groups == 1 && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 &&
         g.dw == 1 && g.ph >= 0 && g.ph <= 2 && g.pw >= 0 && g.pw <= 2 && g.c % kLanes == 0 &&
         g.o % kLanes == 0 && g.c > 0 && g.o > 0 && g.n > 0 && g.oh > 0 && g.ow > 0 &&
         g.h > 0 && g.w > 0;
}

void conv2d_winograd_f32(const ConvGeometry& g, ConvPass pass, int tile, const float* in,
                         const float* w, float* out, const float* bias, bool relu) {
  if (pass == ConvPass::kGradWeight)
    throw Error("conv2d_winograd_f32: runs the forward and the input gradient only");
  if (!f32_winograd_applies(g))
    throw Error("conv2d_winograd_f32: not a 3x3 stride-1 conv with channels in multiples of 8 "
                "(check f32_winograd_applies first)");
  check_tile("conv2d_winograd_f32", tile);
  if (tile == 4) return run_forward<4>(g, pass, in, w, out, bias, relu);
  run_forward<2>(g, pass, in, w, out, bias, relu);
}

int64_t f32_winograd_weight_grad_groups(const ConvGeometry& g, int tile) {
  check_tile("f32_winograd_weight_grad_groups", tile);
  return ceil_div(winograd::conv_of(g, ConvPass::kForward, tile).tiles, grad_group_tiles(tile));
}

void conv2d_grad_weight_winograd_f32(const ConvGeometry& g, int tile, const float* x,
                                     const float* grad, float* out) {
  if (!f32_winograd_applies(g))
    throw Error("conv2d_grad_weight_winograd_f32: not a 3x3 stride-1 conv with channels in "
                "multiples of 8 (check f32_winograd_applies first)");
  check_tile("conv2d_grad_weight_winograd_f32", tile);
  if (tile == 4) return run_weight_grad<4>(g, x, grad, out);
  run_weight_grad<2>(g, x, grad, out);
}

#else  // no AVX2 and FMA in this build: oneDNN runs every float32 channels-last conv

bool f32_winograd_applies(const ConvGeometry&) { return false; }

void conv2d_winograd_f32(const ConvGeometry&, ConvPass, int, const float*, const float*, float*,
                         const float*, bool) {
  throw Error("conv2d_winograd_f32: this build has no AVX2 and FMA kernel (check "
              "f32_winograd_applies first)");
}

int64_t f32_winograd_weight_grad_groups(const ConvGeometry&, int) { return 0; }

void conv2d_grad_weight_winograd_f32(const ConvGeometry&, int, const float*, const float*,
                                     float*) {
  throw Error("conv2d_grad_weight_winograd_f32: this build has no AVX2 and FMA kernel (check "
              "f32_winograd_applies first)");
}

#endif

}  // namespace loom::runtime
