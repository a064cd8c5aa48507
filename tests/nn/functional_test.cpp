// Losses, attention and rotary embeddings against values computed by hand on the host.
#include "nn/nn_test_util.h"

#include <loom/autograd.h>
#include <loom/nn/functional.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom {
namespace {

namespace F = nn::functional;
using test::expect_near;
using test::values;

// logits [3, 3]; row 2's target is ignored.
Tensor ce_logits() { return from_vector<double>({1, 2, 3, 0, 0, 0, 3, 1, 0}, {3, 3}); }
Tensor ce_targets() { return from_vector<int64_t>({2, 0, -100}, {3}); }

// -log softmax(row)[c]
double nll(std::vector<double> row, int c) {
  double m = std::max({row[0], row[1], row[2]});
  double s = 0;
  for (double x : row) s += std::exp(x - m);
  return -(row[c] - m - std::log(s));
}

TEST(CrossEntropy, MeanOverNonIgnoredTargets) {
  const double l0 = nll({1, 2, 3}, 2), l1 = nll({0, 0, 0}, 0);
  EXPECT_NEAR(l1, std::log(3.0), 1e-15);
  EXPECT_NEAR(F::cross_entropy(ce_logits(), ce_targets()).item<double>(), (l0 + l1) / 2, 1e-12);
  EXPECT_NEAR(F::cross_entropy(ce_logits(), ce_targets(), 0, -100, F::Reduction::Sum).item<double>(), l0 + l1,
              1e-12);
  expect_near(values(F::cross_entropy(ce_logits(), ce_targets(), 0, -100, F::Reduction::None)), {l0, l1, 0},
              1e-12);
  // Without ignore_index matching, row 2 (target -100) would be out of range; a custom
  // ignore_index ignores row 1 instead.
  auto t = from_vector<int64_t>({2, 7, 0}, {3});
  const double l2 = nll({3, 1, 0}, 0);
  EXPECT_NEAR(F::cross_entropy(ce_logits(), t, 0, 7).item<double>(), (l0 + l2) / 2, 1e-12);
}

TEST(CrossEntropy, LabelSmoothingIsPyTorchsFormula) {
  const double eps = 0.1;
  // loss_i = (1 - eps)·nll_i + eps/C · Σ_c nll_i(c), mean over non-ignored rows.
  auto smoothed = [&](std::vector<double> row, int target) {
    double all = nll(row, 0) + nll(row, 1) + nll(row, 2);
    return (1 - eps) * nll(row, target) + eps / 3 * all;
  };
  const double r0 = smoothed({1, 2, 3}, 2), r1 = smoothed({0, 0, 0}, 0);
  EXPECT_NEAR(r1, std::log(3.0), 1e-12);  // uniform logits: every term is log 3
  EXPECT_NEAR(r0, 0.50760596444, 1e-10);  // worked by hand: 0.9·0.40761 + 0.1/3·4.22282
  EXPECT_NEAR(F::cross_entropy(ce_logits(), ce_targets(), eps).item<double>(), (r0 + r1) / 2, 1e-12);
  expect_near(values(F::cross_entropy(ce_logits(), ce_targets(), eps, -100, F::Reduction::None)), {r0, r1, 0},
              1e-12);
}

TEST(CrossEntropy, GradientIsSoftmaxMinusSmoothedTarget) {
  auto logits = ce_logits();
  logits.requires_grad_();
  F::cross_entropy(logits, ce_targets(), 0.1).backward();
  auto g = values(logits.grad());
  // Row i (not ignored): (softmax - ((1-eps)·onehot + eps/C)) / n_valid; ignored rows: 0.
  std::vector<std::vector<double>> rows{{1, 2, 3}, {0, 0, 0}};
  std::vector<int> targets{2, 0};
  for (int i = 0; i < 2; ++i) {
    for (int c = 0; c < 3; ++c) {
      double p = std::exp(-nll(rows[i], c));
      double q = (c == targets[i] ? 0.9 : 0) + 0.1 / 3;
      EXPECT_NEAR(g[i * 3 + c], (p - q) / 2, 1e-12) << i << "," << c;
    }
  }
  for (int c = 0; c < 3; ++c) EXPECT_EQ(g[6 + c], 0);
}

// Ignored rows are left out, not multiplied by 0, and an all-ignored batch (all padding) has
// the mean NaN but a zero gradient, as in PyTorch 1.13 (values from F.cross_entropy): the
// gradient was NaN everywhere (the mean's 1 / 0 times the mask's 0), and an ignored row with
// -Inf in class 0 made the loss NaN (Inf * 0).
TEST(CrossEntropy, IgnoredRowsNeverMakeTheLossOrItsGradientNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  auto x = from_vector<double>({-inf, 2, 3, -inf, 0, 1}, {2, 3});
  x.requires_grad_();
  auto loss = F::cross_entropy(x, from_vector<int64_t>({-100, 2}, {2}));
  loss.backward();
  EXPECT_NEAR(loss.item<double>(), std::log1p(std::exp(-1.0)), 1e-12);  // PyTorch: 0.31326166 (float32)
  expect_near(values(x.grad()), {0, 0, 0, 0, 0.2689414213699951, -0.2689414213699951}, 1e-12);

  for (double smoothing : {0.0, 0.1}) {
    auto y = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
    y.requires_grad_();
    auto all_ignored = F::cross_entropy(y, from_vector<int64_t>({-100, -100}, {2}), smoothing);
    all_ignored.backward();
    EXPECT_TRUE(std::isnan(all_ignored.item<double>())) << "smoothing " << smoothing;
    expect_near(values(y.grad()), {0, 0, 0, 0, 0, 0}, 0);
  }
}

// The row maximum only shifts the exponentials (its gradient is zero): in the backward of the
// loss and of softmax, the forward's maximum is read by the exponentials alone, not by a pass
// that finds where each row's maximum is.
TEST(CrossEntropy, TheBackwardReadsTheRowMaximumOnlyForTheShift) {
  test::fresh_engine();
  auto logits = ce_logits();
  logits.requires_grad_();
  auto attn = ce_logits();
  attn.requires_grad_();
  mark_step();
  F::cross_entropy(logits, ce_targets()).backward();
  (softmax(attn, 1) * ce_logits()).sum().backward();
  for (const Tensor* t : {&logits, &attn}) {
    auto p = test::compile_for_cpu(ir::build_graph({t->grad().impl()->pending()}));
    const auto n_in = static_cast<int>(p.inputs.size());
    int maxima = 0;
    for (std::size_t i = 0; i < p.instrs.size(); ++i) {
      if (p.instrs[i].op != ir::Op::Max) continue;
      ++maxima;
      const int slot = n_in + static_cast<int>(i);
      int readers = 0;
      for (const auto& in : p.instrs)
        readers += static_cast<int>(std::count(in.args.begin(), in.args.end(), slot));
      EXPECT_EQ(readers, 1) << ir::to_text(p);
    }
    EXPECT_EQ(maxima, 1) << ir::to_text(p);
  }
}

TEST(CrossEntropy, RejectsBadShapes) {
  EXPECT_NE(test::error_of([] { F::cross_entropy(zeros({3}), zeros({3}, DType::Int64)); }).find("[N, C]"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { F::cross_entropy(zeros({3, 2}), zeros({2}, DType::Int64)); }).find("[2]"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { F::cross_entropy(zeros({3, 2}), zeros({3})); }).find("int64"), std::string::npos);
}

TEST(MseLossAndAccuracy, Values) {
  auto a = from_vector<double>({1, 2, 3, 4}, {2, 2});
  auto b = from_vector<double>({0, 2, 5, 4}, {2, 2});
  EXPECT_NEAR(F::mse_loss(a, b).item<double>(), 5.0 / 4, 1e-12);
  EXPECT_NEAR(F::mse_loss(a, b, F::Reduction::Sum).item<double>(), 5.0, 1e-12);
  auto logits = from_vector<double>({0, 1, 5, 2, 3, 1, 1, 0, 0}, {3, 3});
  // Row argmaxes are 2, 1, 0.
  EXPECT_NEAR(F::accuracy(logits, from_vector<int64_t>({2, 0, 0}, {3})).item<double>(), 2.0 / 3, 1e-12);
}

// Host attention in double: q [B,H,T,D], k/v [B,Hkv,S,D], query head h reads kv head h/(H/Hkv).
std::vector<double> host_attention(const std::vector<double>& q, const std::vector<double>& k,
                                   const std::vector<double>& v, int64_t B, int64_t H, int64_t Hkv, int64_t T,
                                   int64_t S, int64_t D, bool causal) {
  std::vector<double> out(B * H * T * D, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(S);
        double m = -INFINITY;
        for (int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q[((b * H + h) * T + i) * D + d] * k[((b * Hkv + g) * S + j) * D + d];
          s[j] = causal && j > i ? -INFINITY : dot / std::sqrt(static_cast<double>(D));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (auto& x : s) z += (x = std::exp(x - m));
        for (int64_t j = 0; j < S; ++j)
          for (int64_t d = 0; d < D; ++d)
            out[((b * H + h) * T + i) * D + d] += s[j] / z * v[((b * Hkv + g) * S + j) * D + d];
      }
    }
  return out;
}

using test::random_vector;

TEST(Attention, MatchesHostReferenceWithGroupedQueryHeads) {
  const int64_t B = 2, H = 4, Hkv = 2, T = 5, D = 3;
  auto q = random_vector(B * H * T * D, 1), k = random_vector(B * Hkv * T * D, 2),
       v = random_vector(B * Hkv * T * D, 3);
  for (bool causal : {false, true}) {
    auto out = F::scaled_dot_product_attention(from_vector(q, {B, H, T, D}), from_vector(k, {B, Hkv, T, D}),
                                               from_vector(v, {B, Hkv, T, D}), causal);
    EXPECT_EQ(out.shape(), (Shape{B, H, T, D}));
    expect_near(values(out), host_attention(q, k, v, B, H, Hkv, T, T, D, causal), 1e-12);
  }
  EXPECT_NE(test::error_of([] {
              F::scaled_dot_product_attention(zeros({1, 3, 2, 4}), zeros({1, 2, 2, 4}), zeros({1, 2, 2, 4}));
            }).find("divisible"),
            std::string::npos);
}

TEST(Attention, CausalPositionZeroSeesOnlyItself) {
  const int64_t B = 1, H = 2, T = 4, D = 8;
  auto q = from_vector(random_vector(B * H * T * D, 4), {B, H, T, D});
  auto k = random_vector(B * H * T * D, 5), v = random_vector(B * H * T * D, 6);
  auto out = values(F::scaled_dot_product_attention(q, from_vector(k, {B, H, T, D}), from_vector(v, {B, H, T, D}), true));
  // Change keys and values at positions 1.. only.
  auto k2 = k, v2 = v;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 1; t < T; ++t)
      for (int64_t d = 0; d < D; ++d) {
        k2[(h * T + t) * D + d] += 3;
        v2[(h * T + t) * D + d] -= 5;
      }
  auto out2 = values(F::scaled_dot_product_attention(q, from_vector(k2, {B, H, T, D}), from_vector(v2, {B, H, T, D}), true));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d) {
      std::size_t at = (h * T + 0) * D + d;
      EXPECT_EQ(out[at], out2[at]);
      EXPECT_NEAR(out[at], v[at], 1e-12);  // softmax over one key is 1
    }
  EXPECT_NE(out[(0 * T + 1) * D], out2[(0 * T + 1) * D]);  // position 1 does see position 1
}

