// The fusion and dead-code passes: what they make of traced graphs, and that fused programs
// compute what one op at a time computes.
#include "compiler/pipeline.h"
#include "test_util.h"

#include <cmath>

namespace loom {
namespace {

using ir::Program;

Program compiled(const Tensor& t) { return test::compile_for_cpu(test::graph_of(t)); }

std::vector<float> values(int64_t n, float scale = 0.37f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * scale) * 3;
  return v;
}

TEST(FuseElementwise, ChainBecomesOneInstructionReadingItsInputOnce) {
  test::fresh_engine();
  auto x = from_vector(values(4099), {4099});
  auto y = sin(cos(x));
  auto p = compiled(y);
  ASSERT_EQ(p.instrs.size(), 1u) << ir::to_text(p);
  const auto& f = *p.instrs[0].fusion;
  ASSERT_EQ(f.steps.size(), 2u);
  EXPECT_EQ(f.steps[0].op, ir::Op::Cos);
  EXPECT_EQ(f.steps[1].op, ir::Op::Sin);
  ASSERT_EQ(f.loads.size(), 1u);
  EXPECT_EQ(f.register_of[0], -1) << "a contiguous float input is read in place";

  auto got = y.to_vector<float>();
  auto in = values(4099);
  for (int64_t i = 0; i < 4099; ++i) EXPECT_NEAR(got[i], std::sin(std::cos(in[i])), 2e-6f) << i;
}

TEST(FuseElementwise, BroadcastsAndConstantsFoldIntoTheFusion) {
  test::fresh_engine();
  auto x = from_vector(values(2 * 3 * 5 * 7), {2, 3, 5, 7});
  auto scale = from_vector(values(3, 1.1f), {1, 3, 1, 1});
  auto shift = from_vector(values(7, 0.7f), {7});
  auto y = relu(x * scale + shift) * 2.0 + 1.0;
  auto p = compiled(y);
  int fused = 0, expands = 0;
  for (const auto& in : p.instrs) {
    fused += in.fusion != nullptr;
    expands += in.op == ir::Op::Expand;
  }
  EXPECT_EQ(fused, 1) << ir::to_text(p);
  EXPECT_EQ(expands, 0) << "broadcasts are strided loads, not materialised\n" << ir::to_text(p);

  // The same expression one op at a time (eager: every broadcast materialised).
  std::vector<float> eager;
  {
    EagerModeGuard eager_ops{true};
    eager = (relu(x * scale + shift) * 2.0 + 1.0).to_vector<float>();
  }
  EXPECT_EQ(y.to_vector<float>(), eager);
  auto xv = values(210), sv = values(3, 1.1f), bv = values(7, 0.7f);
  auto got = y.to_vector<float>();
  for (int64_t i = 0; i < 210; ++i) {
    int64_t c = (i / 35) % 3, w = i % 7;
    float r = std::max(xv[i] * sv[c] + bv[w], 0.0f) * 2 + 1;
    EXPECT_NEAR(got[i], r, 1e-5f) << i;
  }
}

TEST(FuseElementwise, AValueReadTwiceIsComputedOnce) {
  test::fresh_engine();
  auto x = from_vector(values(100), {100});
  auto e = exp(x);
  auto a = e + 1.0;
  auto b = e * 3.0;
  auto p = test::compile_for_cpu(ir::build_graph({a.impl()->pending(), b.impl()->pending()}));
  int fused = 0;
  for (const auto& in : p.instrs) {
    if (!in.fusion) continue;
    ++fused;
    int exps = 0;
    for (const auto& s : in.fusion->steps) exps += s.op == ir::Op::Exp;
    EXPECT_EQ(exps, &in == &p.instrs[0] ? 1 : 0) << "exp runs once, first\n" << ir::to_text(p);
  }
  EXPECT_EQ(fused, 3) << ir::to_text(p);
  mark_step();
  const auto xv = values(100), av = a.to_vector<float>(), bv = b.to_vector<float>();
  for (int i = 0; i < 100; ++i) {
    const double e = std::exp(static_cast<double>(xv[i]));
    EXPECT_NEAR(av[i], e + 1, 4e-7 * (e + 1)) << i;
    EXPECT_NEAR(bv[i], e * 3, 4e-7 * e * 3) << i;
  }
}

// A value cheap to compute again (fuse_elementwise.h) is computed in each fusion that reads it
// instead of being stored and loaded back: the widening cast of a bfloat16 tensor, and the
// centring after it, read by a reduction and by two elementwise chains.
TEST(FuseElementwise, CheapValuesAreComputedWhereTheyAreRead) {
  test::fresh_engine();
  auto x = from_vector(values(4096), {64, 64}).to(DType::BFloat16);
  auto shift = from_vector(values(64, 0.3f), {64});
  mark_step();
  auto centred = x.to(DType::Float32) - shift;
  auto a = relu(centred * 2.0);
  auto b = (centred + 1.0).to(DType::BFloat16);
  auto s = centred.sum({0});
  auto p = test::compile_for_cpu(
      ir::build_graph({a.impl()->pending(), b.impl()->pending(), s.impl()->pending()}));
  int fused = 0;
  for (const auto& in : p.instrs) {
    if (in.op == ir::Op::Reshape) continue;  // the shift seen as [1, 64] (no copy)
    ASSERT_TRUE(in.fusion) << "every other instruction is one of the three readers\n" << ir::to_text(p);
    ++fused;
    ASSERT_GE(in.fusion->loads.size(), 2u) << ir::to_text(p);
    EXPECT_EQ(in.fusion->loads[0].dtype, DType::BFloat16) << "x is read as stored\n" << ir::to_text(p);
    EXPECT_EQ(in.fusion->steps[0].op, ir::Op::Cast) << ir::to_text(p);
  }
  EXPECT_EQ(fused, 3) << ir::to_text(p);
  mark_step();
  std::vector<float> ea, eb, es;
  {
    EagerModeGuard eager(true);
    auto ec = x.to(DType::Float32) - shift;
    ea = relu(ec * 2.0).to_vector<float>();
    eb = (ec + 1.0).to(DType::BFloat16).to(DType::Float32).to_vector<float>();
    es = ec.sum({0}).to_vector<float>();
  }
  EXPECT_EQ(a.to_vector<float>(), ea);
  EXPECT_EQ(b.to(DType::Float32).to_vector<float>(), eb);
  EXPECT_EQ(s.to_vector<float>(), es);
}

// A float32 BatchNorm and ReLU over [N, C, H, W], its normalised value also read by two other
// chains (a residual add and a mask): the per-channel mean, scale and shift are broadcasts
// small enough to stay in cache, so the centring and scaling are recomputed in every reader,
// and nothing but the ReLU's result (and the readers' own results) is stored.
TEST(FuseElementwise, ABatchNormsScaleAndShiftAreRecomputedInEachReader) {
  test::fresh_engine();
  const int64_t n = 8, c = 16, hw = 64;
  auto x = from_vector(values(n * c * hw), {n, c, 8, 8});
  auto mean = from_vector(values(c, 0.3f), {1, c, 1, 1});
  auto scale = from_vector(values(c, 0.7f), {1, c, 1, 1});
  auto shift = from_vector(values(c, 0.9f), {1, c, 1, 1});
  auto skip = from_vector(values(n * c * hw, 0.05f), {n, c, 8, 8});
  mark_step();
  auto normed = (x - mean) * scale + shift;
  auto out = relu(normed);
  auto residual = normed + skip;
  auto mask = gt(normed, zeros({})).to(DType::Float32) * skip;
  auto p = test::compile_for_cpu(ir::build_graph(
      {out.impl()->pending(), residual.impl()->pending(), mask.impl()->pending()}));
  int stored = 0;
  for (const auto& in : p.instrs) {
    if (!in.fusion || shape_numel(in.shape) != n * c * hw) continue;
    ++stored;
    EXPECT_EQ(in.fusion->loads[0].dtype, DType::Float32);
    int subs = 0;
    for (const auto& st : in.fusion->steps) subs += st.op == ir::Op::Sub;
    EXPECT_EQ(subs, 1) << "each reader centres x itself\n" << ir::to_text(p);
  }
  EXPECT_EQ(stored, 3) << "the three results only\n" << ir::to_text(p);
  std::vector<float> e_out, e_res, e_mask;
  {
    EagerModeGuard eager(true);
    auto en = (x - mean) * scale + shift;
    e_out = relu(en).to_vector<float>();
    e_res = (en + skip).to_vector<float>();
    e_mask = (gt(en, zeros({})).to(DType::Float32) * skip).to_vector<float>();
  }
  EXPECT_EQ(out.to_vector<float>(), e_out);
  EXPECT_EQ(residual.to_vector<float>(), e_res);
  EXPECT_EQ(mask.to_vector<float>(), e_mask);
}

// A cheap value stored anyway (here a result of the program, as a ReLU read by a conv is) is
// loaded by its other readers, not recomputed from its operand, when recomputing reads as many
// bytes as loading: a residual block's ReLU over the sum of a BatchNorm and the skip, read by
// the next block's residual add and the gradient's mask. Then the sum itself is never stored:
// it is computed in the ReLU's fusion alone.
TEST(FuseElementwise, AValueStoredAnywayIsLoadedByItsReadersNotRecomputed) {
  test::fresh_engine();
  const int64_t n = 8, c = 16, hw = 64;
  auto x = from_vector(values(n * c * hw), {n, c, 8, 8});
  auto scale = from_vector(values(c, 0.7f), {1, c, 1, 1});
  auto skip = from_vector(values(n * c * hw, 0.05f), {n, c, 8, 8});
  auto next = from_vector(values(n * c * hw, 0.02f), {n, c, 8, 8});
  mark_step();
  auto sum = x * scale + skip;
  auto out = relu(sum);
  auto residual = out + next;
  auto mask = gt(out, zeros({})).to(DType::Float32) * next;
  auto p = test::compile_for_cpu(ir::build_graph(
      {out.impl()->pending(), residual.impl()->pending(), mask.impl()->pending()}));
  int stored = 0, adds_of_skip = 0;
  for (const auto& in : p.instrs) {
    if (!in.fusion || shape_numel(in.shape) != n * c * hw) continue;
    ++stored;
    for (const auto& st : in.fusion->steps) adds_of_skip += st.op == ir::Op::Add;
  }
  EXPECT_EQ(stored, 3) << "the three results only, the sum in the ReLU's fusion\n"
                       << ir::to_text(p);
  EXPECT_EQ(adds_of_skip, 2) << "the skip is added once; the residual adds `next`\n"
                             << ir::to_text(p);
  std::vector<float> e_out, e_res, e_mask;
  {
    EagerModeGuard eager(true);
    auto es = x * scale + skip;
    e_out = relu(es).to_vector<float>();
    e_res = (relu(es) + next).to_vector<float>();
    e_mask = (gt(relu(es), zeros({})).to(DType::Float32) * next).to_vector<float>();
  }
  EXPECT_EQ(out.to_vector<float>(), e_out);
  EXPECT_EQ(residual.to_vector<float>(), e_res);
  EXPECT_EQ(mask.to_vector<float>(), e_mask);
}

// Under autocast a residual block's bfloat16 sum goes through a ReLU that is rounded for the
// next conv and read by two other chains (compiler/widen.h's read_exact_roundings): those read
// the rounding, the ReLU's values exactly, so the sum is computed in the rounding's fusion and
// never stored. A value that is not exactly a bfloat16 (the sum scaled by 0.3) keeps its
// readers, and every result keeps the bits of one op at a time.
TEST(FuseElementwise, ReadersOfAnExactlyRoundedValueReadTheRounding) {
  for (bool exact : {true, false}) {
    test::fresh_engine();
    const int64_t n = 8, c = 16, hw = 64;
    auto a = from_vector(values(n * c * hw), {n, c, 8, 8});
    auto b = from_vector(values(n * c * hw, 0.05f), {n, c, 8, 8});
    auto z = from_vector(values(n * c * hw, 0.02f), {n, c, 8, 8});
    mark_step();
    auto f = [&](const Tensor& x, const Tensor& y, const Tensor& w) {
      auto sum = (x + y).to(DType::BFloat16).to(DType::Float32);
      auto r = exact ? relu(sum) : relu(sum) * 0.3;
      return std::vector<Tensor>{r.to(DType::BFloat16), r + w,
                                 gt(r, zeros({})).to(DType::Float32) * w};
    };
    auto outs = f(a, b, z);
    auto p = test::compile_for_cpu(ir::build_graph(
        {outs[0].impl()->pending(), outs[1].impl()->pending(), outs[2].impl()->pending()}));
    int stored = 0;
    for (const auto& in : p.instrs) stored += in.fusion && shape_numel(in.shape) == n * c * hw;
    if (exact) {
      EXPECT_EQ(stored, 3) << "the three results only\n" << ir::to_text(p);
    }
    mark_step();  // the three computed in one program, as compiled above
    std::vector<std::vector<float>> want;
    {
      EagerModeGuard eager(true);
      for (const auto& t : f(a, b, z)) want.push_back(t.to(DType::Float32).to_vector<float>());
    }
    for (std::size_t k = 0; k < outs.size(); ++k)
      EXPECT_EQ(outs[k].to(DType::Float32).to_vector<float>(), want[k])
          << "result " << k << (exact ? "" : ", inexact");
  }
}

// A value is stored when computing it in each reader moves more bytes than storing it once: a
// sum of two float32 tensors read by three chains (8 bytes an element in each reader, against
// 8 to compute it once, 4 to store it and 4 per reader to load it).
TEST(FuseElementwise, AValueDearerToComputeThanToLoadIsStored) {
  test::fresh_engine();
  auto x = from_vector(values(1000), {1000});
  auto y = from_vector(values(1000, 0.11f), {1000});
  mark_step();
  auto t = x + y;
  auto a = t * 3.0;
  auto b = t - 1.0;
  auto c = relu(t);
  auto p = test::compile_for_cpu(
      ir::build_graph({a.impl()->pending(), b.impl()->pending(), c.impl()->pending()}));
  int fused = 0, adds = 0;
  for (const auto& in : p.instrs) {
    if (!in.fusion) continue;  // the scalar seen as [1] (no copy)
    ++fused;
    for (const auto& st : in.fusion->steps) adds += st.op == ir::Op::Add;
  }
  EXPECT_EQ(fused, 4) << ir::to_text(p);
  EXPECT_EQ(adds, 1) << "x + y runs once\n" << ir::to_text(p);
}

// A BatchNorm's float32 input gradient over bfloat16 operands, read by its sum and by the
// rounding for the conv: too dear to compute again on its own (a bool mask and two bfloat16
// tensors are 5 bytes an element, its result 4), but computing it in both readers moves fewer
// bytes than storing it and loading it twice, so no float32 tensor is stored. The ReLU's mask
// it reads, computed from x, is read by a third chain too: a byte to load against six steps
// to compute, it is stored. Every result keeps its bits.
TEST(FuseElementwise, ABatchNormsInputGradientIsComputedInItsSumAndItsRounding) {
  test::fresh_engine();
  const int64_t n = 512, c = 16;
  auto x = from_vector(values(n * c), {n, c}).to(DType::BFloat16);
  auto g = from_vector(values(n * c, 0.21f), {n, c}).to(DType::BFloat16);
  auto mean = from_vector(values(c, 0.3f), {1, c});
  auto scale = from_vector(values(c, 0.7f), {1, c});
  auto shift = from_vector(values(c, 0.9f), {1, c});
  auto k = from_vector(values(c, 1.3f), {1, c});
  mark_step();
  auto trace = [&] {
    auto xf = x.to(DType::Float32);
    auto mask = gt(relu((xf - mean) * scale + shift), zeros({})).to(DType::Float32);
    auto dc = g.to(DType::Float32) * mask * scale + (xf - mean) * k;
    auto s = (-dc).sum({0}, true);
    auto dx = (dc + s * (1.0 / static_cast<double>(n))).to(DType::BFloat16);
    auto sg = (g.to(DType::Float32) * mask).sum({0}, true);
    return std::vector<Tensor>{dx, s, sg};
  };
  auto got = trace();
  auto p = test::compile_for_cpu(ir::build_graph(
      {got[0].impl()->pending(), got[1].impl()->pending(), got[2].impl()->pending()}));
  int masks = 0;
  for (const auto& in : p.instrs) {
    if (in.op == ir::Op::Reshape || shape_numel(in.shape) != n * c) continue;
    EXPECT_NE(in.dtype, DType::Float32) << "no float32 tensor is stored\n" << ir::to_text(p);
    masks += in.dtype == DType::Bool;
  }
  EXPECT_EQ(masks, 1) << "the mask is stored once\n" << ir::to_text(p);
  for (const auto& in : p.instrs) {
    if (in.op != ir::Op::Sum) continue;
    EXPECT_TRUE(in.fusion) << "each sum computes its operand\n" << ir::to_text(p);
  }
  mark_step();
  std::vector<std::vector<float>> want;
  {
    EagerModeGuard eager(true);
    for (const auto& t : trace()) want.push_back(t.to(DType::Float32).to_vector<float>());
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].to(DType::Float32).to_vector<float>(), want[i]) << "result " << i;
}

