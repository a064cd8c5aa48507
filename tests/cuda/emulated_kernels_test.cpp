// Generated CUDA kernels run on the host: the kernel's CUDA C, with a shim (the thread
// indices, CUDA's vector types and bit casts, barriers, warp shuffles and votes), is compiled
// by the host's C++ compiler into a shared library and launched block by block. A kernel
// without barriers runs one thread at a time, exactly as the GPU would run it; one that
// synchronises its threads (a reduction) runs each block's threads as real threads meeting at
// real barriers. Results are compared with what the CPU backend computes for the same tensors,
// so the kernels' indexing and combining are checked without a GPU: the elementwise vector loop
// (codegen_fused.cpp) and its fallback on unaligned addresses, strided loads through a permute,
// the reductions of every layout (codegen_reduce.cpp), split over two launches included, and
// Im2col's windows (codegen_pool.cpp).
#include "lazy/ops_util.h"
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/cuda_target.h"
#include "temp_dir.h"
#include "test_util.h"

#include <loom/bfloat16.h>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace loom {
namespace {

namespace cuda = runtime::cuda;

// What the generated source needs of CUDA, on the host. A kernel that synchronises its
// threads (__syncthreads, warp shuffles and votes: the reductions, the row scatter) runs each
// block's threads as real threads meeting at barriers, __shared__ arrays being statics that
// the block's threads share (blocks run one after another); others run thread by thread.
constexpr const char* kShim = R"(#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static
struct Dim { long long x = 0; };
Dim blockIdx, blockDim, gridDim;
thread_local Dim threadIdx;
template <class To, class From> To bits(From f) { To t; std::memcpy(&t, &f, sizeof t); return t; }
inline float __uint_as_float(unsigned u) { return bits<float>(u); }
inline unsigned __float_as_uint(float f) { return bits<unsigned>(f); }
inline double __longlong_as_double(long long u) { return bits<double>(u); }
inline int atomicCAS(int* p, int expected, int v) {  // (only report_error calls it)
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  const int old = *p;
  if (old == expected) *p = v;
  return old;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
template <class A, class B> auto min(A a, B b) { return a < b ? a : b; }  // CUDA's overloads
template <class A, class B> auto max(A a, B b) { return a < b ? b : a; }
// The block's barrier, one per warp, and each thread's slot for exchanges within its warp.
std::barrier<>* block_barrier;
std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
std::vector<unsigned long long> lanes;
inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline std::barrier<>& my_warp() { return *warp_barriers[threadIdx.x / 32]; }
template <class T> T __shfl_down_sync(unsigned, T v, int delta, int width = 32) {
  const long long t = threadIdx.x;
  lanes[t] = 0;
  std::memcpy(&lanes[t], &v, sizeof v);
  my_warp().arrive_and_wait();
  T r = v;
  if (t % width + delta < width) std::memcpy(&r, &lanes[t + delta], sizeof r);
  my_warp().arrive_and_wait();
  return r;
}
inline unsigned __ballot_sync(unsigned, int pred) {
  const long long t = threadIdx.x, w0 = t / 32 * 32;
  lanes[t] = pred != 0;
  my_warp().arrive_and_wait();
  unsigned r = 0;
  for (long long i = w0; i < w0 + 32 && i < blockDim.x; ++i)
    r |= (lanes[i] ? 1u : 0u) << (i - w0);
  my_warp().arrive_and_wait();
  return r;
}
// Runs `kernel` for every block: thread by thread, or, with `together`, as blockDim.x threads.
template <class F> void launch(long long blocks, int threads, bool together, F kernel) {
  gridDim.x = blocks;
  blockDim.x = threads;
  for (blockIdx.x = 0; blockIdx.x < blocks; ++blockIdx.x) {
    if (!together) {
      for (threadIdx.x = 0; threadIdx.x < threads; ++threadIdx.x) kernel();
      continue;
    }
    std::barrier<> block(threads);
    block_barrier = &block;
    warp_barriers.clear();
    for (int w = 0; w < threads; w += 32)
      warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32, threads - w)));
    lanes.assign(threads, 0);
    std::vector<std::thread> team;
    for (int t = 0; t < threads; ++t)
      team.emplace_back([&, t] {
        threadIdx.x = t;
        kernel();
        // A thread that has returned no longer holds the others up, as on the GPU.
        my_warp().arrive_and_drop();
        block.arrive_and_drop();
      });
    for (auto& th : team) th.join();
  }
}
template <class T> struct Vec4 { T x, y, z, w; };
using float4 = Vec4<float>; using int4 = Vec4<int>;
using ushort4 = Vec4<unsigned short>; using uchar4 = Vec4<unsigned char>;
template <class T> Vec4<T> make4(T a, T b, T c, T d) { return {a, b, c, d}; }
inline float4 make_float4(float a, float b, float c, float d) { return make4(a, b, c, d); }
inline int4 make_int4(int a, int b, int c, int d) { return make4(a, b, c, d); }
using u16 = unsigned short;
inline ushort4 make_ushort4(u16 a, u16 b, u16 c, u16 d) { return make4(a, b, c, d); }
inline uchar4 make_uchar4(unsigned char a, unsigned char b, unsigned char c, unsigned char d) {
  return make4(a, b, c, d);
}
)";

