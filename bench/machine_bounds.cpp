// The machine's limits, measured in the same run as loom, and loom's kernels against them:
// the SGEMM peak (the best of Eigen's GEMM on one thread and with the output split in column
// blocks over the TBB threads — how loom's own kernels use Eigen, single-threaded below TBB;
// Eigen's OpenMP path would put a second thread pool beside TBB's), loom's matmul at 2048³,
// the stream bandwidth (scale and triad over 16M floats), a cache-resident sin+cos compute
// bound, and y = sin(cos(x)) on 16M floats as one graph and one op at a time; fused
// elementwise chains of a ResNet's training step (batch-norm apply + ReLU, its backward, the
// residual add + ReLU) against the stream triad measured beside them.
#include "loom_bench.h"

// GCC 12's AVX-512 intrinsics read their _mm512_undefined_* placeholders uninitialised (GCC
// bug 105593), which Eigen's vectorised sin/cos inline here; the immintrin.h that TBB or Eigen
// includes below must be covered, hence before every include.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <loom/lazy.h>
#include <loom/tensor.h>

#include <Eigen/Core>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace loom::bench {
namespace {

constexpr int64_t kSinCosElements = int64_t{1} << 24;  // 16M floats, 64 MiB
constexpr int64_t kLoomMatmul = 2048;

// The fastest of `reps` timed calls, after one untimed call (caches, page faults, compiles).
template <class F>
double best_seconds(int64_t reps, F&& f) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < reps; ++i) {
    double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

// `n` items in `blocks` equal contiguous blocks, one task each, spread evenly over the threads.
template <class F>
void parallel_blocks(int64_t n, int64_t blocks, F&& f) {
  const int64_t per = (n + blocks - 1) / blocks;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, blocks, 1),
      [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t b = r.begin(); b != r.end(); ++b) {
          const int64_t begin = b * per, end = std::min(n, begin + per);
          if (begin < end) f(begin, end);
        }
      },
      tbb::static_partitioner());
}

// C = A·B for n×n float matrices, C's columns split into `blocks` independent Eigen GEMMs.
double eigen_sgemm_seconds(int64_t n, int64_t blocks, int64_t reps) {
  // Any values in [-0.5, 0.5) do; Random() would spend seconds in rand().
  auto fill = [](Eigen::Index i, Eigen::Index j) { return static_cast<float>((i * 7 + j * 13) % 17) / 17 - 0.5f; };
  Eigen::MatrixXf a = Eigen::MatrixXf::NullaryExpr(n, n, fill), b = a.transpose();
  Eigen::MatrixXf c = Eigen::MatrixXf::Zero(n, n);
  return best_seconds(reps, [&] {
    parallel_blocks(n, blocks, [&](int64_t c0, int64_t c1) {
      c.middleCols(c0, c1 - c0).noalias() = a * b.middleCols(c0, c1 - c0);
    });
  });
}

double gemm_gflops(int64_t n, double seconds) { return 2.0 * static_cast<double>(n * n * n) / seconds / 1e9; }

std::string percent(double fraction) { return format("%.0f%%", 100 * fraction); }

// The stream triad x = y + a*z over 16M floats (192 MiB moved, far beyond the caches), in
// bytes per second.
double triad_bytes_s(const Options& o, int64_t n) {
  const int64_t threads = thread_count();
  std::vector<float> x(n), y(n), z(n);
  // First touch in the same blocks as the kernel, so pages sit near the threads using them.
  parallel_blocks(n, threads, [&](int64_t b, int64_t e) {
    std::fill(x.data() + b, x.data() + e, 1.0f);
    std::fill(y.data() + b, y.data() + e, 2.0f);
    std::fill(z.data() + b, z.data() + e, 3.0f);
  });
  float* px = x.data();
  const float* py = y.data();
  const float* pz = z.data();
  const double s = best_seconds(o.reps, [&] {
    parallel_blocks(n, threads, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) px[i] = py[i] + 0.5f * pz[i];
    });
  });
  return 12.0 * static_cast<double>(n) / s;
}

}  // namespace