TEST(FuseElementwise, ComparisonsWhereAndCastsInFloat64) {
  test::fresh_engine();
  std::vector<double> xv(1000), yv(1000);
  for (int i = 0; i < 1000; ++i) xv[i] = std::cos(i * 0.1), yv[i] = std::sin(i * 0.3);
  auto x = from_vector(xv, {10, 100});
  auto y = from_vector(yv, {10, 100});
  auto mask = gt(x, y);
  auto z = where(mask, x - y, y * y) + mask.to(DType::Float64) - logical_not(lt(x, scalar_tensor(0.0, DType::Float64))).to(DType::Float64);
  auto p = compiled(z);
  EXPECT_EQ(p.instrs.size(), 1u) << ir::to_text(p);
  auto got = z.to_vector<double>();
  for (int i = 0; i < 1000; ++i) {
    bool m = xv[i] > yv[i];
    double r = (m ? xv[i] - yv[i] : yv[i] * yv[i]) + (m ? 1 : 0) - (xv[i] < 0 ? 0 : 1);
    EXPECT_DOUBLE_EQ(got[i], r) << i;
  }
}

TEST(FuseElementwise, BoolResultAndIntegerOpsStayCorrect) {
  test::fresh_engine();
  auto x = from_vector(values(64), {8, 8});
  auto positive = gt(x * 2.0, scalar_tensor(0.5));  // a fused chain ending in a comparison: a bool result
  auto counts = positive.to(DType::Int64).sum();
  auto v = positive.to_vector<bool>();
  auto xv = values(64);
  int64_t expected = 0;
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(v[i], xv[i] * 2 > 0.5f) << i;
    expected += xv[i] * 2 > 0.5f;
  }
  EXPECT_EQ(counts.item<int64_t>(), expected);
}

