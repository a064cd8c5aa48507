// The CUDA device against the CPU: copies, a training loop, lazy against captured steps,
// running out of device memory, a bad index found on the device. Its own main: without a GPU
// the binary prints one line saying why and exits 77, which ctest reports as skipped.
// (ctest also runs the op harness and the PyTorch training references on the GPU through
// LOOM_TEST_DEVICE=cuda, tests/test_device.h.)
#include "runtime/cuda/cuda_backend.h"
#include "runtime/cuda/graph_replay.h"
#include "runtime/registry.h"
#include "nn/nn_test_util.h"
#include "test_util.h"

#include <loom/autocast.h>
#include <loom/autograd.h>
#include <loom/data/loader.h>
#include <loom/metrics.h>
#include <loom/compile.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>
#include <loom/optim.h>
#include <loom/profiler.h>

#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <unistd.h>

namespace loom {
namespace {

namespace F = nn::functional;
using ::testing::HasSubstr;

Device gpu() { return parse_device("cuda:0"); }

TEST(Cuda, CopiesRoundTripEveryDtype) {
  for (DType t : {DType::Float32, DType::Float64, DType::Int64, DType::Int32, DType::Bool,
                  DType::BFloat16}) {
    auto x = rand({3, 1000}, 7).to(DType::Float64) * 100;
    auto h = x.to(t).to_host();
    auto back = x.to(t).to(gpu()).to(Device{}).to_host();
    EXPECT_EQ(back.dtype, t);
    EXPECT_TRUE(back.bytes == h.bytes) << dtype_name(t);
  }
}

// A conv net's forward and backward on both devices: the values of every gradient agree to
// float32 tolerance (the GPU sums in other orders). The conv's output, 8x72x16x16, is over
// kSmallConvOutput, so that its forward runs on cuDNN, not as a GEMM (cuda_target.cpp).
TEST(Cuda, ConvNetGradientsMatchTheCpu) {
  auto run = [](Device d) {
    auto x = randn({8, 3, 16, 16}, 1).to(d).requires_grad_();
    auto w1 = (randn({72, 3, 3, 3}, 2) * 0.3).to(d).requires_grad_();
    auto w2 = (randn({10, 72 * 4 * 4}, 3) * 0.05).to(d).requires_grad_();
    auto y = from_vector<int64_t>({1, 3, 5, 7, 9, 0, 2, 4}, {8}).to(d);
    auto h = relu(conv2d(x, w1, {}, Conv2dParams{.padding = {1, 1}}));
    h = max_pool2d(h, Pool2dOptions{.kernel = {2, 2}, .stride = {2, 2}});
    h = avg_pool2d(h, Pool2dOptions{.kernel = {2, 2}, .stride = {2, 2}});
    auto logits = matmul(h.reshape({8, -1}), w2.transpose(0, 1));
    auto loss = F::cross_entropy(logits, y);
    loss.backward();
    mark_step();
    return std::vector<std::vector<double>>{test::values(loss), test::values(x.grad()),
                                            test::values(w1.grad()), test::values(w2.grad())};
  };
  const auto cpu = run(Device{}), cuda = run(gpu());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    ASSERT_EQ(cpu[k].size(), cuda[k].size());
    double scale = 0;
    for (double v : cpu[k]) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < cpu[k].size(); ++i)
      EXPECT_NEAR(cuda[k][i], cpu[k][i], 1e-5 * scale + 1e-6) << "tensor " << k << " [" << i << "]";
  }
}