TEST(Attention, GradientFlowsToQKV) {
  auto q = randn({1, 2, 3, 4}, 1, DType::Float64), k = randn({1, 1, 3, 4}, 2, DType::Float64),
       v = randn({1, 1, 3, 4}, 3, DType::Float64);
  q.requires_grad_(), k.requires_grad_(), v.requires_grad_();
  F::scaled_dot_product_attention(q, k, v, true).sum().backward();
  for (auto* t : {&q, &k, &v}) {
    ASSERT_TRUE(t->grad().defined());
    for (double g : values(t->grad())) EXPECT_TRUE(std::isfinite(g));
  }
  // A sum over the output: d/dv_j = number of (head, query) pairs attending j with weight.
  // Every row of attention sums to 1, so the total of dv is H·T per feature.
  auto gv = values(v.grad());
  double total = 0;
  for (std::size_t i = 0; i < gv.size(); i += 4) total += gv[i];
  EXPECT_NEAR(total, 2 * 3, 1e-12);
}

TEST(Rotary, TablesFollowLlamaConvention) {
  const int64_t T = 3, D = 4;
  auto [c, s] = F::rotary_cos_sin(T, D, 10000.0, DType::Float64);
  EXPECT_EQ(c.shape(), (Shape{T, D}));
  std::vector<double> wc, ws;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) {
      double inv_freq = 1 / std::pow(10000.0, 2.0 * (i % (D / 2)) / D);
      wc.push_back(std::cos(t * inv_freq));
      ws.push_back(std::sin(t * inv_freq));
    }
  expect_near(values(c), wc, 1e-12);
  expect_near(values(s), ws, 1e-12);

  // rotate_half([1,2,3,4]) = [-3,-4,1,2]; position 0 leaves x unchanged.
  auto x = from_vector<double>({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}, {1, T, D});
  expect_near(values(F::rotate_half(x)), {-3, -4, 1, 2, -3, -4, 1, 2, -3, -4, 1, 2}, 0);
  auto r = values(F::apply_rotary_pos_emb(x, c, s));
  expect_near({r[0], r[1], r[2], r[3]}, {1, 2, 3, 4}, 1e-12);
  // Position 1, pair (x0, x2) rotates by angle 1: (x0 cos - x2 sin, x2 cos + x0 sin).
  EXPECT_NEAR(r[4], std::cos(1.0) - 3 * std::sin(1.0), 1e-12);
  EXPECT_NEAR(r[6], 3 * std::cos(1.0) + std::sin(1.0), 1e-12);
  // Rotations keep the norm.
  double n0 = 0, n2 = 0;
  for (int i = 0; i < 4; ++i) n0 += r[8 + i] * r[8 + i];
  for (double v : {1, 2, 3, 4}) n2 += v * v;
  EXPECT_NEAR(n0, n2, 1e-12);
  // start_pos shifts positions.
  auto [c2, s2] = F::rotary_cos_sin(1, D, 10000.0, DType::Float64, 2);
  expect_near(values(c2), {wc[8], wc[9], wc[10], wc[11]}, 1e-12);
  EXPECT_NE(test::error_of([] { F::rotary_cos_sin(3, 5); }).find("even"), std::string::npos);
}

