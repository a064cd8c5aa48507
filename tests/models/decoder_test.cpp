// Decoder: Hugging Face LlamaForCausalLM names and shapes, causality, gradients to every
// parameter, config validation, and a steady training step that compiles nothing.
#include "nn/nn_test_util.h"

#include "runtime/cpu/heap_count.h"

#include <loom/autograd.h>
#include <loom/models/decoder.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>

#include <tbb/global_control.h>

#include <cmath>

namespace loom {
namespace {

namespace F = nn::functional;
using test::values;

models::DecoderConfig tiny() {
  return {.vocab_size = 16, .hidden_size = 8, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
          .intermediate_size = 12, .max_seq_len = 8};
}

TEST(Decoder, ParameterNamesAndShapesMatchHuggingFaceLlama) {
  models::Decoder lm(tiny());
  std::vector<std::pair<std::string, Shape>> want{{"model.embed_tokens.weight", {16, 8}}};
  for (int i = 0; i < 2; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    // head_dim 2: q and o project 4 heads, k and v 2 kv heads.
    want.insert(want.end(), {{p + "self_attn.q_proj.weight", {8, 8}},
                             {p + "self_attn.k_proj.weight", {4, 8}},
                             {p + "self_attn.v_proj.weight", {4, 8}},
                             {p + "self_attn.o_proj.weight", {8, 8}},
                             {p + "mlp.gate_proj.weight", {12, 8}},
                             {p + "mlp.up_proj.weight", {12, 8}},
                             {p + "mlp.down_proj.weight", {8, 12}},
                             {p + "input_layernorm.weight", {8}},
                             {p + "post_attention_layernorm.weight", {8}}});
  }
  want.insert(want.end(), {{"model.norm.weight", {8}}, {"lm_head.weight", {16, 8}}});
  EXPECT_EQ(test::names_and_shapes(lm.named_parameters()), want);
  EXPECT_EQ(lm.state_dict().size(), want.size());  // no buffers
}

TEST(Decoder, InitialisationFollowsHuggingFace) {
  nn::manual_seed(0);
  models::DecoderConfig c = tiny();
  c.hidden_size = 64;
  c.vocab_size = 512;
  models::Decoder lm(c);
  auto w = values(lm.lm_head->weight);
  double s = 0;
  for (double x : w) s += x * x / w.size();
  EXPECT_NEAR(std::sqrt(s), 0.02, 0.001);
  test::expect_near(values(lm.model->norm->weight), std::vector<double>(64, 1), 0);
}

TEST(Decoder, ForwardShapeAndCausality) {
  nn::manual_seed(2);
  models::Decoder lm(tiny());
  auto a = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {2, 5});
  auto b = from_vector<int64_t>({1, 2, 3, 15, 14, 6, 7, 8, 9, 0}, {2, 5});
  auto la = lm.forward(a), lb = lm.forward(b);
  EXPECT_EQ(la.shape(), (Shape{2, 5, 16}));
  auto va = values(la), vb = values(lb);
  // Sequence 0 differs from position 3 on: logits at positions 0..2 are unchanged.
  for (int t = 0; t < 3; ++t)
    for (int v = 0; v < 16; ++v) EXPECT_EQ(va[t * 16 + v], vb[t * 16 + v]) << t << "," << v;
  double diff = 0;
  for (int v = 0; v < 16; ++v) diff += std::abs(va[3 * 16 + v] - vb[3 * 16 + v]);
  EXPECT_GT(diff, 0);
  // Sequence 1 differs only at its last position.
  for (int t = 0; t < 4; ++t)
    for (int v = 0; v < 16; ++v) EXPECT_EQ(va[80 + t * 16 + v], vb[80 + t * 16 + v]);
}

TEST(Decoder, BackwardReachesEveryParameter) {
  nn::manual_seed(3);
  models::Decoder lm(tiny());
  auto tokens = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  auto targets = from_vector<int64_t>({2, 3, 4, 5, 6, 7, 8, 9}, {2, 4});
  auto logits = lm.forward(tokens);
  auto loss = F::cross_entropy(logits.reshape({-1, 16}), targets.reshape({-1}));
  loss.backward();
  mark_step();
  EXPECT_NEAR(loss.item<float>(), std::log(16.0), 0.2);  // small init: near uniform
  test::expect_every_gradient_finite_and_nonzero(lm.named_parameters());
}

TEST(Decoder, ValidatesConfigAndInput) {
  auto c = tiny();
  c.hidden_size = 10;
  EXPECT_NE(test::error_of([&] { models::Decoder d(c); }).find("hidden_size divisible by num_heads"),
            std::string::npos);
  c = tiny();
  c.num_kv_heads = 3;
  EXPECT_NE(test::error_of([&] { models::Decoder d(c); }).find("num_heads divisible by num_kv_heads"),
            std::string::npos);
  c = tiny();
  c.num_heads = 8;  // head_dim 1
  c.num_kv_heads = 8;
  EXPECT_NE(test::error_of([&] { models::Decoder d(c); }).find("even"), std::string::npos);
  c = tiny();
  c.vocab_size = 0;
  EXPECT_NE(test::error_of([&] { models::Decoder d(c); }).find("vocab_size"), std::string::npos);

  models::Decoder lm(tiny());
  EXPECT_NE(test::error_of([&] { lm.forward(zeros({1, 9}, DType::Int64)); }).find("max_seq_len"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { lm.forward(zeros({1, 4})); }).find("int64"), std::string::npos);
}

TEST(Decoder, SteadyTrainingStepCompilesNothing) {
  test::fresh_engine();
  // One thread, so the allocation count is deterministic: with more, which thread first runs
  // a given kernel's task (and grows its scratch to that task's size) depends on scheduling,
  // and a late first visit could fall in a measured step. loom_bench counts with every thread.
  tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
  if (runtime::kSanitizerAllocator) GTEST_SKIP() << runtime::kSanitizerAllocatorSkip;
  // The counter must be live, or the zero below would hold by counting nothing.
  ASSERT_TRUE(runtime::heap_counting_supported())
      << "this test binary does not count heap allocations (loom_heap_count not linked, or not glibc)";
  models::Decoder lm(tiny());
  auto tokens = from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  auto targets = from_vector<int64_t>({2, 3, 4, 5, 6, 7, 8, 9}, {2, 4});
  std::vector<float> losses;
  for (int step = 0; step < 5; ++step) {
    auto loss = F::cross_entropy(lm.forward(tokens).reshape({-1, 16}), targets.reshape({-1}));
    loss.backward();
    {
      NoGradGuard no_grad;
      for (auto& p : lm.parameters()) p.assign(p - p.grad() * 0.5);
    }
    lm.zero_grad();
    mark_step();
    losses.push_back(loss.item<float>());
    if (step == 2) {  // two warm-up steps after the first compile
      EXPECT_GT(metrics::counter("ExecuteHeapAlloc"), 0) << "the counter saw no warm-up allocation";
      metrics::reset();
    }
  }
  EXPECT_EQ(metrics::counter("UncachedCompile"), 0);
  EXPECT_EQ(metrics::counter("ExecuteProgram"), 2);
  EXPECT_EQ(metrics::counter("ExecuteHeapAlloc"), 0);  // heap_count.h
  EXPECT_GT(metrics::counter("DonatedBuffer"), 0);      // the parameters' (memory_plan.h)
  EXPECT_LT(losses[4], losses[0]);
}

}  // namespace
}  // namespace loom