// One instruction's kernels, compiled for the host.
class HostKernels {
 public:
  HostKernels(const cuda::InstrCode& code, std::size_t args) : dir_("emulated_kernels") {
    std::string src = std::string(kShim) + cuda::prelude() + code.source;
    const bool together = code.source.find("__syncthreads") != std::string::npos ||
                          code.source.find("_sync(") != std::string::npos;
    // A launcher per entry point: every block, every thread.
    for (const auto& l : code.launches) {
      src += "extern \"C\" void run_" + l.entry +
             "(long long blocks, int threads, void* out, const void* const* a) {\n"
             "  launch(blocks, threads, " + (together ? "true" : "false") + ", [&] { " +
             l.entry + "(out";
      for (std::size_t k = 0; k < args; ++k) src += ", a[" + std::to_string(k) + "]";
      src += "); });\n}\n";
    }
    // A new name each time: a library the loader keeps loaded after dlclose (C++ statics can
    // make it so) would otherwise be handed back for the next one.
    static int made = 0;
    std::string name = "k";  // appended, not "k" + ...: GCC 12 warns falsely there (-Wrestrict)
    name += std::to_string(made++);
    std::ofstream(dir_ / (name + ".cpp")) << src;
    so_path_ = dir_ / (name + ".so");
    const std::string cmd = std::string(LOOM_HOST_CXX) +
                            " -std=c++20 -O1 -fPIC -shared -pthread -w -o " + so_path_ + " " +
                            (dir_ / (name + ".cpp")) + " 2>" + (dir_ / "log");
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "log");
      ADD_FAILURE() << "the host compiler failed on\n" << src << "\n" << log.rdbuf();
      return;
    }
    so_ = dlopen(so_path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(so_, nullptr) << dlerror();
  }
  ~HostKernels() {
    if (so_) dlclose(so_);
  }
  HostKernels(const HostKernels&) = delete;
  HostKernels& operator=(const HostKernels&) = delete;

  // Runs the launches in order, as the backend would.
  void run(const cuda::InstrCode& code, void* out, const std::vector<const void*>& args) const {
    ASSERT_NE(so_, nullptr);
    using Run = void (*)(long long, int, void*, const void* const*);
    for (const auto& l : code.launches) {
      auto fn = reinterpret_cast<Run>(dlsym(so_, ("run_" + l.entry).c_str()));
      ASSERT_NE(fn, nullptr) << l.entry;
      fn(l.blocks, l.threads, out, args.data());
    }
  }

 private:
  test::TempDir dir_;
  std::string so_path_;
  void* so_ = nullptr;
};

// Host bytes of `t` (computed by the CPU backend).
std::vector<unsigned char> bytes_of(const Tensor& t) { return t.to_host().bytes; }

// A copy of `b` at byte `shift` of a 64-byte aligned block (shift 0: aligned for vector access).
struct Placed {
  std::vector<unsigned char> block;
  std::size_t shift;
  Placed(const std::vector<unsigned char>& b, std::size_t s) : block(b.size() + 128), shift(s) {
    std::memcpy(data(), b.data(), b.size());
  }
  unsigned char* data() {
    auto p = reinterpret_cast<std::uintptr_t>(block.data());
    return reinterpret_cast<unsigned char*>((p + 63) / 64 * 64 + shift);
  }
};

