// oneDNN's convolutions and matmul behind onednn.h: the primitive cache, the reorders between
// loom's layouts and oneDNN's blocked ones, the per-thread buffers, and the thread count.
#include "runtime/cpu/onednn.h"

#include "runtime/cpu/heap_count.h"

#include <loom/error.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom::runtime::onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

std::atomic<int64_t> g_created{0};

enum class Kind : uint8_t { kForward, kGradInput, kGradWeight, kMatmul, kReorder };

// Everything a primitive is built from. `dims` holds the conv's geometry (ConvGeometry's 16
// fields in order), the matmul's batch, m, n, k, ta, tb, or a reorder's dims and strides. The
// thread count is part of it: oneDNN splits the work for the thread count it was created under.
struct Key {
  Kind kind;
  DType dtype;
  Layout layout;
  bool bias, relu;
  int threads;
  std::array<int64_t, 16> dims;
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = std::hash<int>()(static_cast<int>(k.kind) | static_cast<int>(k.dtype) << 4 |
                                     static_cast<int>(k.layout) << 8 | k.bias << 9 |
                                     k.relu << 10 | k.threads << 11);
    for (int64_t d : k.dims) h = h * 0x9e3779b97f4a7c15ull + std::hash<int64_t>()(d);
    return h;
  }
};

// One of a primitive's tensors: `user` in loom's layout (its handle set at each call), and,
// where the primitive wants another layout, `inner` in that layout (its handle a per-thread
// buffer) with the reorder between them (user -> inner for an operand, inner -> user for the
// result).
struct Operand {
  memory user, inner;
  dnnl::primitive reorder;
  std::size_t inner_bytes = 0, reorder_scratchpad = 0;
};

struct Entry {
  dnnl::primitive primitive;
  std::string implementation;
  std::array<Operand, 3> operands;  // a, b, out, in the roles of onednn.h
  std::array<int, 3> args{};        // their DNNL_ARG_*
  memory bias;                      // the binary post-op's operand, if any
  memory scratchpad;
  std::size_t scratchpad_bytes = 0;
};

// What one thread keeps: its stream, its primitives, and the buffers that hold the blocked
// copies and the scratchpad, grown to the largest call and never shrunk.
struct ThreadState {
  dnnl::stream stream;
  std::unordered_map<Key, Entry, KeyHash> cache;
  enum Slot { kA, kB, kOut, kScratchpad, kSlots };
  std::array<std::vector<std::byte>, kSlots> buffers;

