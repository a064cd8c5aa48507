// Without a GPU: every kernel of a ResNet-20 and a decoder training step, in float32 and in
// bfloat16 autocast, is generated as CUDA C and compiled by NVRTC for the H100 (sm_90). The
// step is traced on the CPU and its graph compiled for the CUDA target, exactly as the CUDA
// backend compiles it at mark_step.
#include "compiler/pipeline.h"
#include "ir/graph.h"
#include "lazy/tensor_impl.h"
#include "runtime/cuda/codegen.h"
#include "runtime/cuda/cuda_target.h"
#include "runtime/cuda/nvrtc.h"
#include "test_util.h"

#include <loom/autocast.h>
#include <loom/autograd.h>
#include <loom/models/decoder.h>
#include <loom/models/resnet.h>
#include <loom/nn/functional.h>
#include <loom/optim.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>  // std::multiset
#include <vector>

namespace loom {
namespace {

namespace F = nn::functional;
namespace cuda = runtime::cuda;

// NVRTC's disk cache in the build tree (unless the caller set one), before any test compiles.
const bool kernel_cache_set = [] { return ::setenv("LOOM_CUDA_CACHE_DIR", LOOM_TEST_KERNEL_CACHE, 0) == 0; }();

// The graph mark_step would run now on the CPU: every live pending tensor.
ir::Graph pending_step_graph() {
  std::vector<ir::NodePtr> roots;
  for (auto& [device, live] : lazy::live_pending_by_device())
    for (auto& t : live) roots.push_back(t->pending());
  return ir::build_graph(roots);
}

struct Compiled {
  int instructions = 0, kernels = 0, library_calls = 0;
  int convs = 0, channels_last_convs = 0;  // Conv2d and its gradients
  std::multiset<ir::Op> ops;  // one per instruction
};

// Generates and compiles the program of the pending step; fails the test on any error.
Compiled compile_pending_step() {
  const auto program = compiler::compile(pending_step_graph(), cuda::cuda_target());
  const auto code = cuda::generate_program(program);
  EXPECT_NO_THROW(cuda::nvrtc::compile(code.source, 90));
  Compiled c;
  c.instructions = static_cast<int>(program.instrs.size());
  c.kernels = code.kernels();
  for (std::size_t i = 0; i < program.instrs.size(); ++i) {
    const ir::Instr& in = program.instrs[i];
    c.ops.insert(in.op);
    if (in.op == ir::Op::Conv2d || in.op == ir::Op::Conv2dGradInput ||
        in.op == ir::Op::Conv2dGradWeight) {
      ++c.convs;
      const auto& conv = in.op == ir::Op::Conv2d ? in.attr.get<ir::Conv2dAttr>()
                                                 : in.attr.get<ir::Conv2dGradAttr>().conv;
      c.channels_last_convs += conv.channels_last;
    }
    c.library_calls += code.instrs[i].runs == cuda::Runs::Library;
    for (const auto& l : code.instrs[i].launches) {
      EXPECT_NE(code.source.find(" " + l.entry + "("), std::string::npos) << l.entry;
      EXPECT_GE(l.blocks, 1) << l.entry;
      EXPECT_GE(l.threads, 32) << l.entry;
      EXPECT_LE(l.threads, 1024) << l.entry;
    }
    if (code.instrs[i].runs == cuda::Runs::Kernels) {
      EXPECT_FALSE(code.instrs[i].launches.empty()) << i;
    }
  }
  mark_step();  // runs the step on the CPU, leaving nothing pending for the next test,
  wait_device_ops();  // and nothing running when the test binary exits
  return c;
}

class ProgramKernels : public ::testing::TestWithParam<Precision> {};

TEST_P(ProgramKernels, ResNet20TrainingStep) {
  test::fresh_engine();
  auto net = models::resnet("resnet20", 3, 10);
  optim::SGD opt(net->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
  // Batch 64: every conv's output is over kSmallConvOutput, so none runs as a GEMM
  // (cuda_target.cpp; ResNet18Batch1Evaluation below checks that rule).
  auto x = randn({64, 3, 32, 32}, 3);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 64; ++i) labels.push_back((7 * i + 1) % 10);
  auto y = from_vector(labels, {64});
  mark_step();
  {
    Autocast scope(GetParam());
    auto loss = F::cross_entropy(net->forward(x), y);
    loss.backward();
  }
  opt.step();
  const auto c = compile_pending_step();
  EXPECT_GT(c.library_calls, 40);  // 19 convs, their two gradients, the head's matmuls
  EXPECT_TRUE(c.ops.count(ir::Op::Conv2dGradWeight));
  EXPECT_GT(c.kernels, 50);
  // The CUDA target's default layout: bfloat16 convs channels-last (cuDNN's tensor-core
  // kernels read [N,H,W,C]), float32 ones [N,C,H,W]. 21 convs (19 3x3, two 1x1 projections)
  // and their gradients, but the stem's input gradient, which nothing needs.
  EXPECT_EQ(c.convs, 21 * 3 - 1);
  EXPECT_EQ(c.channels_last_convs, GetParam() == Precision::BFloat16 ? c.convs : 0);
}

TEST_P(ProgramKernels, DecoderTrainingStep) {
  test::fresh_engine();
  models::DecoderConfig cfg{.vocab_size = 256, .hidden_size = 64, .num_layers = 2, .num_heads = 4,
                            .num_kv_heads = 2, .intermediate_size = 128, .max_seq_len = 32};
  auto lm = std::make_shared<models::Decoder>(cfg);
  optim::AdamW opt(lm->parameters(), optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.1});
  std::vector<int64_t> a, b;
  for (int t = 0; t < 64; ++t) {
    a.push_back((13 * t + 5) % 256);
    b.push_back((13 * (t + 1) + 5) % 256);
  }
  auto inp = from_vector(a, {2, 32});
  auto tgt = from_vector(b, {2, 32});
  mark_step();
  {
    Autocast scope(GetParam());
    auto logits = lm->forward(inp).reshape({-1, 256});
    auto loss = F::cross_entropy(logits, tgt.reshape({-1}));
    loss.backward();
  }
  opt.step();
  const auto c = compile_pending_step();
  EXPECT_TRUE(c.ops.count(ir::Op::Matmul));
  EXPECT_TRUE(c.ops.count(ir::Op::ScatterAdd) || c.ops.count(ir::Op::Gather));
  EXPECT_GT(c.kernels, 50);
}

// ResNet-18 in the CIFAR layout evaluating one image (loom_bench's infer row): every conv
// (the largest output, 64 channels of 32x32, is within kSmallConvOutput) runs as Im2col and a
// Matmul (compiler/conv_im2col.h).
TEST_P(ProgramKernels, ResNet18Batch1Evaluation) {
  if (std::getenv("LOOM_CONV_IM2COL")) GTEST_SKIP() << "LOOM_CONV_IM2COL overrides the rule";
  test::fresh_engine();
  auto net = std::make_shared<models::ResNet>(models::ResNetConfig{
      models::BlockKind::Basic, {2, 2, 2, 2}, {64, 128, 256, 512}, models::Stem::Cifar, 3, 10});
  net->eval();
  auto image = randn({1, 3, 32, 32}, 31);
  mark_step();
  Tensor logits;
  {
    NoGradGuard no_grad;
    Autocast scope(GetParam());
    logits = net->forward(image);
  }
  const auto c = compile_pending_step();
  EXPECT_EQ(c.convs, 0);
  EXPECT_EQ(c.ops.count(ir::Op::Im2col), 20u);  // 17 3x3 convs (the stem's too), 3 projections
  EXPECT_GE(c.library_calls, 21);  // the 20 matmuls and the classifier
}

INSTANTIATE_TEST_SUITE_P(Precisions, ProgramKernels,
                         ::testing::Values(Precision::Float32, Precision::BFloat16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

// A kernel NVRTC cannot compile is a loom::Error carrying NVRTC's log and the source lines.
TEST(Nvrtc, CompileErrorNamesTheLine) {
  const std::string source = cuda::prelude() +
                             "extern \"C\" __global__ void broken(void* out) {\n"
                             "  float* o = (float*)out;\n"
                             "  o[0] = undefined_name;\n"
                             "}\n";
  const auto message = test::error_of([&] { cuda::nvrtc::compile(source, 90); });
  EXPECT_NE(message.find("undefined_name"), std::string::npos) << message;
  EXPECT_NE(message.find("NVRTC could not compile"), std::string::npos) << message;
}

// A second compile of one source is served from a cache, not NVRTC.
TEST(Nvrtc, CachedCompile) {
  const std::string source = cuda::prelude() +
                             "extern \"C\" __global__ void twice(void* out) { ((float*)out)[0] = 1.f; }\n";
  cuda::nvrtc::compile(source, 90);
  const auto before = cuda::nvrtc::cache_stats();
  cuda::nvrtc::compile(source, 90);
  const auto after = cuda::nvrtc::cache_stats();
  EXPECT_EQ(after.compiled, before.compiled);
  EXPECT_EQ(after.from_memory, before.from_memory + 1);
}

}  // namespace
}  // namespace loom