// The instruction of `out`'s CUDA program that makes it (its operands are inputs, or their
// reshapes), run on the host with every operand and the result placed at byte `shift`; the
// result's bytes.
std::vector<unsigned char> emulate(const Tensor& out, std::size_t shift, bool* vectorised) {
  const ir::Graph g = test::graph_of(out);
  const ir::Program p = compiler::compile(g, cuda::cuda_target());
  const auto n_in = static_cast<int>(p.inputs.size());
  // The instruction that makes the result (the others only reshape the inputs).
  int fused = p.outputs.at(0) - n_in;
  while (fused >= 0 && p.instrs[fused].op == ir::Op::Reshape)
    fused = p.instrs[fused].args[0] - n_in;
  if (fused < 0) {
    ADD_FAILURE() << "the result is an input\n" << ir::to_text(p);
    return {};
  }
  const ir::Instr& in = p.instrs[fused];
  const cuda::InstrCode code = cuda::generate(p, fused, "k");
  *vectorised = code.source.find("lane(") != std::string::npos;
  // Each operand: a graph input, possibly through reshapes (which share its memory).
  std::vector<Placed> placed;
  placed.reserve(in.args.size() + 1);
  std::vector<const void*> args;
  for (int slot : in.args) {
    while (slot >= n_in && p.instrs[slot - n_in].op == ir::Op::Reshape)
      slot = p.instrs[slot - n_in].args[0];
    if (slot >= n_in) {
      ADD_FAILURE() << "operand $" << slot << " is computed, not an input\n" << ir::to_text(p);
      return {};
    }
    auto buf = std::static_pointer_cast<runtime::DeviceBuffer>(g.nodes[g.inputs[slot]]->payload());
    const auto& storage = buf->wait("emulate");
    std::vector<unsigned char> b(static_cast<std::size_t>(shape_numel(buf->shape)) *
                                 dtype_size(buf->dtype));
    std::memcpy(b.data(), storage.data(), b.size());
    placed.emplace_back(b, shift);
    args.push_back(placed.back().data());
  }
  const std::size_t out_bytes =
      static_cast<std::size_t>(shape_numel(in.shape)) * dtype_size(in.dtype);
  placed.emplace_back(std::vector<unsigned char>(out_bytes, 0xEE), shift);
  HostKernels kernels(code, in.args.size());
  kernels.run(code, placed.back().data(), args);
  std::vector<unsigned char> result(out_bytes);
  std::memcpy(result.data(), placed.back().data(), out_bytes);
  return result;
}

std::vector<float> floats(const std::vector<unsigned char>& b, DType t) {
  std::vector<float> v;
  if (t == DType::Float32) {
    v.resize(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
  } else if (t == DType::BFloat16) {
    for (std::size_t i = 0; i + 1 < b.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, &b[i], 2);
      v.push_back(bfloat16::from_bits(h));
    }
  } else if (t == DType::Int64) {
    for (std::size_t i = 0; i + 7 < b.size(); i += 8) {
      int64_t k;
      std::memcpy(&k, &b[i], 8);
      v.push_back(static_cast<float>(k));
    }
  } else {
    for (auto c : b) v.push_back(static_cast<float>(c));
  }
  return v;
}

std::vector<float> wave(int64_t n, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = 3 * std::sin(scale * static_cast<float>(i));
  return v;
}

// `out` emulated aligned (the vector loop) and unaligned (the element loop): the two agree bit
// for bit, and with the CPU backend within `tol` (relative to max(1, |value|): the host's
// expf is not the CPU backend's exp).
// The compiler that built loom, which these tests run kernels through: absent where the test
// binary was carried to another machine (tools/gpu-run.sh's bundle), and then they skip.
bool host_compiler_here() { return std::filesystem::exists(LOOM_HOST_CXX); }
constexpr const char* kNoCompiler = "no host C++ compiler at " LOOM_HOST_CXX " to run kernels with";

