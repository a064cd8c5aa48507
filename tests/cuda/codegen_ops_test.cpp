// The movement, random, indexing and pooling generators (codegen_ops.cpp, codegen_index.cpp,
// codegen_pool.cpp) without a GPU: every source compiles with NVRTC for sm_90, each launch
// names an entry point defined with the backend's parameter list and covers its elements,
// the kernel picked for a case is the one meant (tiled transpose, row scatter), and the random
// generator spells the CPU's formula, which is checked against the CPU backend's numbers.
#include "runtime/cuda/codegen.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cuda/cuda_target.h"
#include "runtime/cuda/nvrtc.h"

#include "../test_util.h"

#include <loom/bfloat16.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace loom::runtime::cuda {
namespace {

using ir::Op;

const DType kAll[] = {DType::Float32, DType::Float64, DType::Int64,
                      DType::Int32,   DType::Bool,    DType::BFloat16};
const DType kFloats[] = {DType::Float32, DType::Float64, DType::BFloat16};

// A program whose last instruction is `op` over `args` (slots), after `before` instructions.
ir::Program program(std::vector<ir::SlotType> inputs, Op op, DType dtype, Shape shape,
                    ir::Attr attr, std::vector<int> args, std::vector<ir::Instr> before = {}) {
  ir::Program p;
  p.inputs = std::move(inputs);
  p.instrs = std::move(before);
  ir::Instr in;
  in.op = op;
  in.dtype = dtype;
  in.shape = std::move(shape);
  in.attr = std::move(attr);
  in.args = std::move(args);
  p.instrs.push_back(std::move(in));
  return p;
}

// The text of the kernel that `entry` names, from its signature to the next definition.
std::string kernel_text(const std::string& source, const std::string& entry) {
  const auto at = source.find(" " + entry + "(");
  if (at == std::string::npos) return {};
  return source.substr(at, source.find("\n}\n", at) - at);
}

// Every launch names an extern "C" entry with (out, a0..a{n-1}) and a sane grid; a flat
// (one thread per element) grid covers `elements` at least.
void expect_launches(const InstrCode& c, std::size_t args, int64_t elements) {
  ASSERT_EQ(c.runs, Runs::Kernels);
  ASSERT_FALSE(c.launches.empty());
  for (const auto& l : c.launches) {
    std::string sig = "extern \"C\" __global__ void " + l.entry + "(void* out_";
    for (std::size_t k = 0; k < args; ++k) sig += ", const void* a" + std::to_string(k) + "_";
    EXPECT_NE(c.source.find(sig + ") {"), std::string::npos) << sig << "\n" << c.source;
    EXPECT_GE(l.blocks, 1);
    EXPECT_LT(l.blocks, int64_t{1} << 31);
    EXPECT_GE(l.threads, 32);
    EXPECT_LE(l.threads, 1024);
    EXPECT_EQ(l.threads % 32, 0);
  }
  const auto& last = c.launches.back();
  if (last.entry.find("_scatter_rows") == std::string::npos &&
      last.entry.find("_tile") == std::string::npos) {
    EXPECT_GE(last.blocks * last.threads, elements) << last.entry;
  }
}

// Collects instructions' code under distinct prefixes and compiles them as one program.
struct Batch {
  std::string source = prelude();
  int next = 0;