  void* buffer(Slot s, std::size_t bytes) {
    constexpr std::size_t kAlign = 64;
    auto& b = buffers[s];
    if (b.size() < bytes + kAlign) b.resize(bytes + kAlign);
    const auto addr = reinterpret_cast<std::uintptr_t>(b.data());
    return b.data() + (kAlign - addr % kAlign) % kAlign;
  }
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

ThreadState& thread_state() {
  thread_local ThreadState state{dnnl::stream(cpu_engine()), {}, {}};
  return state;
}

// loom's thread count: TBB's limit (global_control, e.g. --threads) within the arena the
// caller runs in. oneDNN's OpenMP team gets the same, set on this thread before each call.
int loom_threads() {
  const auto limit =
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  const auto arena = static_cast<std::size_t>(std::max(1, tbb::this_task_arena::max_concurrency()));
  return static_cast<int>(std::max<std::size_t>(1, std::min(limit, arena)));
}

memory::data_type data_type(DType t) {
  if (t == DType::Float32) return memory::data_type::f32;
  if (t == DType::BFloat16) return memory::data_type::bf16;
  throw Error(std::string("oneDNN: expected float32 or bfloat16, got ") + dtype_name(t));
}

[[noreturn]] void fail(const std::string& what, const dnnl::error& e) {
  throw Error("oneDNN: " + what + ": " + e.what());
}

void check(dnnl_status_t status, const char* what) {
  if (status != dnnl_success)
    throw Error(std::string("oneDNN: ") + what + " failed (status " +
                std::to_string(static_cast<int>(status)) + ")");
}

// Runs `p` with `args` through the C API, which takes them as an array: the C++ API's
// std::unordered_map argument costs allocations of its own at every call.
void execute(const dnnl::primitive& p, const dnnl::stream& s, const dnnl_exec_arg_t* args,
             int nargs) {
  check(dnnl_primitive_execute(p.get(), s.get(), nargs, args), "execute");
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Fills `op` for a tensor that loom holds as `user_desc` and the primitive wants as `want`.
void bind(Operand& op, const memory::desc& user_desc, const memory::desc& want, bool result) {
  const auto& engine = cpu_engine();
  op.user = memory(user_desc, engine, DNNL_MEMORY_NONE);
  if (want == user_desc) return;
  op.inner = memory(want, engine, DNNL_MEMORY_NONE);
  op.inner_bytes = want.get_size();
  const auto pd = result ? dnnl::reorder::primitive_desc(op.inner, op.user, user_scratchpad())
                         : dnnl::reorder::primitive_desc(op.user, op.inner, user_scratchpad());
  op.reorder = dnnl::reorder(pd);
  op.reorder_scratchpad = pd.scratchpad_desc().get_size();
}

// The conv's memory descriptors in loom's layouts.
struct ConvDescs {
  memory::desc x, w, y;
  memory::dims strides, dilates, padding;
};

ConvDescs conv_descs(const ConvGeometry& g, memory::data_type dt, Tag act, Tag weights) {
  memory::dims wdims{g.o, g.c / g.groups, g.kh, g.kw};
  if (g.groups > 1) wdims.insert(wdims.begin(), g.groups), wdims[1] = g.o / g.groups;
  const Tag wtag = weights == Tag::any ? Tag::any : g.groups > 1 ? Tag::goihw : Tag::oihw;
  return {memory::desc({g.n, g.c, g.h, g.w}, dt, act), memory::desc(wdims, dt, wtag),
          memory::desc({g.n, g.o, g.oh, g.ow}, dt, act), {g.sh, g.sw},
          {g.dh - 1, g.dw - 1}, {g.ph, g.pw}};
}

std::string describe(ConvPass pass, const ConvGeometry& g, DType dtype) {
  const char* name = pass == ConvPass::kForward     ? "conv2d"
                     : pass == ConvPass::kGradInput ? "conv2d_grad_input"
                                                    : "conv2d_grad_weight";
  return std::string(name) + " " + dtype_name(dtype) + " n" + std::to_string(g.n) + " c" +
         std::to_string(g.c) + " " + std::to_string(g.h) + "x" + std::to_string(g.w) + " o" +
         std::to_string(g.o) + " k" + std::to_string(g.kh) + "x" + std::to_string(g.kw) + " s" +
         std::to_string(g.sh) + " g" + std::to_string(g.groups);
}

// The post-ops of an epilogue: the bias as a binary add of a [1, channels, 1...] vector, then
// relu, both after the whole sum.
void add_epilogue(dnnl::primitive_attr& attr, Epilogue e, const memory::dims& bias_dims,
                  Entry& entry) {
  if (!e.bias && !e.relu) return;
  dnnl::post_ops ops;
  if (e.bias) {
    const memory::desc bias(bias_dims, memory::data_type::f32,
                            bias_dims.size() == 4 ? Tag::abcd : Tag::abc);
    ops.append_binary(dnnl::algorithm::binary_add, bias);
    entry.bias = memory(bias, cpu_engine(), DNNL_MEMORY_NONE);
  }
  if (e.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  attr.set_post_ops(ops);
}

template <class PD>
void finish(Entry& entry, const PD& pd) {
  entry.implementation = pd.impl_info_str();
  entry.scratchpad = memory(pd.scratchpad_desc(), cpu_engine(), DNNL_MEMORY_NONE);
  entry.scratchpad_bytes = pd.scratchpad_desc().get_size();
  for (const auto& op : entry.operands)
    entry.scratchpad_bytes = std::max(entry.scratchpad_bytes, op.reorder_scratchpad);
  g_created.fetch_add(1, std::memory_order_relaxed);
}

Entry make_conv(ConvPass pass, const ConvGeometry& g, DType dtype, Layout layout, Epilogue e) {
  using namespace dnnl;
  const auto dt = data_type(dtype);
  const bool channels_last =
      layout == Layout::kChannelsLast || layout == Layout::kChannelsLastBlocked;
  const ConvDescs user = conv_descs(g, dt, channels_last ? Tag::nhwc : Tag::nchw, Tag::oihw);
  const ConvDescs want = layout == Layout::kPlain         ? user
                         : layout == Layout::kChannelsLast ? conv_descs(g, dt, Tag::nhwc, Tag::any)
                                                           : conv_descs(g, dt, Tag::any, Tag::any);
  const auto& engine = cpu_engine();
  const auto alg = algorithm::convolution_direct;
  const auto& p = want.padding;
  Entry entry;
  primitive_attr attr = user_scratchpad();
  if (pass == ConvPass::kForward) add_epilogue(attr, e, {1, g.o, 1, 1}, entry);
  // The backward passes take the forward's primitive descriptor as a hint.
  const convolution_forward::primitive_desc forward(
      convolution_forward::desc(prop_kind::forward_training, alg, want.x, want.w, want.y,
                                want.strides, want.dilates, p, p),
      attr, engine);
  switch (pass) {
    case ConvPass::kForward:
      bind(entry.operands[0], user.x, forward.src_desc(), false);
      bind(entry.operands[1], user.w, forward.weights_desc(), false);
      bind(entry.operands[2], user.y, forward.dst_desc(), true);
      entry.args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
      entry.primitive = convolution_forward(forward);
      finish(entry, forward);
      break;
    case ConvPass::kGradInput: {
      const convolution_backward_data::primitive_desc pd(
          convolution_backward_data::desc(alg, want.x, want.w, want.y, want.strides, want.dilates,
                                          p, p),
          user_scratchpad(), engine, forward);
      bind(entry.operands[0], user.y, pd.diff_dst_desc(), false);
      bind(entry.operands[1], user.w, pd.weights_desc(), false);
      bind(entry.operands[2], user.x, pd.diff_src_desc(), true);
      entry.args = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC};
      entry.primitive = convolution_backward_data(pd);
      finish(entry, pd);
      break;
    }
    case ConvPass::kGradWeight: {
      const convolution_backward_weights::primitive_desc pd(
          convolution_backward_weights::desc(alg, want.x, want.w, want.y, want.strides,
                                             want.dilates, p, p),
          user_scratchpad(), engine, forward);
      bind(entry.operands[0], user.x, pd.src_desc(), false);
      bind(entry.operands[1], user.y, pd.diff_dst_desc(), false);
      bind(entry.operands[2], user.w, pd.diff_weights_desc(), true);
      entry.args = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS};
      entry.primitive = convolution_backward_weights(pd);
      finish(entry, pd);
      break;
    }
  }
  return entry;
}

Entry make_matmul(const MatmulShape& s, DType dtype, Epilogue e) {
  using namespace dnnl;
  const auto dt = data_type(dtype);
  // a and b as loom stores them, and as the primitive reads them (matmul_read_strides): a
  // padded operand is reordered into the entry's per-thread buffer at each call (bind, run).
  const memory::desc a({s.batch, s.m, s.k}, dt,
                       s.ta ? memory::dims{s.m * s.k, 1, s.m} : memory::dims{s.m * s.k, s.k, 1});
  const memory::desc b({s.batch, s.k, s.n}, dt,
                       s.tb ? memory::dims{s.k * s.n, 1, s.k} : memory::dims{s.k * s.n, s.n, 1});
  const MatmulStrides read = matmul_read_strides(s, dtype);
  const memory::desc a_read =  // padded only where stored k-major (ta)
      read.a == (s.ta ? s.m : s.k)
          ? a
          : memory::desc({s.batch, s.m, s.k}, dt, memory::dims{read.a * s.k, 1, read.a});
  const memory::desc b_read =  // likewise (not tb)
      read.b == (s.tb ? s.k : s.n)
          ? b
          : memory::desc({s.batch, s.k, s.n}, dt, memory::dims{read.b * s.k, read.b, 1});
  const memory::desc c({s.batch, s.m, s.n}, dt, Tag::abc);
  Entry entry;
  primitive_attr attr = user_scratchpad();
  add_epilogue(attr, e, {1, 1, s.n}, entry);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_read, b_read, c), attr,
                                        cpu_engine());
  bind(entry.operands[0], a, pd.src_desc(), false);
  bind(entry.operands[1], b, pd.weights_desc(), false);
  bind(entry.operands[2], c, pd.dst_desc(), true);
  entry.args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST};
  entry.primitive = dnnl::matmul(pd);
  finish(entry, pd);
  return entry;
}