void check(const Tensor& out, double tol, bool expect_vector) {
  if (const char* v = std::getenv("LOOM_CUDA_VECTOR"); v && std::string(v) == "0")
    expect_vector = false;  // the element loop alone, as asked
  bool vectorised = false, unused = false;
  const auto aligned = emulate(out, 0, &vectorised);
  const auto unaligned = emulate(out, 2, &unused);
  EXPECT_EQ(vectorised, expect_vector);
  ASSERT_FALSE(aligned.empty());
  EXPECT_EQ(aligned, unaligned) << "the vector loop and the element loop differ";
  mark_step();
  const auto want = floats(bytes_of(out), out.dtype()), got = floats(aligned, out.dtype());
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && bad < 10; ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * std::max(1.0f, std::abs(want[i]))))
      ADD_FAILURE() << "element " << i << ": emulated " << got[i] << ", CPU " << want[i], ++bad;
}

// A cross-entropy gradient over bfloat16 logits, as the CUDA decoder step computes it: the
// logits read in order (4 bfloat16 a thread), per-row values and the class index broadcast.
TEST(EmulatedKernels, SoftmaxGradientOverBFloat16Logits) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  const int64_t rows = 24, classes = 96;
  auto logits = from_vector(wave(rows * classes, 0.37f), {rows, classes}).to(DType::BFloat16);
  auto m = from_vector(wave(rows, 0.5f), {rows, 1});
  auto r = from_vector(wave(rows, 0.9f), {rows, 1});
  std::vector<float> target(rows), index(classes);
  for (int64_t i = 0; i < rows; ++i) target[i] = static_cast<float>((i * 7) % classes);
  for (int64_t i = 0; i < classes; ++i) index[i] = static_cast<float>(i);
  auto t = from_vector(target, {rows, 1});
  auto iota = from_vector(index, {1, classes});
  mark_step();
  auto grad = (where(eq(iota, t), r, zeros({1}, DType::Float32)) +
               r * exp(logits.to(DType::Float32) - m))
                  .to(DType::BFloat16);
  check(grad, 1e-2, true);
}

// Float32 operands read in order and a float32 result: float4 loads and stores.
TEST(EmulatedKernels, Float32Chain) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  const int64_t n = 4096;
  auto a = from_vector(wave(n, 0.31f), {8, n / 8});
  auto b = from_vector(wave(n, 0.17f), {8, n / 8});
  auto c = from_vector(wave(8, 1.3f), {8, 1});
  mark_step();
  auto y = relu(a * b) * c + 1.0;
  check(y, 0, true);
}

// A bool result (a comparison of float32 values): uchar4 stores.
TEST(EmulatedKernels, BoolResult) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  const int64_t n = 2048;
  auto a = from_vector(wave(n, 0.21f), {n});
  auto b = from_vector(wave(n, 0.29f), {n});
  mark_step();
  check(gt(a * 2.0, b), 0, true);
}

// An operand read through a permute of attention's heads ([B,T,H,D] as [B,H,T,D]: a strided
// load, one element a thread) beside one read in order, into a bfloat16 result; then two
// slices of that permute, loads at an offset.
TEST(EmulatedKernels, PermutedOperand) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  auto x = from_vector(wave(2 * 16 * 4 * 32, 0.23f), {2, 16, 4, 32});
  auto y = from_vector(wave(2 * 4 * 16 * 32, 0.41f), {2, 4, 16, 32});
  mark_step();
  check((permute(x, {0, 2, 1, 3}) * y).to(DType::BFloat16), 0, true);
  // The halves of each head ([.., 16] of [.., 32]), read at offsets 16 and 0 (no operand in
  // order: no vector loads).
  auto h = permute(x, {0, 2, 1, 3});
  check(slice(h, 3, 16, 32) * 2.0 - slice(h, 3, 0, 16), 0, false);
}

// A size that is no multiple of 4: the element loop alone.
TEST(EmulatedKernels, OddSizeTakesTheElementLoop) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  const int64_t n = 4099;
  auto a = from_vector(wave(n, 0.31f), {n});
  mark_step();
  check(a * a - 2.0, 0, false);
}