TEST(FuseElementwise, LongChainsSplitAndStayExact) {
  test::fresh_engine();
  auto x = from_vector(values(3000), {3000});
  Tensor y = x;
  std::vector<float> ref = values(3000);
  for (int k = 0; k < 100; ++k) {
    y = y * 0.5 + 0.25;
    for (auto& r : ref) r = r * 0.5f + 0.25f;
  }
  auto p = compiled(y);
  EXPECT_GT(p.instrs.size(), 1u) << "a fusion has a bounded number of members";
  EXPECT_EQ(y.to_vector<float>(), ref);
}

TEST(DeadCode, FoldedBroadcastsLeaveNothingBehind) {
  test::fresh_engine();
  auto x = from_vector(values(12), {3, 4});
  auto b = from_vector(values(4), {4});
  auto p = compiled(x + b);
  // What is left: the bias reshaped to [1,4] (no copy: reshapes share storage) and the fusion.
  ASSERT_EQ(p.instrs.size(), 2u) << ir::to_text(p);
  EXPECT_EQ(p.instrs[0].op, ir::Op::Reshape);
  ASSERT_NE(p.instrs[1].fusion, nullptr);
  EXPECT_EQ(p.instrs[1].fusion->loads.size(), 2u);
  EXPECT_EQ(p.instrs[1].fusion->loads[1].strides, (std::vector<int64_t>{0, 1}));
}

