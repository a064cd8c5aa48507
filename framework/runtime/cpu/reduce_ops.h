// Private to kernels_reduce.cpp: what a reduction folds, element by element and a contiguous
// run at a time, apart from how the kernels walk their operand. Each op R has an accumulator
// type R::Acc, R::init(), R::fold(acc, v) for one element, R::fold_run(acc, p, n) for n
// contiguous elements (a fixed order, so the result is the same every time), R::combine for two
// partial accumulators, and R::finish(acc, n) the result of n elements folded.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace loom::runtime::reduce_ops {

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(v);
  else return false;
}

// Float sums accumulate in double, integer sums in int64.
template <class T>
using SumAcc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

template <class T>
struct SumOp {
  using Acc = SumAcc<T>;
  static Acc init() { return Acc(0); }
  static void fold(Acc& a, T v) { a += static_cast<Acc>(v); }
  // A contiguous run: 32 partial sums in a fixed pattern (element i into lane i % 32, the
  // last partial row into lanes 0, 1, ...), then folded pairwise (lane k + lane k + 16, ..., +1):
  // the result is the same every time, and 32 independent chains keep the adds' latency
  // hidden. Float runs take the same sums in four vectors of eight doubles on AVX-512, in
  // eight of four on AVX2.
  static constexpr int64_t kLanes = 32;
  static void fold_run(Acc& a, const T* p, int64_t n) {
#if defined(__AVX512F__) && defined(__AVX512VL__)
    if constexpr (std::is_same_v<T, float>) {
      // Four named accumulators (an array of vectors went through the stack).
      __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
      auto widen = [](const float* q) { return _mm512_cvtps_pd(_mm256_loadu_ps(q)); };
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) {
        s0 = _mm512_add_pd(s0, widen(p + i));
        s1 = _mm512_add_pd(s1, widen(p + i + 8));
        s2 = _mm512_add_pd(s2, widen(p + i + 16));
        s3 = _mm512_add_pd(s3, widen(p + i + 24));
      }
      // The partial row into lanes 0, 1, ...; the other lanes add +0, which changes no sum
      // (every lane starts at +0).
      if (i < n) {
        auto part = [&](int64_t g) {
          const auto count = static_cast<unsigned>(std::clamp<int64_t>(n - i - 8 * g, 0, 8));
          const auto mask = static_cast<__mmask8>((1u << count) - 1);
          return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(mask, p + i + 8 * g));
        };
        s0 = _mm512_add_pd(s0, part(0));
        s1 = _mm512_add_pd(s1, part(1));
        s2 = _mm512_add_pd(s2, part(2));
        s3 = _mm512_add_pd(s3, part(3));
      }
      // Pairwise: + 16, + 8 across the vectors, then + 4, + 2, + 1 within the first.
      s0 = _mm512_add_pd(_mm512_add_pd(s0, s2), _mm512_add_pd(s1, s3));
      const __m256d h = _mm256_add_pd(_mm512_castpd512_pd256(s0), _mm512_extractf64x4_pd(s0, 1));
      const __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
      a += _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
      return;
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {  // the compiler's loop ran at half amax's speed
      // Eight vectors of four doubles: s[j] holds lanes 4j .. 4j + 3.
      __m256d s[8];
      for (auto& v : s) v = _mm256_setzero_pd();
      auto add_row = [&s](const float* q) {
        for (int j = 0; j < 8; ++j) s[j] = _mm256_add_pd(s[j], _mm256_cvtps_pd(_mm_loadu_ps(q + 4 * j)));
      };
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) add_row(p + i);
      if (i < n) {  // the partial row into lanes 0, 1, ...; the others add +0 (see above)
        float row[kLanes] = {};
        std::copy(p + i, p + n, row);
        add_row(row);
      }
      // Pairwise: + 16 and + 8 across the vectors, + 4 between the first two, then + 2, + 1.
      for (int j = 0; j < 4; ++j) s[j] = _mm256_add_pd(s[j], s[j + 4]);
      for (int j = 0; j < 2; ++j) s[j] = _mm256_add_pd(s[j], s[j + 2]);
      const __m256d h = _mm256_add_pd(s[0], s[1]);
      const __m128d q = _mm_add_pd(_mm256_castpd256_pd128(h), _mm256_extractf128_pd(h, 1));
      a += _mm_cvtsd_f64(_mm_add_sd(q, _mm_unpackhi_pd(q, q)));
      return;
    }
#endif
    Acc lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int64_t k = 0; k < kLanes; ++k) lane[k] += static_cast<Acc>(p[i + k]);
    for (int64_t k = 0; i < n; ++i, ++k) lane[k] += static_cast<Acc>(p[i]);
    for (int64_t w = kLanes / 2; w > 0; w /= 2)
      for (int64_t k = 0; k < w; ++k) lane[k] += lane[k + w];
    a += lane[0];
  }
  static void combine(Acc& a, Acc b) { a += b; }
  static T finish(Acc a, int64_t) { return static_cast<T>(a); }
};

template <class T>
struct MeanOp : SumOp<T> {
  static T finish(SumAcc<T> a, int64_t n) { return static_cast<T>(a / static_cast<double>(n)); }
};