  InstrCode add(const ir::Program& p, std::size_t args, int64_t elements) {
    auto c = generate(p, static_cast<int>(p.instrs.size()) - 1, "t" + std::to_string(next++));
    expect_launches(c, args, elements);
    source += c.source;
    return c;
  }
  void compile() const {
    auto cubin = nvrtc::compile(source, 90);
    ASSERT_NE(cubin, nullptr);
    EXPECT_GT(cubin->size(), 1000u);
  }
};


TEST(CudaCodegenOps, MovementAtEveryDtypeCompiles) {
  Batch b;
  for (DType t : kAll) {
    const ir::SlotType x{t, {2, 3, 4}};
    b.add(program({x}, Op::Permute, t, {4, 2, 3}, ir::PermuteAttr{{2, 0, 1}}, {0}), 1, 24);
    b.add(program({x}, Op::Slice, t, {1, 2, 2}, ir::SliceAttr{{1, 0, 1}, {1, 2, 2}, {1, 2, 2}},
                  {0}), 1, 4);
    b.add(program({{t, {2, 1, 4}}}, Op::Expand, t, {2, 3, 4}, ir::ShapeAttr{{2, 3, 4}}, {0}), 1,
          24);
    b.add(program({x}, Op::Pad, t, {2, 6, 5}, ir::PadAttr{{0, 1, 0}, {0, 2, 1}, 1.0}, {0}), 1,
          60);
    b.add(program({x, {t, {2, 1, 4}}, {t, {2, 2, 4}}}, Op::Concat, t, {2, 6, 4},
                  ir::DimAttr{1}, {0, 1, 2}),
          3, 48);
    b.add(program({}, Op::Iota, t, {3, 5}, ir::DimAttr{1}, {}), 0, 15);
  }
  b.compile();
}

TEST(CudaCodegenOps, SliceOfWholeRowsIsOneRun) {
  // Rows 2..5 of an [8, 16] matrix are 64 contiguous elements: no coordinate to split.
  const auto p = program({{DType::Float32, {8, 16}}}, Op::Slice, DType::Float32, {4, 16},
                         ir::SliceAttr{{2, 0}, {1, 1}, {4, 16}}, {0});
  const auto c = generate(p, 0, "k0");
  const auto k = kernel_text(c.source, c.launches[0].entry);
  EXPECT_EQ(k.find('%'), std::string::npos) << k;
  EXPECT_NE(k.find("s = 32"), std::string::npos) << k;  // starts at row 2
}

TEST(CudaCodegenOps, PermuteTilesOnlyWhenTheLastDimensionMoves) {
  Batch b;
  // A 2-D transpose and [B,H,T,D] -> [B,H,D,T] move the input's contiguous dim: tiled.
  auto t2 = b.add(program({{DType::Float32, {100, 70}}}, Op::Permute, DType::Float32, {70, 100},
                          ir::PermuteAttr{{1, 0}}, {0}),
                  1, 7000);
  EXPECT_NE(t2.launches[0].entry.find("_tile"), std::string::npos);
  EXPECT_EQ(t2.launches[0].blocks, 4 * 3);  // ceil(100/32) x ceil(70/32) tiles
  auto t4 = b.add(program({{DType::BFloat16, {2, 3, 40, 64}}}, Op::Permute, DType::BFloat16,
                          {2, 3, 64, 40}, ir::PermuteAttr{{0, 1, 3, 2}}, {0}),
                  1, 2 * 3 * 40 * 64);
  EXPECT_NE(t4.launches[0].entry.find("_tile"), std::string::npos);
  EXPECT_EQ(t4.launches[0].blocks, 6 * 2 * 2);
  // [B,H,T,D] -> [B,T,H,D] keeps D last: a plain strided copy, D-long runs.
  auto heads = b.add(program({{DType::Float64, {2, 4, 16, 32}}}, Op::Permute, DType::Float64,
                             {2, 16, 4, 32}, ir::PermuteAttr{{0, 2, 1, 3}}, {0}),
                     1, 2 * 4 * 16 * 32);
  EXPECT_NE(heads.launches[0].entry.find("_copy"), std::string::npos);
  b.compile();
}

TEST(CudaCodegenOps, PadFillsTheValueInTheDtype) {
  const auto f = generate(program({{DType::Float32, {3}}}, Op::Pad, DType::Float32, {6},
                                  ir::PadAttr{{1}, {2}, 1.5}, {0}),
                          0, "k0");
  EXPECT_NE(f.source.find(literal(1.5, DType::Float32)), std::string::npos) << f.source;
  const auto h = generate(program({{DType::BFloat16, {3}}}, Op::Pad, DType::BFloat16, {6},
                                  ir::PadAttr{{1}, {2}, 1.0}, {0}),
                          0, "k0");
  EXPECT_NE(h.source.find("(bf16)" + std::to_string(bfloat16(1.0f).bits) + "u"),
            std::string::npos)
      << h.source;
}

TEST(CudaCodegenOps, EmptyResultsLaunchNothing) {
  const auto c = generate(program({{DType::Float32, {0, 3}}}, Op::Permute, DType::Float32,
                                  {3, 0}, ir::PermuteAttr{{1, 0}}, {0}),
                          0, "k0");
  EXPECT_TRUE(c.launches.empty());
}

// ---- random ----

ir::Program random_program(Op op, DType t, Shape shape) {
  return program({{DType::Int64, {}}}, op, t, shape, ir::RandomAttr{shape, t}, {0});
}

TEST(CudaCodegenOps, RandomOpsCompile) {
  Batch b;
  for (DType t : kFloats)
    for (Op op : {Op::RandUniform, Op::RandNormal}) {
      auto c = b.add(random_program(op, t, {5, 7}), 1, 35);
      EXPECT_NE(c.source.find("*(const i64*)a0_"), std::string::npos) << "the seed is operand 0";
    }
  b.compile();
  EXPECT_THROW(generate(random_program(Op::RandUniform, DType::Int64, {3}), 0, "k0"), Error);
}

// The CPU's generator as kernels_random.cpp documents it.
uint64_t mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ULL;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
uint64_t bits(uint64_t seed, uint64_t c) { return mix(mix(seed) + (c + 1) * 0x9E3779B97F4A7C15ULL); }

TEST(CudaCodegenOps, RandomSpellsTheCpuGenerator) {
  // The formula above is the CPU backend's: compare with its kernels' numbers.
  const uint64_t seed = 12345;
  auto cpu = [&](Op op, DType t) {
    int64_t s = static_cast<int64_t>(seed);
    std::vector<double> out(64);  // room for 64 doubles or floats
    const TensorView in[] = {{&s, DType::Int64, {}}};
    run_kernel(op, ir::RandomAttr{{64}, t}, in, TensorView{out.data(), t, {64}});
    return out;
  };
  const auto u32_storage = cpu(Op::RandUniform, DType::Float32);
  const auto* u32 = reinterpret_cast<const float*>(u32_storage.data());
  const auto u64 = cpu(Op::RandUniform, DType::Float64);
  const auto n64 = cpu(Op::RandNormal, DType::Float64);
  for (uint64_t i = 0; i < 64; ++i) {
    ASSERT_EQ(u32[i], static_cast<float>(bits(seed, i) >> 40) * 0x1p-24f) << i;
    ASSERT_EQ(u64[i], static_cast<double>(bits(seed, i) >> 11) * 0x1p-53) << i;
    const double u1 = static_cast<double>((bits(seed, 2 * i) >> 11) + 1) * 0x1p-53;
    const double u2 = static_cast<double>(bits(seed, 2 * i + 1) >> 11) * 0x1p-53;
    ASSERT_EQ(n64[i], std::sqrt(-2.0 * std::log(u1)) * std::cos(6.28318530717958647692 * u2));
  }
  // The generated source spells the same steps with the same constants.
  const auto mixing = {"z ^= z >> 30; z *= 0xBF58476D1CE4E5B9ULL;",
                       "z ^= z >> 27; z *= 0x94D049BB133111EBULL;", "return z ^ (z >> 31);",
                       "(key + (c + 1ULL) * 0x9E3779B97F4A7C15ULL)"};
  const auto uniform = generate(random_program(Op::RandUniform, DType::Float32, {64}), 0, "k0");
  for (const char* s : mixing) EXPECT_NE(uniform.source.find(s), std::string::npos) << s;
  EXPECT_NE(uniform.source.find("key = k0_mix((unsigned long long)*(const i64*)a0_)"),
            std::string::npos);
  EXPECT_NE(uniform.source.find("(float)(k0_bits(key, c) >> 40) * 5.9604644775390625e-08f"),
            std::string::npos)
      << uniform.source;
  EXPECT_EQ(5.9604644775390625e-08f, 0x1p-24f);
  EXPECT_EQ(1.1102230246251565404236316680908203125e-16, 0x1p-53);
  const auto u_double = generate(random_program(Op::RandUniform, DType::Float64, {64}), 0, "k0");
  EXPECT_NE(u_double.source.find("(double)(k0_bits(key, c) >> 11) * 1.1102230246251565"),
            std::string::npos);
  const auto normal = generate(random_program(Op::RandNormal, DType::Float32, {64}), 0, "k0");
  for (const char* s :
       {"((k0_bits(key, 2ULL * c) >> 11) + 1ULL) * 1.1102230246251565",
        "(double)(k0_bits(key, 2ULL * c + 1ULL) >> 11) * 1.1102230246251565",
        "sqrt(-2.0 * log(u1)) * cos(6.28318530717958647692 * u2)", "= (float)z;"})
    EXPECT_NE(normal.source.find(s), std::string::npos) << s << "\n" << normal.source;
}

// ---- indexing ----

TEST(CudaCodegenOps, IndexOpsCompile) {
  Batch b;
  const ir::SlotType idx{DType::Int64, {4, 3}};
  for (DType t : kAll) {
    b.add(program({{t, {4, 5}}, idx}, Op::Gather, t, {4, 3}, ir::DimAttr{1}, {0, 1}), 2, 12);
    // The index smaller than x off the gathered dim.
    b.add(program({{t, {6, 5}}, {DType::Int64, {2, 3}}}, Op::Gather, t, {2, 3}, ir::DimAttr{0},
                  {0, 1}),
          2, 6);
    b.add(program({{t, {4, 5, 2}}, {DType::Int64, {7}}}, Op::IndexSelect, t, {4, 7, 2},
                  ir::DimAttr{1}, {0, 1}),
          2, 56);
  }
  for (DType t : {DType::Float32, DType::Float64, DType::Int64, DType::Int32}) {
    auto c = b.add(program({{t, {6, 3}}, idx, {t, {4, 3}}}, Op::ScatterAdd, t, {6, 3},
                           ir::DimAttr{0}, {0, 1, 2}),
                   3, 0);
    ASSERT_EQ(c.launches.size(), 2u);  // copy self, then scatter
    EXPECT_NE(c.launches[0].entry.find("_copy"), std::string::npos);
    EXPECT_GE(c.launches[0].blocks * c.launches[0].threads, 18);
    EXPECT_NE(c.launches[1].entry.find("_scatter_columns"), std::string::npos);
    // Along the last dim, with self larger than the index off it.
    b.add(program({{t, {5, 6}}, idx, {t, {4, 3}}}, Op::ScatterAdd, t, {5, 6}, ir::DimAttr{1},
                  {0, 1, 2}),
          3, 0);
  }
  b.add(program({{DType::Int64, {4, 3}}}, Op::OneHot, DType::Int64, {4, 3, 10},
                ir::OneHotAttr{10}, {0}),
        1, 120);
  b.compile();
  for (DType t : {DType::Bool, DType::BFloat16})
    EXPECT_THROW(generate(program({{t, {6, 3}}, idx, {t, {4, 3}}}, Op::ScatterAdd, t, {6, 3},
                                  ir::DimAttr{0}, {0, 1, 2}),
                          0, "k0"),
                 Error);
}

TEST(CudaCodegenOps, BadIndicesAreReportedWithTheInstruction) {
  // The index op is instruction 1 of its program: its kernels report 1.
  ir::Instr first;
  first.op = Op::Permute;
  first.dtype = DType::Float32;
  first.shape = {5, 4};
  first.attr = ir::PermuteAttr{{1, 0}};
  first.args = {0};
  const ir::SlotType x{DType::Float32, {4, 5}}, idx{DType::Int64, {4, 3}};
  const std::vector<ir::Program> programs = {
      program({x, idx}, Op::Gather, DType::Float32, {4, 3}, ir::DimAttr{1}, {0, 1}, {first}),
      program({x, {DType::Int64, {3}}}, Op::IndexSelect, DType::Float32, {3, 5}, ir::DimAttr{0},
              {0, 1}, {first}),
      program({x, idx, {DType::Float32, {4, 3}}}, Op::ScatterAdd, DType::Float32, {4, 5},
              ir::DimAttr{1}, {0, 1, 2}, {first}),
      program({x, {DType::Int64, {4, 1}}, {DType::Float32, {4, 1}}}, Op::ScatterAdd,
              DType::Float32, {4, 5}, ir::DimAttr{0}, {0, 1, 2}, {first}),
      program({idx}, Op::OneHot, DType::Int64, {4, 3, 6}, ir::OneHotAttr{6}, {0}, {first})};
  for (const auto& p : programs) {
    const auto c = generate(p, 1, "k1");
    EXPECT_NE(c.source.find("report_error(1)"), std::string::npos) << c.source;
    EXPECT_EQ(c.source.find("report_error(0)"), std::string::npos);
  }
}

// The embedding gradient: self [V, D], index [T] expanded to [T, D], along dim 0.
TEST(CudaCodegenOps, EmbeddingGradientScattersByRows) {
  const int64_t V = 1000, D = 256, T = 4096;
  ir::Instr expand;
  expand.op = Op::Expand;
  expand.dtype = DType::Int64;
  expand.shape = {T, D};
  expand.attr = ir::ShapeAttr{{T, D}};
  expand.args = {1};
  const auto p = program({{DType::Float32, {V, D}}, {DType::Int64, {T, 1}},
                          {DType::Float32, {T, D}}},
                         Op::ScatterAdd, DType::Float32, {V, D}, ir::DimAttr{0}, {0, 3, 2},
                         {expand});
  Batch b;
  b.source += generate(p, 0, "x0").source;  // the Expand
  const auto c = b.add(p, 3, V * D);
  ASSERT_EQ(c.launches.size(), 2u);
  EXPECT_NE(c.launches[1].entry.find("_scatter_rows"), std::string::npos);
  EXPECT_GE(c.launches[1].blocks, 256);  // enough blocks to fill a GPU
  EXPECT_LE(c.launches[1].blocks, V);
  EXPECT_EQ(c.launches[1].threads, 256);
  b.compile();

  // A full index (not an Expand) scatters by columns.
  const auto q = program({{DType::Float32, {V, D}}, {DType::Int64, {T, D}},
                          {DType::Float32, {T, D}}},
                         Op::ScatterAdd, DType::Float32, {V, D}, ir::DimAttr{0}, {0, 1, 2});
  const auto cols = generate(q, 0, "k0");
  EXPECT_NE(cols.launches[1].entry.find("_scatter_columns"), std::string::npos);
  EXPECT_GE(cols.launches[1].blocks * cols.launches[1].threads, D);
}

TEST(CudaCodegenOps, IndexSelectGradientFromTheCompilerScattersByRows) {
  auto w = rand({300, 64}, 1).requires_grad_();
  const auto tokens = from_vector<int64_t>({3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {10});
  index_select(w, 0, tokens).sum().backward();
  const auto p = compiler::compile(test::graph_of(w.grad()), cuda_target());
  int found = 0;
  for (int i = 0; i < static_cast<int>(p.instrs.size()); ++i) {
    if (p.instrs[static_cast<std::size_t>(i)].op != Op::ScatterAdd) continue;
    ++found;
    const auto c = generate(p, i, "k" + std::to_string(i));
    EXPECT_NE(c.launches.back().entry.find("_scatter_rows"), std::string::npos)
        << ir::to_text(p);
  }
  EXPECT_EQ(found, 1) << ir::to_text(p);
}

// ---- pooling ----

TEST(CudaCodegenOps, PoolingCompiles) {
  Batch b;
  const ir::Pool2dAttr a{{3, 3}, {2, 2}, {1, 1}, false};
  for (DType t : kFloats)
    for (bool include_pad : {false, true}) {
      ir::Pool2dAttr pa = a;
      pa.count_include_pad = include_pad;
      const ir::SlotType x{t, {2, 3, 9, 8}}, g{t, {2, 3, 5, 4}};
      b.add(program({x}, Op::MaxPool2d, t, {2, 3, 5, 4}, pa, {0}), 1, 120);
      b.add(program({x}, Op::AvgPool2d, t, {2, 3, 5, 4}, pa, {0}), 1, 120);
      b.add(program({x, g}, Op::MaxPool2dGrad, t, {2, 3, 9, 8}, pa, {0, 1}), 2, 432);
      b.add(program({g}, Op::AvgPool2dGrad, t, {2, 3, 9, 8}, ir::Pool2dGradAttr{pa, {9, 8}},
                    {0}),
            1, 432);
    }
  // A non-square kernel and stride, no padding.
  b.add(program({{DType::Float32, {1, 2, 7, 10}}}, Op::MaxPool2d, DType::Float32, {1, 2, 3, 4},
                ir::Pool2dAttr{{3, 2}, {2, 3}, {0, 0}, false}, {0}),
        1, 24);
  b.compile();
  EXPECT_THROW(generate(program({{DType::Int64, {1, 1, 4, 4}}}, Op::MaxPool2d, DType::Int64,
                                {1, 1, 2, 2}, ir::Pool2dAttr{{2, 2}, {2, 2}, {0, 0}, false}, {0}),
                        0, "k0"),
               Error);
}

TEST(CudaCodegenOps, PoolingBakesTheGeometryAndTheDivisorRule) {
  const ir::Pool2dAttr a{{3, 2}, {2, 1}, {1, 0}, true};
  const auto c = generate(program({{DType::Float32, {1, 1, 6, 5}}}, Op::AvgPool2d,
                                  DType::Float32, {1, 1, 3, 4}, a, {0}),
                          0, "k0");
  for (const char* s : {"KH = 3;", "KW = 2;", "SH = 2;", "SW = 1;", "PH = 1;", "PW = 0;",
                        "H = 6;", "W = 5;", "OH = 3;", "OW = 4;", "count = padded;",
                        "double sum"})
    EXPECT_NE(c.source.find(s), std::string::npos) << s << "\n" << c.source;
  ir::Pool2dAttr b = a;
  b.count_include_pad = false;
  const auto d = generate(program({{DType::Float32, {1, 1, 6, 5}}}, Op::AvgPool2d,
                                  DType::Float32, {1, 1, 3, 4}, b, {0}),
                          0, "k0");
  EXPECT_EQ(d.source.find("count = padded;"), std::string::npos);
  // The max gradient goes to the first maximum of the window: the scan keeps the first.
  const auto m = generate(program({{DType::Float32, {1, 1, 6, 5}}, {DType::Float32, {1, 1, 3, 4}}},
                                  Op::MaxPool2dGrad, DType::Float32, {1, 1, 6, 5}, a, {0, 1}),
                          0, "k0");
  EXPECT_NE(m.source.find("if (best_i < 0 || v > best || isnan(v))"), std::string::npos);
}

}  // namespace
}  // namespace loom::runtime::cuda