// A permute that keeps the innermost dimension innermost (attention's [B,T,H,D] <-> [B,H,T,D])
// is read by the fusion through a strided load of its source: it is not stored. One that moves
// the innermost dimension (a layout change) keeps its kernel. The values are eager mode's.
TEST(FuseElementwise, AHeadPermuteIsReadThroughAndATransposeIsNot) {
  test::fresh_engine();
  const Shape shape{2, 5, 3, 8};  // [B, T, H, D]
  auto x = from_vector(values(2 * 5 * 3 * 8), shape);
  auto y = from_vector(values(2 * 3 * 5 * 8, 0.21f), {2, 3, 5, 8});
  mark_step();
  auto heads = permute(x, {0, 2, 1, 3}) * 2.0 + y;  // [B, H, T, D]
  auto p = compiled(heads);
  EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 0) << ir::to_text(p);
  ASSERT_EQ(p.instrs.back().fusion->loads.size(), 3u) << ir::to_text(p);  // x, 2.0, y
  // [2,3,5,8] over x [2,5,3,8]: strides 120, 8, 24, 1; no two dimensions merge.
  EXPECT_EQ(p.instrs.back().fusion->loads[0].strides, (std::vector<int64_t>{120, 8, 24, 1}));
  auto flipped = permute(x, {0, 1, 3, 2}) + 1.0;  // [B, T, D, H]: the innermost moves
  EXPECT_EQ(test::count_instrs(compiled(flipped), ir::Op::Permute), 1);

  const auto got = heads.to_vector<float>(), got_flipped = flipped.to_vector<float>();
  eager_mode(true);
  const auto want = (permute(x, {0, 2, 1, 3}) * 2.0 + y).to_vector<float>();
  const auto want_flipped = (permute(x, {0, 1, 3, 2}) + 1.0).to_vector<float>();
  eager_mode(false);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_flipped, want_flipped);
  EXPECT_NE(got[1], got[8]);  // the permute moved values (x's [0,0,0,1] and [0,1,0,0])
}