void measure_sgemm_peak(const Options& o, Bounds& bounds, Table& t) {
  const int64_t threads = thread_count();
  struct Case {
    int64_t n, blocks;
  };
  // One thread for scale; then all threads, with as many blocks as threads and 4x more.
  std::vector<Case> cases{{2048, 1}, {2048, threads}, {2048, 4 * threads}, {4096, threads}};
  if (threads == 1) cases.erase(cases.begin());
  std::vector<double> gflops;
  for (const auto& c : cases) {
    progress("Eigen SGEMM " + std::to_string(c.n) + "^3 in " + std::to_string(c.blocks) + " blocks");
    double s = eigen_sgemm_seconds(c.n, c.blocks, o.reps);
    gflops.push_back(gemm_gflops(c.n, s));
    // One thread can win when other jobs hold the other cores: the peak is what this run got.
    bounds.sgemm_gflops = std::max(bounds.sgemm_gflops, gflops.back());
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    std::string name = "Eigen SGEMM " + std::to_string(c.n) + "^3, " +
                       (c.blocks == 1 ? std::string("1 thread") : std::to_string(c.blocks) + " column blocks");
    const double s = gemm_gflops(c.n, 1) / gflops[i];
    const bool is_peak = gflops[i] == bounds.sgemm_gflops;
    t.add({.section = "gemm", .benchmark = name + (is_peak ? " = SGEMM PEAK" : ""), .precision = "fp32",
           .time = format_time(s), .gflops = format("%.1f", gflops[i]),
           .peak = percent(gflops[i] / peak_gflops(bounds, "fp32"))});
  }
}

void bench_loom_matmul(const Options& o, const Bounds& bounds, Table& t) {
  auto a = randn({kLoomMatmul, kLoomMatmul}, 1), b = randn({kLoomMatmul, kLoomMatmul}, 2);
  mark_step();
  wait_device_ops();
  // fp32, and bf16 where asked: the library GEMM's rate on real operands (random values, from
  // memory), what the bf16 %peak of a step can hope for beside the tile loop's.
  for (const std::string& precision : {std::string("fp32"), std::string("bf16")}) {
    if (precision == "bf16" && !o.has(o.precisions, "bf16")) continue;
    progress("loom matmul 2048^3 " + precision);
    const DType dtype = precision == "bf16" ? DType::BFloat16 : DType::Float32;
    const Tensor x = a.to(dtype), y = b.to(dtype);
    mark_step();
    wait_device_ops();
    Tensor c;
    double s = best_seconds(o.reps, [&] {
      c = Tensor();
      c = matmul(x, y);
      mark_step();
      wait_device_ops();
    });
    double g = gemm_gflops(kLoomMatmul, s);
    t.add({.section = "gemm", .benchmark = "loom matmul 2048^3", .mode = "lazy",
           .precision = precision, .time = format_time(s), .gflops = format("%.1f", g),
           .peak = percent(g / peak_gflops(bounds, precision)),
           .ratio = format("%.2f", g / bounds.sgemm_gflops), .vs = "speed/SGEMM"});
  }
}

