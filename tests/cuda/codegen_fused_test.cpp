// The CUDA C of elementwise ops, fusions, reductions and epilogues (codegen_fused.cpp,
// codegen_reduce.cpp): generated for programs compiled for the CUDA target, or built by hand
// where the API cannot reach an op (erf) or a dtype, and compiled with NVRTC for sm_90. No GPU
// is needed: each test checks that the source compiles, that every launch names an entry
// point of the source with a sane geometry, and the choices the kernels depend on (the
// reduction's layout, a split into two launches, an epilogue's bias index). Running the
// kernels is cuda_device_test's.
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/codegen_expr.h"
#include "runtime/cuda/cuda_target.h"
#include "runtime/cuda/nvrtc.h"

#include "test_util.h"

#include <loom/bfloat16.h>

#include <string>
#include <vector>

namespace loom {
namespace {

using ir::Op;
using runtime::cuda::generate_program;
using runtime::cuda::InstrCode;
using runtime::cuda::ProgramCode;

constexpr DType kAll[] = {DType::Float32, DType::Float64, DType::Int64,
                          DType::Int32,   DType::Bool,    DType::BFloat16};

// A tensor on device (a DeviceData leaf, never a constant the compiler could fold).
Tensor input(const Shape& shape, DType dtype = DType::Float32) {
  std::vector<char> bytes(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype), 0);
  return from_host(bytes.data(), dtype, shape);
}

// The program computing all of `outs` for the CUDA target.
ir::Program compile_all(const std::vector<Tensor>& outs) {
  std::vector<ir::NodePtr> roots;
  for (const auto& t : outs) {
    auto n = t.impl()->pending();
    EXPECT_NE(n, nullptr) << "expected a pending tensor";
    roots.push_back(n);
  }
  return compiler::compile(ir::build_graph(roots), runtime::cuda::cuda_target());
}

// Generates and compiles p's code; checks that every launch is sane and names an entry point.
ProgramCode build(const ir::Program& p) {
  ProgramCode code = generate_program(p);
  EXPECT_NO_THROW(runtime::cuda::nvrtc::compile(code.source, 90))
      << ir::to_text(p) << "\n" << code.source;
  for (std::size_t i = 0; i < code.instrs.size(); ++i)
    for (const auto& l : code.instrs[i].launches) {
      EXPECT_NE(code.source.find(" " + l.entry + "("), std::string::npos) << l.entry;
      EXPECT_NE(code.source.find("extern \"C\" __global__"), std::string::npos);
      EXPECT_GE(l.blocks, 1) << l.entry;
      EXPECT_LE(l.blocks, int64_t{0x7fffffff}) << l.entry;
      EXPECT_GE(l.threads, 32) << l.entry;
      EXPECT_LE(l.threads, 1024) << l.entry;
      EXPECT_EQ(l.threads % 32, 0) << l.entry;
    }
  return code;
}

// The source of instruction i alone (generate() keeps it, generate_program moves it).
std::string source_of(const ir::Program& p, std::size_t i) {
  return runtime::cuda::generate(p, static_cast<int>(i), "k" + std::to_string(i)).source;
}

// Index of the (first) instruction with `op`, -1 if none.
int find(const ir::Program& p, Op op) {
  for (std::size_t i = 0; i < p.instrs.size(); ++i)
    if (p.instrs[i].op == op) return static_cast<int>(i);
  return -1;
}

// Index of the (first) fused elementwise instruction, -1 if none.
int find_fused(const ir::Program& p) {
  for (std::size_t i = 0; i < p.instrs.size(); ++i) {
    const auto g = ir::op_info(p.instrs[i].op).group;
    if (p.instrs[i].fusion && g != ir::OpGroup::Reduce) return static_cast<int>(i);
  }
  return -1;
}

// ---- Hand-built programs: every elementwise op, fused and alone ----

bool takes_floats_only(Op op) {
  switch (op) {
    case Op::Exp: case Op::Log: case Op::Sqrt: case Op::Rsqrt: case Op::Sigmoid: case Op::Tanh:
    case Op::Silu: case Op::Gelu: case Op::GeluTanh: case Op::Erf: case Op::Sin: case Op::Cos:
    case Op::Div: case Op::Pow:
      return true;
    default:
      return false;
  }
}

bool is_test(Op op) {
  return op == Op::Eq || op == Op::Ne || op == Op::Lt || op == Op::Le || op == Op::Gt ||
         op == Op::Ge || op == Op::LogicalNot;
}

std::vector<Op> elementwise_ops() {
  std::vector<Op> ops;
  for (int k = 0; k < ir::kOpCount; ++k) {
    const auto op = static_cast<Op>(k);
    const auto g = ir::op_info(op).group;
    if ((g == ir::OpGroup::Unary || g == ir::OpGroup::Binary || g == ir::OpGroup::Ternary) &&
        op != Op::Cast)
      ops.push_back(op);
  }
  return ops;
}

// One instruction per elementwise op over [n] operands of dtype t: as a one-step fusion
// computing in t when `fused`, else alone.
ir::Program every_op(DType t, bool fused, int64_t n = 1000) {
  ir::Program p;
  p.inputs = {{t, {n}}, {t, {n}}, {DType::Bool, {n}}};
  for (Op op : elementwise_ops()) {
    if (takes_floats_only(op) && t != DType::Float32 && t != DType::Float64) continue;
    const int arity = ir::op_info(op).arity;
    const DType out = is_test(op) ? DType::Bool : t;
    ir::Instr in{op, out, {n}, {}, {}, -1, nullptr};
    if (op == Op::Where) in.args = {2, 0, 1};
    else if (op == Op::LogicalNot) in.args = {2};
    else if (arity == 1) in.args = {0};
    else in.args = {0, 1};
    if (fused && op != Op::LogicalNot) {
      auto f = std::make_shared<ir::Fusion>();
      f->compute = t;
      f->shape = {n};
      for (std::size_t k = 0; k < in.args.size(); ++k)
        f->loads.push_back({static_cast<int>(k), p.inputs[in.args[k]].dtype, {n}, {1}});
      const int nl = static_cast<int>(f->loads.size());
      f->steps.push_back({op, 0, nl > 1 ? 1 : -1, nl > 2 ? 2 : -1, 0, out});
      f->num_registers = 1;
      f->register_of.assign(f->loads.size() + 1, -1);
      in.fusion = f;
    }
    p.instrs.push_back(std::move(in));
  }
  return p;
}

TEST(CudaCodegenFused, EveryOpFusedInFloat32AndFloat64) {
  for (DType t : {DType::Float32, DType::Float64}) {
    SCOPED_TRACE(dtype_name(t));
    const auto p = every_op(t, true);
    const auto code = build(p);
    EXPECT_EQ(code.kernels(), static_cast<int>(p.instrs.size()));
    // The math library at the compute type: expf for float, exp for double.
    const bool f32 = t == DType::Float32;
    for (const char* fn : {"exp", "log", "sqrt", "tanh", "erf", "sin", "cos", "pow"})
      EXPECT_EQ(code.source.find(std::string(fn) + "f(") != std::string::npos, f32) << fn;
    // relu(NaN) = NaN: the test is a < 0, and maximum lets a NaN win.
    EXPECT_NE(code.source.find(f32 ? "(v0 < 0.0f ? 0.0f : v0)" : "(v0 < 0.0 ? 0.0 : v0)"),
              std::string::npos);
    EXPECT_NE(code.source.find("((v0 != v0 || v0 > v1) ? v0 : v1)"), std::string::npos);
    // Tests store a byte 0/1.
    EXPECT_NE(code.source.find("(unsigned char)("), std::string::npos);
  }
}

TEST(CudaCodegenFused, EveryOpAloneInEveryDtype) {
  for (DType t : {DType::Float32, DType::Float64, DType::Int64, DType::Int32}) {
    SCOPED_TRACE(dtype_name(t));
    const auto p = every_op(t, false);
    const auto code = build(p);
    EXPECT_EQ(code.kernels(), static_cast<int>(p.instrs.size()));
  }
}

TEST(CudaCodegenFused, OpsADtypeLacksThrow) {
  ir::Program p;
  p.inputs = {{DType::Int64, {8}}, {DType::Bool, {8}}};
  p.instrs.push_back({Op::Exp, DType::Int64, {8}, {}, {0}, -1, nullptr});
  EXPECT_NE(test::error_of([&] { generate_program(p); }).find("int64"), std::string::npos);
  p.instrs[0] = {Op::Add, DType::Bool, {8}, {}, {1, 1}, -1, nullptr};
  EXPECT_NE(test::error_of([&] { generate_program(p); }).find("bool"), std::string::npos);
  p.instrs[0] = {Op::Sum, DType::Bool, {1}, ir::AxesAttr{{0}}, {1}, -1, nullptr};
  EXPECT_NE(test::error_of([&] { generate_program(p); }).find("bool"), std::string::npos);
}

TEST(CudaCodegenFused, LargeResultsIndexIn64Bits) {
  const int64_t big = int64_t{3} << 30;
  ir::Program p;
  p.inputs = {{DType::Float32, {big}}};
  p.instrs.push_back({Op::Neg, DType::Float32, {big}, {}, {0}, -1, nullptr});
  EXPECT_NE(source_of(p, 0).find("for (i64 i"), std::string::npos);
  EXPECT_NE(source_of(every_op(DType::Float32, false), 0).find("for (int i"), std::string::npos);
  const auto code = build(p);
  EXPECT_EQ(code.instrs[0].launches[0].blocks, runtime::cuda::gen::kMaxBlocks);  // grid-stride
}

// ---- Programs compiled for the CUDA target ----

TEST(CudaCodegenFused, BFloat16LoadsAndStores) {
  test::fresh_engine();
  auto x = input({4, 33}, DType::BFloat16);
  auto y = exp(x) * x + x;  // widened: one float32 fusion loading and storing bfloat16
  const auto p = compile_all({y});
  const int i = find_fused(p);
  ASSERT_GE(i, 0) << ir::to_text(p);
  EXPECT_EQ(p.instrs[i].dtype, DType::BFloat16);
  const auto src = source_of(p, static_cast<std::size_t>(i));
  EXPECT_NE(src.find("const bf16*"), std::string::npos) << src;
  EXPECT_NE(src.find("bf16_to_f(x0["), std::string::npos) << src;
  EXPECT_NE(src.find("o[i] = f_to_bf16("), std::string::npos) << src;
  build(p);
}

TEST(CudaCodegenFused, Where) {
  test::fresh_engine();
  auto c = input({5, 7}, DType::Bool);
  auto a = input({5, 7}), b = input({5, 7});
  auto ia = input({5, 7}, DType::Int64), ib = input({5, 7}, DType::Int64);
  auto p = compile_all({where(c, a * 2.0, b), where(c, ia, ib), where(gt(a, b), a, b)});
  const auto code = build(p);
  EXPECT_NE(code.source.find("!= 0.0f ?"), std::string::npos) << code.source;
  EXPECT_NE(code.source.find("(i64)0 ?"), std::string::npos) << code.source;
}

TEST(CudaCodegenFused, CastsBetweenAllDtypes) {
  test::fresh_engine();
  std::vector<Tensor> outs;
  for (DType from : kAll)
    for (DType to : kAll)
      if (from != to) outs.push_back(input({3, 5}, from).to(to));
  const auto p = compile_all(outs);
  const auto code = build(p);
  EXPECT_GE(code.kernels(), 30) << ir::to_text(p);
  // A float to an integer: x86's truncation (NaN and out of range give the lowest value).
  EXPECT_NE(code.source.find("2147483648.0f"), std::string::npos);
  EXPECT_NE(code.source.find("9223372036854775808.0 "), std::string::npos);
  EXPECT_NE(code.source.find("(-9223372036854775807LL - 1)"), std::string::npos);
  // bfloat16 rounds to nearest even; bool is "not zero".
  EXPECT_NE(code.source.find("f_to_bf16((float)("), std::string::npos);
  EXPECT_NE(code.source.find("!= 0)"), std::string::npos);
}

TEST(CudaCodegenFused, ChainWithBroadcastLoads) {
  test::fresh_engine();
  auto x = input({4, 3, 8, 8});
  auto scale = input({1, 3, 1, 1}), shift = input({3, 1, 1});
  auto row = input({8});
  auto y = relu((x - shift) * scale + row) / 3.0;
  const auto p = compile_all({y});
  const int k = find_fused(p);
  ASSERT_GE(k, 0) << ir::to_text(p);
  const auto& in = p.instrs[static_cast<std::size_t>(k)];
  int broadcasts = 0;
  for (const auto& l : in.fusion->loads)
    for (auto st : l.strides) broadcasts += st == 0;
  EXPECT_GE(broadcasts, 3) << ir::to_text(p);
  const auto src = source_of(p, static_cast<std::size_t>(k));
  // The per-channel operands: (i / 64) % 3, the row: i % 8, the scalar: element 0.
  EXPECT_NE(src.find("((i / 64) % 3)"), std::string::npos) << src;
  EXPECT_NE(src.find("(i % 8)"), std::string::npos) << src;
  EXPECT_NE(src.find("[0]"), std::string::npos) << src;
  const auto code = build(p);
  EXPECT_EQ(code.instrs[k].launches.size(), 1u);
  EXPECT_EQ(code.instrs[k].launches[0].blocks, (4 * 3 * 64 + 255) / 256);
}

// ---- Reductions ----

struct ReduceCase {
  Shape shape;
  std::vector<int64_t> axes;
  const char* what;
};

// Inner, outer, middle and all axes, short and long rows, few and many outputs.
const ReduceCase kReduceCases[] = {
    {{64, 300}, {1}, "inner: a warp per row"},
    {{64, 5000}, {1}, "inner: a block per row"},
    {{4096, 8}, {1}, "inner: a thread per row"},
    {{300, 64}, {0}, "outer: a column per lane, split in two"},
    {{2048, 8192}, {0}, "outer: many columns, split in row chunks"},
    {{100000, 3}, {0}, "outer: three long columns, split"},
    {{8, 16, 32}, {1}, "middle"},
    {{16, 64, 24, 24}, {0, 2, 3}, "BatchNorm statistics, split"},
    {{1024, 4096}, {0, 1}, "all, split"},
    {{7}, {0}, "all, tiny"},
};

TEST(CudaCodegenFused, ReductionsOverEveryLayout) {
  for (const auto& c : kReduceCases) {
    SCOPED_TRACE(c.what);
    test::fresh_engine();
    auto x = input(c.shape);
    std::vector<Tensor> outs{sum(x, c.axes), mean(x, c.axes), amax(x, c.axes)};
    if (c.axes.size() == 1) outs.push_back(argmax(x, c.axes[0]));
    const auto p = compile_all(outs);
    const auto code = build(p);
    for (Op op : {Op::Sum, Op::Mean, Op::Max}) {
      const int i = find(p, op);
      ASSERT_GE(i, 0) << ir::to_text(p);
      const auto& launches = code.instrs[i].launches;
      ASSERT_GE(launches.size(), 1u);
      EXPECT_EQ(launches[0].entry, "k" + std::to_string(i) + "_main");
      EXPECT_LE(launches.size(), 2u);
      const bool split = launches.size() == 2;
      if (split) {
        EXPECT_EQ(launches[1].entry, "k" + std::to_string(i) + "_combine");
      }
      const std::string what = c.what;
      EXPECT_EQ(split, what.find("split") != std::string::npos) << ir::to_text(p);
      // Few outputs over many elements: each output's elements spread over many blocks.
      if (split) {
        EXPECT_GE(launches[0].blocks, 4);
      }
    }
    // Float sums accumulate in double.
    EXPECT_NE(code.source.find("double acc = 0;"), std::string::npos);
  }
}

TEST(CudaCodegenFused, ReductionsWithAPrologue) {
  for (const auto& c : kReduceCases) {
    SCOPED_TRACE(c.what);
    test::fresh_engine();
    auto x = input(c.shape), y = input(c.shape);
    auto d = x - y;
    const auto p = compile_all({sum(d * d, c.axes), amax(exp(x) * y, c.axes)});
    for (Op op : {Op::Sum, Op::Max}) {
      const int i = find(p, op);
      ASSERT_GE(i, 0) << ir::to_text(p);
      EXPECT_TRUE(p.instrs[i].fusion) << "no prologue fused:\n" << ir::to_text(p);
    }
    build(p);
  }
}

TEST(CudaCodegenFused, ReductionsOfOtherDtypes) {
  test::fresh_engine();
  auto d = input({33, 65}, DType::Float64);
  auto l = input({33, 65}, DType::Int64);
  auto n = input({33, 65}, DType::Int32);
  auto h = input({33, 65}, DType::BFloat16);
  const auto p = compile_all({sum(d, {1}), amax(d, {0}), argmax(d, 0), sum(l, {0}), amax(l, {1}),
                              argmax(l, 1), sum(n, {1}), amax(n, {0}), sum(h, {1}), amax(h, {0}),
                              argmax(h, 1)});
  const auto code = build(p);
  EXPECT_NE(code.source.find("i64 acc = 0;"), std::string::npos);  // integer sums in int64
  EXPECT_NE(code.source.find("(-2147483647 - 1)"), std::string::npos);  // int32's max starts low
}

// ---- Epilogues ----

TEST(CudaCodegenFused, MatmulEpilogues) {
  test::fresh_engine();
  for (DType t : {DType::Float32, DType::Float64}) {
    SCOPED_TRACE(dtype_name(t));
    auto a = input({6, 32}, t), w = input({32, 24}, t), b = input({24}, t);
    const std::vector<Tensor> outs{
        matmul(a, w) + b,          relu(matmul(a, w) + b),       sigmoid(matmul(a, w) + b),
        tanh(matmul(a, w) + b),    silu(matmul(a, w) + b),       gelu(matmul(a, w) + b),
        gelu(matmul(a, w) + b, true)};
    for (const auto& y : outs) {
      const auto p = compile_all({y});
      const int i = find(p, Op::Matmul);
      ASSERT_GE(i, 0) << ir::to_text(p);
      ASSERT_TRUE(p.instrs[i].epilogue.active()) << ir::to_text(p);
      const auto code = build(p);
      EXPECT_EQ(code.instrs[i].runs, runtime::cuda::Runs::Library);
      ASSERT_EQ(code.instrs[i].launches.size(), 1u);
      const auto src = source_of(p, static_cast<std::size_t>(i));
      EXPECT_NE(src.find("[i % 24]"), std::string::npos) << src;  // the bias per column
    }
  }
}

TEST(CudaCodegenFused, Conv2dEpilogues) {
  test::fresh_engine();
  // [2, 8, 128, 128]: over kSmallConvOutput, so a conv, not a GEMM (cuda_target.cpp).
  auto x = input({2, 3, 130, 130}), w = input({8, 3, 3, 3}), b = input({8});
  auto conv = [&] { return conv2d(x, w, b); };
  for (auto y : {conv(), relu(conv()), sigmoid(conv()), tanh(conv()), silu(conv()), gelu(conv()),
                 gelu(conv(), true)}) {
    const auto p = compile_all({y});
    const int i = find(p, Op::Conv2d);
    ASSERT_GE(i, 0) << ir::to_text(p);
    ASSERT_TRUE(p.instrs[i].epilogue.active()) << ir::to_text(p);
    build(p);
    const auto src = source_of(p, static_cast<std::size_t>(i));
    EXPECT_NE(src.find("[(i / 16384) % 8]"), std::string::npos) << src;  // the bias per channel
  }
}

// A bfloat16 product (widening keeps the API's bias add apart from it, so built by hand):
// the bias add and activation in float, rounded once.
TEST(CudaCodegenFused, BFloat16MatmulEpilogue) {
  for (Op act : {Op::Count_, Op::Relu, Op::Sigmoid, Op::Tanh, Op::Silu, Op::Gelu, Op::GeluTanh}) {
    ir::Program p;
    p.inputs = {{DType::BFloat16, {2, 6, 32}}, {DType::BFloat16, {2, 32, 24}},
                {DType::BFloat16, {24}}};
    ir::Instr in{Op::Matmul, DType::BFloat16, {2, 6, 24}, ir::MatmulAttr{}, {0, 1, 2}, -1, nullptr};
    in.epilogue = {2, act};
    p.instrs.push_back(in);
    const auto code = build(p);
    ASSERT_EQ(code.instrs[0].launches.size(), 1u);
    EXPECT_NE(code.source.find("bf16_to_f(x2[i % 24])"), std::string::npos) << code.source;
    EXPECT_NE(code.source.find("o[i] = f_to_bf16(v)"), std::string::npos) << code.source;
  }
}

// A channels-last Conv2d's result is [N,H,W,C]: its bias is indexed by the last dimension,
// an NCHW one's by the second.
TEST(CudaCodegenFused, ConvEpilogueBiasFollowsTheLayout) {
  for (bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels-last" : "NCHW");
    ir::Program p;
    p.inputs = {{DType::Float32, {1, 4, 4, 2}}, {DType::Float32, {2, 2, 1, 1}},
                {DType::Float32, {2}}};
    const Shape out = channels_last ? Shape{1, 4, 4, 2} : Shape{1, 2, 4, 4};
    ir::Instr in{Op::Conv2d, DType::Float32, out, ir::Conv2dAttr{.channels_last = channels_last},
                 {0, 1, 2}, -1, nullptr};
    in.epilogue.bias = 2;
    p.instrs.push_back(in);
    const auto code = build(p);
    const std::string index = channels_last ? "x2[i % 2]" : "x2[(i / 16) % 2]";
    EXPECT_NE(code.source.find(index), std::string::npos) << code.source;
  }
}

}  // namespace
}  // namespace loom