template <class Make>
Entry& find_or_make(ThreadState& state, const Key& key, Make make) {
  if (auto it = state.cache.find(key); it != state.cache.end()) return it->second;
  Entry entry;
  {
    LibraryHeapScope library;
    entry = make();
  }
  return state.cache.emplace(key, std::move(entry)).first->second;
}

Key conv_key(ConvPass pass, const ConvGeometry& g, DType dtype, Layout layout, Epilogue e,
             int threads) {
  const Kind kind = pass == ConvPass::kForward     ? Kind::kForward
                    : pass == ConvPass::kGradInput ? Kind::kGradInput
                                                   : Kind::kGradWeight;
  return {kind, dtype, layout, e.bias != nullptr, e.relu, threads,
          {g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw,
           g.groups}};
}

// Points the entry's memories at this call's buffers, reorders the operands in, runs the
// primitive and reorders the result out. The per-thread buffers grow here, as loom's own
// allocations; everything oneDNN does counts as the library's.
void run(ThreadState& state, Entry& entry, const std::array<const void*, 3>& data,
         const float* bias) {
  std::array<void*, 3> inner{};
  for (int i = 0; i < 3; ++i)
    if (entry.operands[i].inner)
      inner[i] = state.buffer(static_cast<ThreadState::Slot>(i), entry.operands[i].inner_bytes);
  void* scratchpad = entry.scratchpad_bytes
                         ? state.buffer(ThreadState::kScratchpad, entry.scratchpad_bytes)
                         : nullptr;
  LibraryHeapScope library;
  std::array<const memory*, 3> used{};
  for (int i = 0; i < 3; ++i) {
    Operand& op = entry.operands[i];
    op.user.set_data_handle(const_cast<void*>(data[i]));
    used[i] = &op.user;
    if (op.inner) {
      op.inner.set_data_handle(inner[i]);
      used[i] = &op.inner;
    }
  }
  if (scratchpad) entry.scratchpad.set_data_handle(scratchpad);
  const auto reorder = [&](const Operand& op, const memory& from, const memory& to) {
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from.get()},
                                    {DNNL_ARG_TO, to.get()},
                                    {DNNL_ARG_SCRATCHPAD, entry.scratchpad.get()}};
    execute(op.reorder, state.stream, args, op.reorder_scratchpad ? 3 : 2);
  };
  for (int i = 0; i < 2; ++i) {
    const Operand& op = entry.operands[i];
    if (op.inner) reorder(op, op.user, op.inner);
  }
  std::array<dnnl_exec_arg_t, 5> args{{{entry.args[0], used[0]->get()},
                                       {entry.args[1], used[1]->get()},
                                       {entry.args[2], used[2]->get()},
                                       {DNNL_ARG_SCRATCHPAD, entry.scratchpad.get()}}};
  int nargs = 4;
  if (bias) {
    entry.bias.set_data_handle(const_cast<float*>(bias));
    args[nargs++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, entry.bias.get()};
  }
  execute(entry.primitive, state.stream, args.data(), nargs);
  const Operand& out = entry.operands[2];
  if (out.inner) reorder(out, out.inner, out.user);
}