// amax propagates NaN like torch.amax: once the accumulator is NaN, v > NaN is false.
template <class T>
struct MaxOp {
  using Acc = T;
  static Acc init() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
  static void fold(Acc& a, T v) {
    if (is_nan(v) || v > a) a = v;
  }
  // A contiguous run: lane maxima (sixteen; float runs on AVX2 take four vectors of eight),
  // then their maximum. That is the run's maximum, and so the sequential fold's result,
  // unless a NaN was read or the maximum is a zero (+0 and -0 tie, and the sequential fold
  // keeps the first): those runs are folded again one element at a time.
  static void fold_run(Acc& a, const T* p, int64_t n) {
    constexpr int64_t kLanes = 16;
    if (n < 2 * kLanes) {
      for (int64_t i = 0; i < n; ++i) fold(a, p[i]);
      return;
    }
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {  // the lanes below, as the compiler does not
      __m512 lanes = _mm512_loadu_ps(p);
      __mmask16 unordered = _mm512_cmp_ps_mask(lanes, lanes, _CMP_UNORD_Q);
      int64_t i = kLanes;
      for (; i + kLanes <= n; i += kLanes) {
        const __m512 v = _mm512_loadu_ps(p + i);
        unordered = static_cast<__mmask16>(unordered | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
        lanes = _mm512_max_ps(v, lanes);  // v > lane ? v : lane
      }
      return finish_run(a, p, n, i, _mm512_reduce_max_ps(lanes), unordered != 0);
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {  // the generic lanes ran at half a sum's speed
      // Four vectors of maxima and of unordered flags (the maxima's latency hidden).
      __m256 l0 = _mm256_loadu_ps(p), l1 = _mm256_loadu_ps(p + 8);
      __m256 u0 = _mm256_cmp_ps(l0, l0, _CMP_UNORD_Q), u1 = _mm256_cmp_ps(l1, l1, _CMP_UNORD_Q);
      __m256 l2 = l0, l3 = l1, u2 = u0, u3 = u1;
      int64_t i = kLanes;
      for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
        const __m256 v0 = _mm256_loadu_ps(p + i), v1 = _mm256_loadu_ps(p + i + 8);
        const __m256 v2 = _mm256_loadu_ps(p + i + 16), v3 = _mm256_loadu_ps(p + i + 24);
        u0 = _mm256_or_ps(u0, _mm256_cmp_ps(v0, v0, _CMP_UNORD_Q));
        u1 = _mm256_or_ps(u1, _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q));
        u2 = _mm256_or_ps(u2, _mm256_cmp_ps(v2, v2, _CMP_UNORD_Q));
        u3 = _mm256_or_ps(u3, _mm256_cmp_ps(v3, v3, _CMP_UNORD_Q));
        l0 = _mm256_max_ps(v0, l0);  // v > lane ? v : lane
        l1 = _mm256_max_ps(v1, l1);
        l2 = _mm256_max_ps(v2, l2);
        l3 = _mm256_max_ps(v3, l3);
      }
      for (; i + kLanes <= n; i += kLanes) {
        const __m256 v0 = _mm256_loadu_ps(p + i), v1 = _mm256_loadu_ps(p + i + 8);
        u0 = _mm256_or_ps(u0, _mm256_cmp_ps(v0, v0, _CMP_UNORD_Q));
        u1 = _mm256_or_ps(u1, _mm256_cmp_ps(v1, v1, _CMP_UNORD_Q));
        l0 = _mm256_max_ps(v0, l0);
        l1 = _mm256_max_ps(v1, l1);
      }
      const __m256 l = _mm256_max_ps(_mm256_max_ps(l0, l1), _mm256_max_ps(l2, l3));
      const __m256 u = _mm256_or_ps(_mm256_or_ps(u0, u1), _mm256_or_ps(u2, u3));
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(l), _mm256_extractf128_ps(l, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
      return finish_run(a, p, n, i, _mm_cvtss_f32(h), _mm256_movemask_ps(u) != 0);
    }
#endif
    // NaNs are counted in T lanes, a select and an add that vectorise with the maxima.
    T lane[kLanes], unordered[kLanes];
    for (int64_t k = 0; k < kLanes; ++k) {
      lane[k] = p[k];
      unordered[k] = p[k] != p[k] ? T(1) : T(0);
    }
    int64_t i = kLanes;
    for (; i + kLanes <= n; i += kLanes)
      for (int64_t k = 0; k < kLanes; ++k) {
        const T v = p[i + k];
        unordered[k] += v != v ? T(1) : T(0);
        lane[k] = v > lane[k] ? v : lane[k];
      }
    T m = lane[0];
    bool nan = false;
    for (int64_t k = 0; k < kLanes; ++k) {
      m = lane[k] > m ? lane[k] : m;
      nan = nan || unordered[k] != T(0);
    }
    finish_run(a, p, n, i, m, nan);
  }
  // The end of fold_run: m, the maximum of the run's first i elements, and whether a NaN was
  // among them, taken over the rest; then m folded into a, or the whole run again in order.
  static void finish_run(Acc& a, const T* p, int64_t n, int64_t i, T m, bool nan) {
    for (; i < n; ++i) {
      nan = nan || is_nan(p[i]);
      m = p[i] > m ? p[i] : m;
    }
    if (std::is_floating_point_v<T> && (nan || m == T(0))) {
      for (int64_t j = 0; j < n; ++j) fold(a, p[j]);
      return;
    }
    fold(a, m);
  }
  static void combine(Acc& a, Acc b) { fold(a, b); }
  static T finish(Acc a, int64_t) { return a; }
};

}  // namespace loom::runtime::reduce_ops