// The conv gradients take cuDNN's first-ranked algorithms unless deterministic algorithms are
// on (library_ops.cpp). Turning them on after a program ran makes its library ops again (not
// only the ones of programs compiled later), and then two runs of a training step give the
// same bits.
TEST(Cuda, DeterministicAlgorithmsApplyToProgramsAlreadyRun) {
  auto step = [](uint64_t seed) {
    auto x = randn({16, 8, 12, 12}, seed).to(gpu());
    auto w1 = (randn({16, 8, 3, 3}, 2) * 0.2).to(gpu()).requires_grad_();
    auto w2 = (randn({16, 16, 3, 3}, 3) * 0.2).to(gpu()).requires_grad_();
    auto h = relu(conv2d(x, w1, {}, Conv2dParams{.padding = {1, 1}}));
    auto loss = mean(conv2d(h, w2, {}, Conv2dParams{.stride = {2, 2}, .padding = {1, 1}}) * 0.5, {});
    loss.backward();
    mark_step();
    return std::vector<std::vector<double>>{test::values(w1.grad()), test::values(w2.grad())};
  };
  const bool was = are_deterministic_algorithms_enabled();
  use_deterministic_algorithms(false);
  step(1);
  const int64_t made = metrics::counter("CudaLibraryOpMade", gpu());
  step(1);
  EXPECT_EQ(metrics::counter("CudaLibraryOpMade", gpu()), made);  // the same program, kept
  use_deterministic_algorithms(true);
  const auto first = step(1);
  const int64_t remade = metrics::counter("CudaLibraryOpMade", gpu());
  EXPECT_GE(remade - made, 3);  // the three conv gradients at least
  const auto second = step(1);
  EXPECT_EQ(metrics::counter("CudaLibraryOpMade", gpu()), remade);
  EXPECT_EQ(first, second);
  use_deterministic_algorithms(was);
}

// bfloat16 convs run channels-last on the GPU (cuda_target.cpp), their weight transformed to
// [O,kh,kw,C/g] around each call (library_ops.cpp). Under autocast, with a conv bias (fused as
// an epilogue indexed by the last dimension), a per-channel mean over the channels-last
// activations, a strided grouped conv and a matmul head, every gradient agrees with the CPU's
// to bfloat16 tolerance (each side rounds its bfloat16 results in its own order).
TEST(Cuda, BFloat16ChannelsLastConvNetGradientsMatchTheCpu) {
  auto run = [](Device d) {
    // The first conv's output, 16x16x32x32, is over kSmallConvOutput: a cuDNN conv, not a GEMM.
    auto x = randn({16, 3, 32, 32}, 11).to(d);
    auto w1 = (randn({16, 3, 3, 3}, 12) * 0.3).to(d).requires_grad_();
    auto b1 = (randn({16}, 13) * 0.5).to(d).requires_grad_();
    auto w2 = (randn({32, 8, 3, 3}, 14) * 0.2).to(d).requires_grad_();
    auto w3 = (randn({10, 32}, 15) * 0.3).to(d).requires_grad_();
    auto y = from_vector<int64_t>({1, 3, 5, 7, 9, 0, 2, 4, 6, 8, 1, 2, 3, 4, 5, 6}, {16}).to(d);
    Tensor loss;
    {
      Autocast scope(Precision::BFloat16);
      auto h = relu(conv2d(x, w1, b1, Conv2dParams{.padding = {1, 1}}));
      h = h - mean(h, {0, 2, 3}, true);
      h = relu(conv2d(h, w2, {}, Conv2dParams{.stride = {2, 2}, .padding = {1, 1}, .groups = 2}));
      auto logits = matmul(mean(h, {2, 3}), w3.transpose(0, 1));
      loss = F::cross_entropy(logits, y);
    }
    loss.backward();
    mark_step();
    return std::vector<std::vector<double>>{test::values(loss), test::values(w1.grad()),
                                            test::values(b1.grad()), test::values(w2.grad()),
                                            test::values(w3.grad())};
  };
  const auto cpu = run(Device{}), cuda = run(gpu());
  for (std::size_t k = 0; k < cpu.size(); ++k) {
    ASSERT_EQ(cpu[k].size(), cuda[k].size());
    double scale = 0;
    for (double v : cpu[k]) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0) << "tensor " << k;
    for (std::size_t i = 0; i < cpu[k].size(); ++i)
      EXPECT_NEAR(cuda[k][i], cpu[k][i], 3e-2 * scale) << "tensor " << k << " [" << i << "]";
  }
}

struct MlpRun {
  std::vector<float> losses;
  std::vector<double> weights;
};