// Sets OpenMP's thread count on this thread to loom's (a call per change only) and returns it.
int set_threads() {
  const int threads = loom_threads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  return threads;
}

// Whether oneDNN's effective ISA (ONEDNN_MAX_CPU_ISA caps it) includes `isa`.
bool isa_reaches(dnnl::cpu_isa isa) {
  const auto have = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto want = static_cast<unsigned>(isa);
  return (have & want) == want;  // ISAs are bit sets, each a superset of those below it
}

}  // namespace

bool avx512_core() {
  static const bool core = isa_reaches(dnnl::cpu_isa::avx512_core);
  return core;
}

bool native_bfloat16() {
  static const bool native = isa_reaches(dnnl::cpu_isa::avx512_core_bf16);
  return native;
}

bool bfloat16_supported() { return avx512_core(); }

// On an AVX2 CPU oneDNN 2.6's float32 GEMM ran 1.4 to 1.8x slower when an operand stored
// k-major had rows a multiple of 2 KB apart and the product was small (m x n at most
// 512 x 512, where oneDNN splits k across its threads): [512, 2048]^T x [2048, 512], a
// Linear's weight gradient at width 512, at 82 GFLOP/s against 121 with both operands copied
// to rows of 520 floats (the copies included); [1024, 2048]^T x [2048, 256] 63 against 114;
// [256, 4096] x [4096, 512] 88 against 117; ResNet-18's 1x1 downsampling weight gradient
// [512, 512]^T x [512, 256] 88-95 against 114-115 with a's rows padded. Wider products (m x n
// from 640 x 512 on) and 1 KB strides ran as fast either way. (A standalone oneDNN driver,
// 2-core EPYC Zen 3, best of 8 to 30 alternated calls, 2026-11-28.) Not measured with AVX-512: the
// strides stay there. The copies live on in the calling thread's buffers (run), so an operand
// of more than kMaxPaddedCopy is read as stored.
MatmulStrides matmul_read_strides(const MatmulShape& s, DType dtype) {
  constexpr int64_t kAliasing = 512;  // elements: 2 KB of float32
  constexpr int64_t kPad = 16;        // one cache line of float32
  constexpr int64_t kMaxOutput = 512 * 512;
  constexpr int64_t kMaxPaddedCopy = int64_t{32} << 20;  // bytes
  const bool small = !avx512_core() && dtype == DType::Float32 && s.batch == 1 &&
                     s.m * s.n <= kMaxOutput;
  const auto read = [&](bool k_major, int64_t width) {
    const bool fits = (width + kPad) * s.k * static_cast<int64_t>(sizeof(float)) <= kMaxPaddedCopy;
    return small && k_major && width % kAliasing == 0 && fits ? width + kPad : width;
  };
  return {.a = read(s.ta, s.ta ? s.m : s.k), .b = read(!s.tb, s.tb ? s.k : s.n)};
}

