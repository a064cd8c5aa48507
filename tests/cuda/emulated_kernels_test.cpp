// Generated elementwise CUDA kernels run on the host: the kernel's CUDA C, with a few lines of
// shim (the thread indices as globals, CUDA's vector types, its bit casts), is compiled by the
// host's C++ compiler into a shared library and launched by looping over every block and
// thread in turn. An elementwise kernel has no shared memory and no barrier, so that loop runs
// it exactly as the GPU would, one thread at a time. Its results are compared with what the
// CPU backend computes for the same tensors. This checks the indexing of the vector loop
// (codegen_fused.cpp) and its fallback on unaligned addresses without a GPU.
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
#include <string>
#include <vector>

namespace loom {
namespace {

namespace cuda = runtime::cuda;

// What the generated source needs of CUDA, on the host.
constexpr const char* kShim = R"(#include <cmath>
#include <cstring>
#include <filesystem>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
struct Dim { long long x = 0; };
Dim blockIdx, threadIdx, blockDim, gridDim;
template <class To, class From> To bits(From f) { To t; std::memcpy(&t, &f, sizeof t); return t; }
inline float __uint_as_float(unsigned u) { return bits<float>(u); }
inline unsigned __float_as_uint(float f) { return bits<unsigned>(f); }
inline double __longlong_as_double(long long u) { return bits<double>(u); }
inline int atomicCAS(int* p, int expected, int v) {
  const int old = *p;
  if (old == expected) *p = v;
  return old;
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
    // A launcher per entry point: every block, every thread, in turn.
    for (const auto& l : code.launches) {
      src += "extern \"C\" void run_" + l.entry +
             "(long long blocks, int threads, void* out, const void* const* a) {\n"
             "  gridDim.x = blocks; blockDim.x = threads;\n"
             "  for (blockIdx.x = 0; blockIdx.x < blocks; ++blockIdx.x)\n"
             "    for (threadIdx.x = 0; threadIdx.x < threads; ++threadIdx.x)\n      " +
             l.entry + "(out";
      for (std::size_t k = 0; k < args; ++k) src += ", a[" + std::to_string(k) + "]";
      src += ");\n}\n";
    }
    std::ofstream(dir_ / "k.cpp") << src;
    const std::string cmd = std::string(LOOM_HOST_CXX) + " -std=c++17 -O1 -fPIC -shared -w -o " +
                            (dir_ / "k.so") + " " + (dir_ / "k.cpp") + " 2>" + (dir_ / "log");
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "log");
      ADD_FAILURE() << "the host compiler failed on\n" << src << "\n" << log.rdbuf();
      return;
    }
    so_ = dlopen((dir_ / "k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
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

// The one fused elementwise instruction of `out`'s CUDA program, run on the host with every
// operand and the result placed at byte `shift`; the result's bytes.
std::vector<unsigned char> emulate(const Tensor& out, std::size_t shift, bool* vectorised) {
  const ir::Graph g = test::graph_of(out);
  const ir::Program p = compiler::compile(g, cuda::cuda_target());
  const auto n_in = static_cast<int>(p.inputs.size());
  int fused = -1;
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i)
    if (p.instrs[i].fusion) {
      EXPECT_EQ(fused, -1) << "one fusion expected\n" << ir::to_text(p);
      fused = i;
    }
  if (fused < 0) {
    ADD_FAILURE() << "no fusion\n" << ir::to_text(p);
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

// A size that is no multiple of 4: the element loop alone.
TEST(EmulatedKernels, OddSizeTakesTheElementLoop) {
  if (!host_compiler_here()) GTEST_SKIP() << kNoCompiler;
  test::fresh_engine();
  const int64_t n = 4099;
  auto a = from_vector(wave(n, 0.31f), {n});
  mark_step();
  check(a * a - 2.0, 0, false);
}

}  // namespace
}  // namespace loom