// Slices, and slices of such a permute, are read through too: a rotary embedding's halves of
// each head, [B,H,T,D/2] out of the [B,T,H,D] projection, become loads at an offset, and
// neither the slices nor the permute are stored. The values are eager mode's.
TEST(FuseElementwise, SlicesOfAPermuteAreReadThrough) {
  test::fresh_engine();
  auto x = from_vector(values(2 * 5 * 3 * 8), {2, 5, 3, 8});  // [B, T, H, D]
  mark_step();
  auto rotate = [](const Tensor& q) {  // [B, H, T, D]: (-second half) * 3 + first half
    return -slice(q, 3, 4, 8) * 3.0 + slice(q, 3, 0, 4);
  };
  auto y = rotate(permute(x, {0, 2, 1, 3}));
  auto p = compiled(y);
  EXPECT_EQ(test::count_instrs(p, ir::Op::Slice), 0) << ir::to_text(p);
  EXPECT_EQ(test::count_instrs(p, ir::Op::Permute), 0) << ir::to_text(p);
  const auto& loads = p.instrs.back().fusion->loads;
  ASSERT_GE(loads.size(), 2u) << ir::to_text(p);
  // [2,3,5,4] over x [2,5,3,8]: strides 120, 8, 24, 1 from offset 4 (the second half) and 0.
  EXPECT_EQ(loads[0].strides, (std::vector<int64_t>{120, 8, 24, 1}));
  EXPECT_EQ(loads[0].offset, 4);
  EXPECT_EQ(loads.back().offset, 0);
  const auto got = y.to_vector<float>();
  eager_mode(true);
  const auto want = rotate(permute(x, {0, 2, 1, 3})).to_vector<float>();
  eager_mode(false);
  EXPECT_EQ(got, want);
  const auto in = values(2 * 5 * 3 * 8);
  EXPECT_FLOAT_EQ(got[0], -in[4] * 3 + in[0]);  // head 0, token 0, lane 0
  EXPECT_FLOAT_EQ(got[4], -in[24 + 4] * 3 + in[24]);  // token 1
}