// A reduction emulated (its threads together, at barriers) against the CPU backend's value:
// both fold float sums in double, in different orders, so they agree to about a float's
// rounding; maxima and argmaxima exactly (NaN included); copies (Im2col) exactly too.
// `launches`: how many its code has (-1: not checked).
void check_reduction(const Tensor& out, double tol, int launches) {
  bool unused = false;
  const auto got_bytes = emulate(out, 0, &unused);
  ASSERT_FALSE(got_bytes.empty());
  const ir::Program p = compiler::compile(test::graph_of(out), cuda::cuda_target());
  const auto n_in = static_cast<int>(p.inputs.size());
  int made = p.outputs.at(0) - n_in;
  while (p.instrs[made].op == ir::Op::Reshape) made = p.instrs[made].args[0] - n_in;
  if (launches > 0) {
    EXPECT_EQ(static_cast<int>(cuda::generate(p, made, "k").launches.size()), launches);
  }
  mark_step();
  const auto want = floats(bytes_of(out), out.dtype()), got = floats(got_bytes, out.dtype());
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && bad < 10; ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    if (!(std::abs(got[i] - want[i]) <= tol * std::max(1.0f, std::abs(want[i]))))
      ADD_FAILURE() << "element " << i << ": emulated " << got[i] << ", CPU " << want[i], ++bad;
  }
}

// Row sums over a prologue (a softmax's denominator from bfloat16 logits: a warp a row), row
// maxima over rows longer than a warp folds (the whole block a row, in shared memory) and sums
// of short rows (a thread a row).
TEST(EmulatedKernels, RowReductions) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  auto logits = from_vector(wave(48 * 96, 0.37f), {48, 96}).to(DType::BFloat16);
  auto m = from_vector(wave(48, 0.5f), {48, 1});
  auto wide = from_vector(wave(6 * 3000, 0.013f), {6, 3000});
  auto short_rows = from_vector(wave(700 * 10, 0.29f), {700, 10});
  mark_step();
  check_reduction(sum(exp(logits.to(DType::Float32) - m), {1}, true), 1e-6, 1);
  check_reduction(amax(wide, {1}), 0, 1);
  check_reduction(sum(short_rows, {1}), 1e-6, 1);
}

// Column sums (outputs innermost: a block holds neighbouring outputs) and per-channel means
// over [N, C, H, W] (BatchNorm's statistics: few outputs over many elements, so each is cut
// into chunks and a second launch combines their partial results).
TEST(EmulatedKernels, ColumnAndChunkedReductions) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  auto cols = from_vector(wave(300 * 48, 0.07f), {300, 48});
  auto act = from_vector(wave(16 * 4 * 32 * 32, 0.011f), {16, 4, 32, 32});
  mark_step();
  check_reduction(sum(cols, {0}), 1e-6, -1);
  check_reduction(mean(act, {0, 2, 3}), 1e-6, 2);
}

// ArgMax over rows: the first maximum wins, and a NaN counts as the maximum.
TEST(EmulatedKernels, ArgMaxOverRows) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  auto v = wave(20 * 70, 0.9f);
  v[3 * 70 + 11] = std::numeric_limits<float>::quiet_NaN();
  v[5 * 70 + 2] = v[5 * 70 + 40] = 100.0f;
  auto x = from_vector(v, {20, 70});
  mark_step();
  check_reduction(argmax(x, 1), 0, 1);
}

// Im2col (compiler/conv_im2col.h), one thread per element of [C*kh*kw, N*Ho*Wo]: every
// window geometry the CPU's kernel takes, bit for bit (it copies elements), in float32 and
// bfloat16.
TEST(EmulatedKernels, Im2colWindows) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  auto x = from_vector(wave(2 * 3 * 9 * 7, 0.31f), {2, 3, 9, 7});
  auto y = from_vector(wave(16 * 4 * 4, 0.17f), {1, 16, 4, 4}).to(DType::BFloat16);
  mark_step();
  const ir::Conv2dAttr odd{.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}};
  check_reduction(lazy::apply(ir::Op::Im2col, {x}, ir::Conv2dGradAttr{odd, {3, 2}}), 0, 1);
  const ir::Conv2dAttr pad1{.padding = {1, 1}};
  check_reduction(lazy::apply(ir::Op::Im2col, {y}, ir::Conv2dGradAttr{pad1, {3, 3}}), 0, 1);
}

}  // namespace
}  // namespace loom