void bench_sin_cos(const Options& o, Bounds& bounds, Table& t) {
  const int64_t n = kSinCosElements, threads = thread_count();
  const double bytes = 8.0 * static_cast<double>(n);  // read 4 and write 4 bytes per element
  {
    progress("stream scale and triad, 16M floats");
    std::vector<float> x(n), y(n);
    // First touch in the same blocks as the kernels, so pages sit near the threads using them.
    parallel_blocks(n, threads, [&](int64_t b, int64_t e) {
      std::fill(x.data() + b, x.data() + e, 1.0f);
      std::fill(y.data() + b, y.data() + e, 2.0f);
    });
    float* px = x.data();
    float* py = y.data();
    const double scale = best_seconds(o.reps, [&] {
      parallel_blocks(n, threads, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) py[i] = 1.0001f * px[i];
      });
    });
    const double triad = triad_bytes_s(o, n);
    bounds.copy_bytes_s = std::max(bytes / scale, triad);
    t.add({.section = "sincos", .benchmark = "stream scale y = a*x, 16M floats", .time = format_time(scale),
           .rate = format("%.1f GB/s", bytes / scale / 1e9)});
    t.add({.section = "sincos", .benchmark = "stream triad x = y + a*z, 16M floats",
           .time = format_time(1.5 * bytes / triad), .rate = format("%.1f GB/s", triad / 1e9)});
  }

  // Compute bound: each thread maps its own cache-resident block through cos then sin, so
  // memory never limits it; as many elements in all as the 16M of the real problem.
  progress("Eigen cos().sin() on cache-resident blocks");
  constexpr int64_t kBlock = 4096;  // 2 x 16 KiB: in L1/L2
  const double compute = best_seconds(o.reps, [&] {
    parallel_blocks(threads, threads, [&](int64_t, int64_t) {
      Eigen::ArrayXf in = Eigen::ArrayXf::LinSpaced(kBlock, -3.0f, 3.0f), out(kBlock);
      for (int64_t done = 0; done < n / threads; done += kBlock) {
        out = in.cos().sin();
        in(0) = out(kBlock - 1);  // a dependence, so no iteration can be skipped
      }
    });
  });
  const double memory = bytes / bounds.copy_bytes_s;
  const double bound = std::max(memory, compute);
  t.add({.section = "sincos", .benchmark = "Eigen cos().sin() in cache, 16M floats", .time = format_time(compute),
         .rate = format("%.2f Gelem/s", static_cast<double>(n) / compute / 1e9)});
  t.add({.section = "sincos",
         .benchmark = std::string("bound = max(memory, compute): ") + (memory > compute ? "memory" : "compute"),
         .time = format_time(bound), .rate = format("%.1f GB/s", bytes / bound / 1e9)});

  auto x = randn({n}, 3);
  mark_step();
  wait_device_ops();
  Tensor y;
  auto fused = compile([&] { return sin(cos(x)); }, {.capture = false});
  double compiled_s = 0;
  for (const auto& mode : o.modes) {
    if (mode == "captured") continue;  // one op pair: nothing to gain from skipping its trace
    progress("loom sin(cos(x)), " + mode);
    double s = best_seconds(o.reps, [&] {
      y = Tensor();  // the old output goes back to the allocator first, as in a training loop
      if (mode == "compiled") {
        y = fused();
      } else if (mode == "lazy") {
        y = sin(cos(x));
        mark_step();
      } else {
        EagerModeGuard eager(true);
        y = sin(cos(x));
      }
      wait_device_ops();
    });
    if (mode == "compiled") compiled_s = s;
    const bool vs_compiled = mode == "eager" && compiled_s > 0;
    t.add({.section = "sincos", .benchmark = "loom y = sin(cos(x)), 16M floats", .mode = mode,
           .time = format_time(s), .rate = format("%.1f GB/s", bytes / s / 1e9),
           .ratio = format("%.2f", (vs_compiled ? compiled_s : bound) / s),
           .vs = vs_compiled ? "speed/compiled" : "speed/bound"});
  }
  if (!o.has(o.modes, "eager")) return;
  // The baseline: one op at a time, each writing a fresh output, as a framework
  // whose allocator hands large blocks back to the system does (PyTorch's CPU eager mode:
  // glibc maps and unmaps each 64 MiB output, so every output page is faulted in anew).
  // Here the caching allocator is emptied before each op.
  progress("loom sin(cos(x)), eager with fresh outputs");
  const double fresh = best_seconds(o.reps, [&] {
    y = Tensor();
    EagerModeGuard eager(true);
    empty_device_cache();
    Tensor c = cos(x);
    wait_device_ops();
    empty_device_cache();
    y = sin(c);
    wait_device_ops();
  });
  Row r{.section = "sincos", .benchmark = "loom y = sin(cos(x)), 16M floats, fresh outputs", .mode = "eager",
        .time = format_time(fresh), .rate = format("%.1f GB/s", bytes / fresh / 1e9)};
  if (compiled_s > 0) {
    r.ratio = format("%.2f", compiled_s / fresh);
    r.vs = "speed/compiled";
  }
  t.add(r);
}

// "[d0,d1,...]"
std::string shape_text(const Shape& shape) {
  std::string dims;
  for (int64_t d : shape) {
    dims += dims.empty() ? '[' : ',';
    dims += std::to_string(d);
  }
  return dims + "]";
}

// The best time of fn compiled with step capture (its inputs materialised first).
double best_compiled_seconds(const Options& o, const std::function<Tensor()>& f) {
  mark_step();
  wait_device_ops();
  auto fn = compile([&] { return f(); });
  Tensor y;
  return best_seconds(o.reps, [&] {
    y = Tensor();  // the old output goes back to the allocator first, as in a training loop
    y = fn();
    wait_device_ops();
  });
}