// Twelve SGD-momentum steps of a small MLP on `d`, lazily or as a compiled (captured) step.
MlpRun train_mlp(Device d, bool compiled) {
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(6, 16));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(16, 3));
  nn::NamedTensors state;
  int64_t k = 0;
  for (const auto& [name, t] : net->state_dict()) {
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(0.3 * std::sin(0.7 * static_cast<double>(i) + static_cast<double>(++k)));
    state.emplace_back(name, from_vector(v, t.shape()));
  }
  net->to(d);
  net->load_state_dict(state);
  auto x = randn({8, 6}, 5).to(d);
  auto y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 1, 0}, {8}).to(d);
  optim::SGD opt(net->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  auto step = [&] {
    opt.zero_grad();
    auto loss = F::cross_entropy(net->forward(x), y);
    loss.backward();
    optim::optimizer_step(opt, /*barrier=*/true);
    return loss;
  };
  auto captured = compile(step);
  MlpRun r;
  for (int s = 0; s < 12; ++s) r.losses.push_back((compiled ? captured() : step()).item<float>());
  for (const auto& p : net->parameters()) {
    EXPECT_EQ(p.device(), d);
    auto v = test::values(p);
    r.weights.insert(r.weights.end(), v.begin(), v.end());
  }
  return r;
}

TEST(Cuda, TrainingMatchesTheCpu) {
  const auto cpu = train_mlp(Device{}, false), cuda = train_mlp(gpu(), false);
  for (std::size_t s = 0; s < cpu.losses.size(); ++s)
    EXPECT_NEAR(cuda.losses[s], cpu.losses[s], 1e-5 * std::abs(cpu.losses[s])) << "step " << s;
}

TEST(Cuda, CapturedStepsAreBitIdenticalToLazy) {
  const auto lazy = train_mlp(gpu(), false), captured = train_mlp(gpu(), true);
  EXPECT_EQ(lazy.losses, captured.losses);
  EXPECT_EQ(lazy.weights, captured.weights);
}

// Twelve steps fed a new batch each (an input that moves), with CUDA graphs on and off: the
// same bits, and the steady step replayed as a graph with the batch copied into it.
TEST(Cuda, GraphReplayIsBitIdenticalToKernelLaunches) {
  auto run = [](bool graphs) {
    runtime::cuda::set_graphs_enabled(graphs);
    const int64_t launches = metrics::counter("CudaGraphLaunch", gpu());
    nn::manual_seed(3);
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Linear>(6, 16));
    net->push_back(std::make_shared<nn::ReLU>());
    net->push_back(std::make_shared<nn::Linear>(16, 3));
    net->to(gpu());
    optim::SGD opt(net->parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
    auto y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 1, 0}, {8}).to(gpu());
    auto step = compile([&](const Tensor& x) {
      opt.zero_grad();
      auto loss = F::cross_entropy(net->forward(x), y);
      loss.backward();
      opt.step();
      return loss;
    });
    MlpRun r;
    for (int s = 0; s < 12; ++s) {
      auto x = randn({8, 6}, 100 + static_cast<uint64_t>(s)).to(gpu());  // a new buffer each step
      r.losses.push_back(step(x).item<float>());
    }
    for (const auto& p : net->parameters()) {
      auto v = test::values(p);
      r.weights.insert(r.weights.end(), v.begin(), v.end());
    }
    runtime::cuda::set_graphs_enabled(true);
    return std::pair{r, metrics::counter("CudaGraphLaunch", gpu()) - launches};
  };
  const auto [with_graphs, graphed] = run(true);
  const auto [without, none] = run(false);
  EXPECT_EQ(with_graphs.losses, without.losses);
  EXPECT_EQ(with_graphs.weights, without.weights);
  EXPECT_GE(graphed, 6);  // the steady step from its third run on
  EXPECT_EQ(none, 0);
  EXPECT_EQ(metrics::counter("CudaGraphGivenUp", gpu()), 0);
}