TEST(FuseReduce, AReductionComputesItsOperandsChainAsItReads) {
  test::fresh_engine();
  auto x = from_vector(values(4 * 3 * 50 * 7), {4, 3, 50, 7});
  auto m = from_vector(values(3, 0.9f), {1, 3, 1, 1});
  auto centred = x - m;
  // Per-channel variance, as BatchNorm computes it: reduced axes outside and inside the kept one.
  auto var = (centred * centred).mean({0, 2, 3});
  auto rows = exp(x * 0.5).sum({3});  // reduced innermost
  auto cols = (x * x).sum({0});       // kept innermost
  for (const Tensor* t : {&var, &rows, &cols}) {
    auto p = compiled(*t);
    int computing = 0;  // instructions other than reshapes
    for (const auto& in : p.instrs) {
      if (in.op == ir::Op::Reshape) continue;
      ++computing;
      EXPECT_EQ(ir::op_info(in.op).group, ir::OpGroup::Reduce) << ir::to_text(p);
      EXPECT_NE(in.fusion, nullptr) << "the chain is the reduction's prologue\n" << ir::to_text(p);
    }
    EXPECT_EQ(computing, 1) << ir::to_text(p);
  }
  // One op at a time, the operand goes to memory first; the sums fold in the same order.
  std::vector<float> eager_var, eager_rows, eager_cols;
  {
    EagerModeGuard eager_ops{true};
    auto c = x - m;
    eager_var = (c * c).mean({0, 2, 3}).to_vector<float>();
    eager_rows = exp(x * 0.5).sum({3}).to_vector<float>();
    eager_cols = (x * x).sum({0}).to_vector<float>();
  }
  EXPECT_EQ(var.to_vector<float>(), eager_var);
  EXPECT_EQ(rows.to_vector<float>(), eager_rows);
  EXPECT_EQ(cols.to_vector<float>(), eager_cols);
  // And against a float64 sum on the host.
  auto xv = values(4 * 3 * 50 * 7), mv = values(3, 0.9f);
  auto got = var.to_vector<float>();
  for (int c = 0; c < 3; ++c) {
    double s = 0;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 350; ++i) {
        double d = xv[(n * 3 + c) * 350 + i] - mv[c];
        s += d * d;
      }
    EXPECT_NEAR(got[c], s / 1400, 1e-5) << c;
  }
  // rows: exp(x/2) summed over the innermost 7; cols: x² summed over the 4 images.
  const auto got_rows = rows.to_vector<float>(), got_cols = cols.to_vector<float>();
  for (int r = 0; r < 4 * 3 * 50; ++r) {
    double want = 0;
    for (int i = 0; i < 7; ++i) want += std::exp(0.5 * xv[r * 7 + i]);
    EXPECT_NEAR(got_rows[r], want, 1e-6 * want) << "row " << r;
  }
  for (int k = 0; k < 3 * 50 * 7; ++k) {
    double want = 0;
    for (int n = 0; n < 4; ++n) want += static_cast<double>(xv[n * 1050 + k]) * xv[n * 1050 + k];
    EXPECT_NEAR(got_cols[k], want, 1e-6 * (1 + want)) << "column " << k;
  }
}

}  // namespace
}  // namespace loom