bool amx_bfloat16() {
  static const bool amx = isa_reaches(dnnl::cpu_isa::avx512_core_amx);
  return amx;
}

void conv2d(ConvPass pass, const ConvGeometry& g, DType dtype, Layout layout, const void* a,
            const void* b, void* out, Epilogue epilogue) {
  if (pass != ConvPass::kForward) epilogue = {};
  ThreadState& state = thread_state();
  const Key key = conv_key(pass, g, dtype, layout, epilogue, set_threads());
  try {
    Entry& entry = find_or_make(state, key, [&] { return make_conv(pass, g, dtype, layout, epilogue); });
    run(state, entry, {a, b, out}, epilogue.bias);
  } catch (const dnnl::error& e) {
    fail(describe(pass, g, dtype), e);
  }
}

void matmul(const MatmulShape& s, DType dtype, const void* a, const void* b, void* c,
            Epilogue epilogue) {
  ThreadState& state = thread_state();
  const Key key{Kind::kMatmul, dtype, Layout::kPlain, epilogue.bias != nullptr, epilogue.relu,
                set_threads(), {s.batch, s.m, s.n, s.k, s.ta, s.tb}};
  try {
    Entry& entry = find_or_make(state, key, [&] { return make_matmul(s, dtype, epilogue); });
    run(state, entry, {a, b, c}, epilogue.bias);
  } catch (const dnnl::error& e) {
    fail("matmul " + std::string(dtype_name(dtype)) + " [" + std::to_string(s.batch) + ", " +
             std::to_string(s.m) + ", " + std::to_string(s.k) + "] x [" + std::to_string(s.k) +
             ", " + std::to_string(s.n) + "]",
         e);
  }
}