// The generator is the CPU's, step for step: uniform numbers bit for bit; normal ones through
// the device's log and cos, within an ulp or two of glibc's.
TEST(Cuda, RandomNumbersAreTheCpus) {
  for (DType t : {DType::Float32, DType::Float64}) {
    EXPECT_EQ(test::values(rand({1000}, 42, t, gpu())), test::values(rand({1000}, 42, t)));
    const auto cuda = test::values(randn({1000}, 42, t, gpu())), cpu = test::values(randn({1000}, 42, t));
    const double ulp = t == DType::Float32 ? 1.2e-7 : 2.3e-16;
    for (std::size_t i = 0; i < cpu.size(); ++i)
      EXPECT_NEAR(cuda[i], cpu[i], 4 * ulp * (std::abs(cpu[i]) + 1)) << dtype_name(t) << " [" << i << "]";
  }
}

// With the profiler on, every instruction's work is timed on the GPU with CUDA events and shows
// on the device's stream row ("cuda:0 stream"), named as the CPU's kernel spans, each with a
// positive duration, and on the host's time axis: after the first "launch" span started and
// before the last "execute" span (the completion thread waiting for the GPU) ended.
TEST(Cuda, ProfilerTimesKernelsOnTheStreamRow) {
  auto x = randn({64, 64}, 1).to(gpu());
  auto w = randn({64, 64}, 2).to(gpu());
  auto step = [&] { return (tanh(matmul(x, w)) * 2.0).sum(); };
  step().to_host();  // compiled before the trace
  profiler::clear();
  profiler::start();
  for (int i = 0; i < 3; ++i) step().to_host();
  wait_device_ops();
  profiler::stop();
  const auto path = std::filesystem::temp_directory_path() /
                    ("loom_cuda_trace_" + std::to_string(::getpid()) + ".json");
  profiler::save(path);
  std::ifstream f(path);
  std::stringstream json;
  json << f.rdbuf();
  std::filesystem::remove(path);
  const std::string text = json.str();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(text, m, std::regex("\"tid\":(\\d+),\"args\":\\{\"name\":\"cuda:0 stream\"\\}")))
      << "no row for the GPU's stream:\n" << text;
  const std::string row = m[1];
  const std::regex span("\\{\"name\":\"([^\"]+)\",\"ph\":\"X\",\"pid\":1,\"tid\":(\\d+),"
                        "\"ts\":([0-9.]+),\"dur\":([0-9.]+)\\}");
  std::vector<std::string> kernels;
  double gpu_first = 1e300, gpu_last = 0, launch_first = 1e300, execute_last = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), span), end; it != end; ++it) {
    const std::string name = (*it)[1];
    const double ts = std::stod((*it)[3]), dur = std::stod((*it)[4]);
    if ((*it)[2] == row) {
      kernels.push_back(name);
      EXPECT_GT(dur, 0) << name;
      gpu_first = std::min(gpu_first, ts);
      gpu_last = std::max(gpu_last, ts + dur);
    } else if (name == "launch") {
      launch_first = std::min(launch_first, ts);
    } else if (name == "execute") {
      execute_last = std::max(execute_last, ts + dur);
    }
  }
  EXPECT_THAT(kernels, ::testing::Contains("matmul")) << text;
  EXPECT_GE(kernels.size(), 3 * 2u) << "a matmul and at least one more kernel per step";
  // The anchoring is good to microseconds; 50 µs of slack.
  EXPECT_GE(gpu_first, launch_first - 50);
  EXPECT_LE(gpu_last, execute_last + 50);
}

TEST(Cuda, OutOfDeviceMemoryIsAnError) {
  auto& be = runtime::backend(gpu());
  const auto message = test::error_of([&] { be.alloc(std::size_t{1} << 50); });
  EXPECT_THAT(message, HasSubstr("out of device memory allocating 1125899906842624 bytes"));
  EXPECT_THAT(message, HasSubstr("pool holds"));
  // The device still works.
  EXPECT_EQ(test::values((ones({4}).to(gpu()) * 3).sum()), std::vector<double>{12});
}