// A step of one small kernel is mostly the step's own round trip: on the 2-core development VM
// a captured step of a 16-element kernel took 35-40 us from the call to the result, of which
// the kernel ran 0.5 us (two thread wake-ups). In a training step kernels run back to back and
// that cost comes once a step, so chains on tensors of at most this many elements are also timed
// kSameStep to a step, on kSameStep sets of operands, per kernel.
constexpr int64_t kSmallChain = int64_t{1} << 20;
constexpr int kSameStep = 8;

// The best time per kernel of `count` independent chains compiled into one captured step:
// f(i) builds chain i.
double best_compiled_seconds_per_kernel(const Options& o, int count,
                                        const std::function<Tensor(int)>& f) {
  mark_step();
  wait_device_ops();
  auto fn = compile([&] {
    std::vector<Tensor> out;
    for (int i = 0; i < count; ++i) out.push_back(f(i));
    return out;
  });
  std::vector<Tensor> y;
  return best_seconds(o.reps, [&] {
    y.clear();
    y = fn();
    wait_device_ops();
  }) / count;
}

// A fused chain's row: its time and GB/s over the triad's (`precision` "" for float32).
void add_fused_row(Table& t, const std::string& name, const char* precision, double seconds,
                   double bytes, double triad) {
  t.add({.section = "fused", .benchmark = name, .mode = "captured", .precision = precision,
         .time = format_time(seconds), .rate = format("%.1f GB/s", bytes / seconds / 1e9),
         .ratio = format("%.2f", bytes / seconds / triad), .vs = "speed/triad"});
}

// The batch-norm work of a bfloat16 ResNet step as the channels-last layout pass leaves it
// (compiler/channels_last.h): a conv's bfloat16 output x in [N,H,W,C], its per-channel mean and
// variance in float32, and the normalised, scaled and shifted ReLU written back as bfloat16
// for the next conv; and the backward's two sums over the gradient g, which the compiler stacks
// into one pass (compiler/stack_reductions.h). The bytes are those of the bfloat16 tensors (2
// per element) read and written once each.
void bench_fused_bf16_channels_last(const Options& o, Table& t, double triad) {
  struct Chain {
    const char* name;
    int reads, writes;  // full-size bfloat16 tensors
    Tensor (*fn)(const Tensor& x, const Tensor& g, const Tensor& scale, const Tensor& shift);
  };
  const Chain chains[] = {
      {"bn stats bf16 NHWC: mean(x), mean((x-mean)^2)", 2, 0,
       [](const Tensor& x, const Tensor&, const Tensor&, const Tensor&) {
         Tensor xf = x.to(DType::Float32);
         Tensor m = mean(xf, {0, 1, 2}, true);
         Tensor d = xf - m;
         return mean(d * d, {0, 1, 2}, true) + m;
       }},
      {"bn+relu bf16 NHWC: bf16(relu((x-m[c])*s[c] + b[c]))", 1, 1,
       [](const Tensor& x, const Tensor&, const Tensor& scale, const Tensor& shift) {
         return relu(x.to(DType::Float32) * scale + shift).to(DType::BFloat16);
       }},
      {"bn backward sums bf16 NHWC: sum(g), sum(g*(x-m[c])*s[c])", 2, 0,
       [](const Tensor& x, const Tensor& g, const Tensor& scale, const Tensor& shift) {
         Tensor gf = g.to(DType::Float32);
         Tensor xhat = (x.to(DType::Float32) - shift) * scale;
         return sum(gf, {0, 1, 2}, true) + sum(gf * xhat, {0, 1, 2}, true);
       }},
  };
  const Shape shapes[] = {{128, 32, 32, 16}, {128, 8, 8, 64}};
  for (const auto& shape : shapes) {
    const std::string dims = shape_text(shape);
    const int64_t numel = shape_numel(shape);
    for (const auto& chain : chains) {
      progress(std::string("loom ") + chain.name + " " + dims);
      const auto operands = [&](int i) {  // x, g, scale, shift of set i
        const uint64_t seed = 30 + 10 * static_cast<uint64_t>(i);
        return std::array<Tensor, 4>{randn(shape, seed).to(DType::BFloat16),
                                     randn(shape, seed + 3).to(DType::BFloat16),
                                     randn({1, 1, 1, shape[3]}, seed + 1) + 1.5,
                                     randn({1, 1, 1, shape[3]}, seed + 2)};
      };
      const auto set = operands(0);
      const double s = best_compiled_seconds(o, [&] { return chain.fn(set[0], set[1], set[2], set[3]); });
      const double bytes = 2.0 * static_cast<double>((chain.reads + chain.writes) * numel);
      const std::string name = std::string(chain.name) + " " + dims;
      add_fused_row(t, name, "bf16", s, bytes, triad);
      if (numel > kSmallChain) continue;
      std::vector<std::array<Tensor, 4>> sets;
      for (int i = 0; i < kSameStep; ++i) sets.push_back(operands(i));
      const double k = best_compiled_seconds_per_kernel(o, kSameStep, [&](int i) {
        return chain.fn(sets[i][0], sets[i][1], sets[i][2], sets[i][3]);
      });
      add_fused_row(t, name + ", " + std::to_string(kSameStep) + " a step", "bf16", k, bytes, triad);
    }
  }
}