void reorder(const Strided& s, DType dtype, const void* src, void* dst) {
  ThreadState& state = thread_state();
  Key key{Kind::kReorder, dtype, Layout::kPlain, false, false, set_threads(), {}};
  for (int i = 0; i < 4; ++i)
    key.dims[i] = s.dims[i], key.dims[4 + i] = s.src[i], key.dims[8 + i] = s.dst[i];
  try {
    Entry& entry = find_or_make(state, key, [&] {
      const memory::dims dims(s.dims, s.dims + 4);
      const memory::desc from(dims, data_type(dtype), memory::dims(s.src, s.src + 4));
      const memory::desc to(dims, data_type(dtype), memory::dims(s.dst, s.dst + 4));
      Entry e;
      Operand& op = e.operands[0];
      bind(op, from, to, false);
      // The destination, its handle set at each call.
      e.operands[1].user = op.inner ? op.inner : memory(to, cpu_engine(), DNNL_MEMORY_NONE);
      if (op.reorder_scratchpad) {
        const memory::desc pad({static_cast<int64_t>(op.reorder_scratchpad)},
                               memory::data_type::u8, Tag::a);
        e.scratchpad = memory(pad, cpu_engine(), DNNL_MEMORY_NONE);
        e.scratchpad_bytes = op.reorder_scratchpad;
      }
      e.implementation = "reorder";
      g_created.fetch_add(1, std::memory_order_relaxed);
      return e;
    });
    Operand& op = entry.operands[0];
    void* scratchpad = entry.scratchpad_bytes
                           ? state.buffer(ThreadState::kScratchpad, entry.scratchpad_bytes)
                           : nullptr;
    LibraryHeapScope library;
    op.user.set_data_handle(const_cast<void*>(src));
    entry.operands[1].user.set_data_handle(dst);
    if (!op.reorder) {  // the same layout: a plain copy
      std::memcpy(dst, src, op.user.get_desc().get_size());
      return;
    }
    dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, op.user.get()},
                              {DNNL_ARG_TO, entry.operands[1].user.get()},
                              {DNNL_ARG_SCRATCHPAD, nullptr}};
    if (scratchpad) {
      entry.scratchpad.set_data_handle(scratchpad);
      args[2].memory = entry.scratchpad.get();
    }
    execute(op.reorder, state.stream, args, scratchpad ? 3 : 2);
  } catch (const dnnl::error& e) {
    fail(std::string("reorder ") + dtype_name(dtype), e);
  }
}

const char* conv2d_implementation(ConvPass pass, const ConvGeometry& g, DType dtype,
                                  Layout layout) {
  ThreadState& state = thread_state();
  const Key key = conv_key(pass, g, dtype, layout, {}, set_threads());
  try {
    return find_or_make(state, key, [&] { return make_conv(pass, g, dtype, layout, {}); })
        .implementation.c_str();
  } catch (const dnnl::error& e) {
    fail(describe(pass, g, dtype), e);
  }
}