TEST(Cuda, AnIndexOutOfRangeNamesTheOp) {
  auto x = rand({3, 4}, 1).to(gpu());
  auto index = from_vector<int64_t>({0, 9, 1}, {3, 1}).to(gpu());
  auto y = gather(x, 1, index);
  const auto message = test::error_of([&] { y.to_host(); });
  EXPECT_THAT(message, HasSubstr("gather"));
  EXPECT_THAT(message, HasSubstr("out of range"));
  // Later steps run.
  EXPECT_EQ(test::values((ones({2}).to(gpu()) + 1).sum()), std::vector<double>{4});
}

// alloc_host hands out page-locked blocks, kept and handed out again when given back; a copy
// from one (or from inside one) is one transfer, any other source goes through the staging
// buffer, and both give the same values.
TEST(Cuda, HostBlocksArePinnedReusedAndCopiedInOneTransfer) {
  auto& be = runtime::backend(gpu());
  void* first = nullptr;
  {
    auto block = alloc_host(1000 * sizeof(float), gpu());
    first = block.get();
    unsigned int flags = 0;
    EXPECT_EQ(cudaHostGetFlags(&flags, first), cudaSuccess) << "a page-locked block";
  }
  auto block = alloc_host(1000 * sizeof(float), gpu());
  EXPECT_EQ(block.get(), first) << "the pool hands the given-back block out again";
  auto* values = static_cast<float*>(block.get());
  for (int i = 0; i < 1000; ++i) values[i] = static_cast<float>(i) * 0.5f;
  const int64_t pinned = metrics::counter("TransferToDevicePinned", gpu());
  auto a = from_host(values, DType::Float32, {1000}, gpu());
  auto b = from_host(values + 10, DType::Float32, {990}, gpu());
  EXPECT_EQ(metrics::counter("TransferToDevicePinned", gpu()), pinned + 2);
  std::vector<float> pageable(values, values + 1000);
  auto c = from_host(pageable.data(), DType::Float32, {1000}, gpu());
  EXPECT_EQ(metrics::counter("TransferToDevicePinned", gpu()), pinned + 2);
  EXPECT_EQ(test::values(a), test::values(c));
  EXPECT_EQ(test::values(b)[0], 5.0);
  block.reset();
  be.empty_cache();  // frees the cached block
}

// A DeviceLoader on the GPU: the CPU loader's batches, every field copied from a pinned block.
TEST(Cuda, DeviceLoaderBatchesAreTheCpusFromPinnedBlocks) {
  auto dataset = std::make_shared<data::SyntheticDataset>(
      50, std::map<std::string, data::FieldSpec>{{"input", {data::HostDType::Float32, {3, 8, 8}, -1, 1}},
                                                 {"target", {data::HostDType::Int64, {}, 0, 10}}},
      5);
  auto loader = [&](Device d) {
    return data::DeviceLoader(dataset, {.batch_size = 16, .shuffle = true, .seed = 2, .threads = 2,
                                        .mark_step = false, .device = d});
  };
  auto on_cpu = loader(Device{});
  auto on_gpu = loader(gpu());
  const int64_t pinned = metrics::counter("TransferToDevicePinned", gpu());
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::map<std::string, HostTensor>> want;
    for (auto& b : on_cpu) {
      auto& w = want.emplace_back();
      for (const auto& [name, t] : b.tensors) w.emplace(name, t.to_host());
    }
    std::size_t k = 0;
    for (auto& b : on_gpu) {
      ASSERT_LT(k, want.size());
      for (const auto& [name, t] : b.tensors)
        EXPECT_TRUE(t.to_host().bytes == want[k].at(name).bytes)
            << "epoch " << epoch << " batch " << k << " " << name;
      ++k;
    }
    EXPECT_EQ(k, want.size());
  }
  EXPECT_EQ(metrics::counter("TransferToDevicePinned", gpu()) - pinned, 2 * 3 * 2);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  std::string why;
  if (loom::runtime::cuda::device_count(&why) == 0) {
    std::printf("cuda_device_test: skipped: %s\n", why.c_str());
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