void bench_fused(const Options& o, Table& t) {
  progress("stream triad, 16M floats");
  const double triad = triad_bytes_s(o, kSinCosElements);
  t.add({.section = "fused", .benchmark = "stream triad x = y + a*z, 16M floats = BOUND",
         .time = format_time(12.0 * static_cast<double>(kSinCosElements) / triad),
         .rate = format("%.1f GB/s", triad / 1e9)});
  struct Chain {
    const char* name;
    int full, channel;  // operands of the input's size, per-channel operands ([1,C,1,1])
    Tensor (*fn)(const std::vector<Tensor>& full, const std::vector<Tensor>& channel);
  };
  // The chains as a ResNet's training step has them (nn::functional's batch norm, its
  // gradient rules): each compiles to one fused kernel.
  const Chain chains[] = {
      {"bn+relu y = relu(x*scale[c] + shift[c])", 1, 2,
       [](const std::vector<Tensor>& f, const std::vector<Tensor>& c) { return relu(f[0] * c[0] + c[1]); }},
      {"bn+relu backward dx = (g*(y>0) - mg[c] - xhat*mgx[c])*istd[c]", 3, 4,
       [](const std::vector<Tensor>& f, const std::vector<Tensor>& c) {
         const Tensor& g = f[0];
         Tensor gm = where(gt(f[1], scalar_tensor(0)), g, scalar_tensor(0));
         Tensor xhat = (f[2] - c[0]) * c[1];
         return (gm - c[2] - xhat * c[3]) * c[1];
       }},
      {"residual y = relu(a + b)", 2, 0,
       [](const std::vector<Tensor>& f, const std::vector<Tensor>&) { return relu(f[0] + f[1]); }},
  };
  const Shape shapes[] = {{128, 16, 32, 32}, {32, 64, 32, 32}, {128, 64, 8, 8}};
  for (const auto& shape : shapes) {
    const std::string dims = shape_text(shape);
    const int64_t numel = shape_numel(shape);
    for (const auto& chain : chains) {
      progress(std::string("loom ") + chain.name + " " + dims);
      std::vector<Tensor> full, channel;
      for (int i = 0; i < chain.full; ++i) full.push_back(randn(shape, 10 + i));
      for (int i = 0; i < chain.channel; ++i) channel.push_back(randn({1, shape[1], 1, 1}, 20 + i) + 1.5);
      const double s = best_compiled_seconds(o, [&] { return chain.fn(full, channel); });
      const double bytes = 4.0 * static_cast<double>((chain.full + 1) * numel + chain.channel * shape[1]);
      const std::string name = std::string(chain.name) + " " + dims;
      add_fused_row(t, name, "", s, bytes, triad);
      if (numel > kSmallChain) continue;
      std::vector<std::vector<Tensor>> fulls(kSameStep);
      for (int k = 0; k < kSameStep; ++k)
        for (int i = 0; i < chain.full; ++i) fulls[k].push_back(randn(shape, 100 + 10 * k + i));
      const double k = best_compiled_seconds_per_kernel(
          o, kSameStep, [&](int i) { return chain.fn(fulls[i], channel); });
      add_fused_row(t, name + ", " + std::to_string(kSameStep) + " a step", "", k, bytes, triad);
    }
  }
  bench_fused_bf16_channels_last(o, t, triad);
}

}  // namespace loom::bench