// bfloat16 tables are the float32 ones rounded once: positions past 256 and the angles are
// not rounded to bfloat16 on the way (HF computes them in float32 too).
TEST(Rotary, BFloat16TablesAreTheFloat32OnesRounded) {
  const int64_t T = 300, D = 8;
  auto [c32, s32] = F::rotary_cos_sin(T, D, 10000.0, DType::Float32);
  auto [c16, s16] = F::rotary_cos_sin(T, D, 10000.0, DType::BFloat16);
  ASSERT_EQ(c16.dtype(), DType::BFloat16);
  EXPECT_EQ(values(c16), values(c32.to(DType::BFloat16)));
  EXPECT_EQ(values(s16), values(s32.to(DType::BFloat16)));
  // Position 299's first pair turns by 299 radians: cos(299) = -0.853..., where a bfloat16
  // position (300) and angle would give cos(300) = -0.0221...
  EXPECT_NEAR(values(c16)[299 * D], std::cos(299.0), 4e-3);
}

TEST(GradCheck, CrossEntropyAttentionRotary) {
  auto targets = from_vector<int64_t>({2, -100, 0, 1}, {4});
  test::expect_gradient_matches([&](const Tensor& x) { return F::cross_entropy(x, targets, 0.2); },
                                random_vector(12, 20), {4, 3});
  // Attention: q is x, k and v fixed; weight the output so every element matters.
  auto k = from_vector(random_vector(2 * 3 * 2, 21), {1, 2, 3, 2});
  auto v = from_vector(random_vector(2 * 3 * 2, 22), {1, 2, 3, 2});
  auto r = from_vector(random_vector(4 * 3 * 2, 23), {1, 4, 3, 2});
  test::expect_gradient_matches(
      [&](const Tensor& q) { return (F::scaled_dot_product_attention(q, k, v, true) * r).sum(); },
      random_vector(4 * 3 * 2, 24), {1, 4, 3, 2});
  auto [c, s] = F::rotary_cos_sin(3, 4, 10000.0, DType::Float64);
  auto w = from_vector(random_vector(2 * 3 * 4, 25), {2, 3, 4});
  test::expect_gradient_matches([&](const Tensor& x) { return (F::apply_rotary_pos_emb(x, c, s) * w).sum(); },
                                random_vector(2 * 3 * 4, 26), {2, 3, 4});
}

// The tables and the causal mask come from iota: the only host data in their graphs are
// the engine's 0-d scalars (theta, head_dim, ...), whatever the sequence length.
TEST(Rotary, TablesAndCausalMaskUseNoHostArrays) {
  auto largest_leaf = [](const Tensor& t) {
    int64_t n = 0;
    for (const auto& node : test::graph_of(t).nodes)
      if (node->op() == ir::Op::DeviceData) n = std::max(n, shape_numel(node->shape()));
    return n;
  };
  auto [c, s] = F::rotary_cos_sin(64, 32, 10000.0, DType::Float32);
  EXPECT_LE(largest_leaf(c), 1);
  EXPECT_LE(largest_leaf(s), 1);
  EXPECT_GT(test::count_ops(test::graph_of(c), ir::Op::Iota), 0);

  auto q = zeros({1, 1, 8, 4});  // constants, not device data
  auto out = F::scaled_dot_product_attention(q, q, q, true);
  EXPECT_LE(largest_leaf(out), 1);
}

}  // namespace
}  // namespace loom