int64_t primitives_created() { return g_created.load(std::memory_order_relaxed); }

// On a CPU below AVX-512 (an AVX2-only EPYC, 2026-11-28, kernel_bench's OneDnnConv2d*/shape/
// layout rows, float32, channels-last taken as it is (2) against reordered to the blocked
// layouts and back (3), ms): the forward of every 3x3 conv with 32 channels or more on both
// sides ran faster blocked, reorders included: ResNet-20's 32-channel stage 6.40 against 7.25,
// its stage-3 entry 4.10 against 5.92 and 64-channel stage 6.95 against 7.79; ResNet-18's
// 64-channel 32x32 convs 20.8 against 27.1, 128-channel ones 20.9 against 29.3, its strided
// entries 11.3 to 14.8 against 15.3 to 16.5. With 16 channels (1.87, 7.85 and 4.70 against
// 1.20, 5.93 and 4.33), 1x1 convs (1.3 to 3.4x slower) and the stem it lost. The gradients
// were mixed within the run's noise (the weight gradient of ResNet-20's 32-channel stage 7.51
// against 9.97, of ResNet-18's 128-channel stage 31.7 against 28.9): they stay channels-last.
// In ResNet-18 b32 training steps (loom_bench --profile, captured, two runs each) the forward
// convs took 321 and 335 ms a step against 423 and 411; ResNet-20 b128's 110 and 100 against
// 114 and 111. With AVX-512 it was not measured: every pass stays on the channels-last
// kernels that the measurements there chose (cpu_backend.cpp's float32_channels_last).
constexpr int64_t kBlockedForwardMinChannels = 32;

Layout channels_last_layout(const ConvGeometry& g, ConvPass pass, DType dtype) {
  const bool blocked = !avx512_core() && dtype == DType::Float32 && pass == ConvPass::kForward &&
                       g.kh == 3 && g.kw == 3 &&
                       std::min(g.c, g.o) >= kBlockedForwardMinChannels;
  return blocked ? Layout::kChannelsLastBlocked : Layout::kChannelsLast;
}

// kernel_bench (OneDnnConv2d*/shape/layout/dtype, every ResNet-20 and ResNet-18 CIFAR shape,
// the time on loom's layout over the time blocked): for 3x3 convs the blocked direct kernels
// win even with the reorders, 1.1 to 2.4 in float32 (the 3-channel stem's forward: 0.92) and
// 1.2 to 4.1 in bfloat16. The reorders cost about what the GEMM loses on 1x1 convs (no
// im2col there): these stay on loom's layout up to 128 channels (0.5 to 0.95 in float32, 0.83
// to 1.06 in bfloat16) and go blocked from 256 on (1.29 to 1.59). The weight gradients of 1x1
// convs run on loom's layout: their blocked kernels synchronise their threads with spinning
// barriers many times per call and stalled whenever another process took a core (8 instead of
// 47 GF/s for a 1x1 float32 one). A helper saw the same of the 3x3 bfloat16 ones on two
// shared cores (about 1 s instead of 5 ms), but re-measured on the idle machine they are 1.5
// to 4x faster blocked than plain (ResNet-20's 32-channel stage: 2.32 against 8.75 ms), and
// with a busy loop on one of the two cores still 7.1 against 8.75 ms: they go blocked.
Layout conv_layout(const ConvGeometry& g, ConvPass pass, DType) {
  const bool pointwise_kernel = g.kh == 1 && g.kw == 1;
  if (pass == ConvPass::kGradWeight) return pointwise_kernel ? Layout::kPlain : Layout::kBlocked;
  if (pointwise_kernel && std::min(g.c, g.o) < 256) return Layout::kPlain;
  return Layout::kBlocked;
}

}  // namespace loom::runtime::onednn
