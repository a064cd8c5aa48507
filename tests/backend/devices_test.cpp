// The engine on two devices: the CPU and the test suite's guarded backend. Tensors move
// between them; each device has its own compile cache, target, metrics and queue; the
// compile cache is bounded and safe against hash collisions.
#include "backend/guarded_backend.h"
#include "runtime/registry.h"
#include "nn/nn_test_util.h"
#include "test_util.h"

#include <loom/testing.h>

#include <gmock/gmock.h>

#include <cstring>

namespace loom {
namespace {

using ::testing::HasSubstr;

std::vector<float> floats(const Tensor& t) {
  auto v = test::values(t);
  return {v.begin(), v.end()};
}

TEST(Devices, NamesParseAndPrint) {
  const Device g = test::guarded_device(1);
  EXPECT_EQ(device_str(g), "guarded:1");
  EXPECT_EQ(parse_device("guarded:1"), g);
  EXPECT_EQ(parse_device("cpu"), Device{});
  EXPECT_THAT(test::error_of([] { parse_device("tpu:0"); }), HasSubstr("unknown kind 'tpu'"));
  EXPECT_THAT(test::error_of([] { parse_device("cpu:x"); }), HasSubstr("'kind' or 'kind:index'"));
  EXPECT_THAT(test::error_of([] { zeros({2}).to(Device{DeviceType::CPU, 1}); }),
              HasSubstr("no device cpu:1 (registered: cpu:0, guarded:0-1)"));
}

TEST(Devices, TensorsMoveBetweenAnyTwoDevices) {
  test::fresh_engine();
  const Device g0 = test::guarded_device(0), g1 = test::guarded_device(1);
  auto x = from_vector<float>({1, -2, 3.5f, 4}, {2, 2});
  auto on_g0 = x.to(g0);
  EXPECT_EQ(on_g0.device(), g0);
  EXPECT_EQ(metrics::counter("TransferThroughHost"), 0);  // guarded reaches CPU memory directly
  auto on_g1 = on_g0.to(g1);
  EXPECT_EQ(on_g1.device(), g1);
  auto back = on_g1.to(Device{});  // the CPU cannot reach guarded memory: through the host
  EXPECT_EQ(metrics::counter("TransferThroughHost", Device{}), 1);
  EXPECT_EQ(floats(back), (std::vector<float>{1, -2, 3.5f, 4}));
  EXPECT_EQ(floats(on_g1), floats(x));  // reading straight off a guarded device
  // A pending value runs on its device first.
  auto y = (on_g0 * 2.0).to(Device{});
  EXPECT_EQ(floats(y), (std::vector<float>{2, -4, 7, 8}));
  EXPECT_EQ(metrics::counter("ExecuteProgram", g0), 1);
}

TEST(Devices, OpsOnOneDeviceOnly) {
  auto a = ones({2});
  auto b = ones({2}).to(test::guarded_device());
  EXPECT_THAT(test::error_of([&] { (void)(a + b); }), HasSubstr("expected operands on one device, got cpu:0 and guarded:0"));
}

TEST(Devices, OpsAgreeWithTheCpu) {
  test::fresh_engine();
  const Device g = test::guarded_device();
  auto x = uniform({4, 3, 8, 8}, -1, 1, 7);
  auto w = uniform({5, 3, 3, 3}, -1, 1, 8);
  auto m = uniform({6, 7}, -1, 1, 9), n = uniform({7, 5}, -1, 1, 10), bias = uniform({5}, -1, 1, 11);
  auto compute = [&](const Tensor& x, const Tensor& w, const Tensor& m, const Tensor& n, const Tensor& bias) {
    auto c = relu(conv2d(x, w, {}, Conv2dParams{.padding = {1, 1}})).sum({2, 3});
    auto d = relu(matmul(m, n) + bias);             // an epilogue on the CPU, not on guarded
    auto e = matmul(n.transpose(0, 1), m.transpose(0, 1));  // a folded transpose on the CPU
    return std::vector<Tensor>{c, d, e, sigmoid(d).mean(), c.max({1})};
  };
  auto cpu = compute(x, w, m, n, bias);
  auto gd = compute(x.to(g), w.to(g), m.to(g), n.to(g), bias.to(g));
  mark_step();
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(gd[i].device(), g);
    auto a = test::values(cpu[i]), b = test::values(gd[i]);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(b[k], a[k], 1e-5 * (1 + std::abs(a[k]))) << i << "," << k;
  }
}

TEST(Devices, OneGraphCompilesDifferentlyPerDevice) {
  const Device g = test::guarded_device();
  auto m = ones({4, 4}), b = ones({4});
  auto graph = test::graph_of(relu(matmul(m, m) + b));
  auto on_cpu = ir::to_text(compiler::compile(graph, runtime::backend(Device{}).target()));
  auto on_guarded = ir::to_text(compiler::compile(graph, runtime::backend(g).target()));
  EXPECT_THAT(on_cpu, HasSubstr("epilogue"));
  EXPECT_THAT(on_guarded, ::testing::Not(HasSubstr("epilogue")));
  ir::Target nothing;
  nothing.name = "bare";
  EXPECT_THAT(test::error_of([&] { compiler::compile(graph, nothing); }),
              HasSubstr("the bare device does not run constant producing float32"));
}

TEST(Devices, SeparateCompileCachesAndMetrics) {
  test::fresh_engine();
  const Device g = test::guarded_device();
  auto step = [](Device d) {
    auto t = ones({3}, DType::Float32, d) * 3.0 + 1.0;
    mark_step();
    return test::values(t);
  };
  step(Device{});
  step(g);
  EXPECT_EQ(metrics::counter("UncachedCompile", Device{}), 1);
  EXPECT_EQ(metrics::counter("UncachedCompile", g), 1);
  EXPECT_EQ(lazy::cached_programs(Device{}), 1u);
  EXPECT_EQ(lazy::cached_programs(g), 1u);
  EXPECT_EQ(step(g), (std::vector<double>{4, 4, 4}));
  EXPECT_EQ(metrics::counter("CachedCompile", g), 1);
  EXPECT_EQ(metrics::counter("CachedCompile", Device{}), 0);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 2);  // the total over devices
  EXPECT_THAT(metrics::report(), HasSubstr("guarded:0 1"));
}

TEST(Devices, MarkStepRunsOneProgramPerDevice) {
  test::fresh_engine();
  const Device g = test::guarded_device();
  auto a = ones({2}) + 1.0;
  auto b = ones({2}, DType::Float32, g) + 2.0;
  {
    testing::DeviceQueueHold hold(g);  // holds the guarded device only
    mark_step();
    EXPECT_FALSE(a.is_pending());
    EXPECT_FALSE(b.is_pending());
    wait_device_ops(Device{});
    EXPECT_EQ(testing::pending_device_programs(Device{}), 0);
    EXPECT_EQ(testing::pending_device_programs(g), 1);
  }
  wait_device_ops();
  EXPECT_EQ(testing::pending_device_programs(g), 0);
  EXPECT_EQ(test::values(b), (std::vector<double>{3, 3}));
  EXPECT_EQ(metrics::counter("ExecuteProgram", g), 1);
  // The CPU ran its own program and, through the contract, the guarded device's.
  EXPECT_EQ(metrics::counter("ExecuteProgram", Device{}), 2);
}

TEST(Devices, StepClosuresRunAfterEveryDevicesStep) {
  test::fresh_engine();
  const Device g = test::guarded_device();
  auto a = ones({2}) * 5.0;
  auto b = ones({2}, DType::Float32, g) * 7.0;
  std::vector<double> seen;
  add_step_closure([&] {
    seen = test::values(a);
    auto vb = test::values(b);
    seen.insert(seen.end(), vb.begin(), vb.end());
  });
  mark_step();
  wait_device_ops();
  EXPECT_EQ(seen, (std::vector<double>{5, 5, 7, 7}));
}

TEST(CompileCache, LeastRecentlyUsedOutPastItsBound) {
  test::fresh_engine();
  const int saved = compile_cache_size();
  set_compile_cache_size(2);
  auto run = [](double k) {  // a graph per distinct op count
    auto t = ones({2});
    for (int i = 0; i < static_cast<int>(k); ++i) t = t + 1.0;
    mark_step();
    return test::values(t)[0];
  };
  EXPECT_EQ(run(1), 2);
  EXPECT_EQ(run(2), 3);
  EXPECT_EQ(run(1), 2);  // hit: 1 is now the most recent
  EXPECT_EQ(run(3), 4);  // evicts 2
  EXPECT_EQ(metrics::counter("CompileCacheEvict"), 1);
  EXPECT_EQ(lazy::cached_programs(Device{}), 2u);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 3);
  EXPECT_EQ(run(1), 2);  // still cached
  EXPECT_EQ(metrics::counter("UncachedCompile"), 3);
  EXPECT_EQ(run(2), 3);  // compiled again
  EXPECT_EQ(metrics::counter("UncachedCompile"), 4);
  set_compile_cache_size(saved);
  EXPECT_THAT(test::error_of([] { set_compile_cache_size(0); }), HasSubstr("expected 1 to 1000000"));
}

TEST(CompileCache, AHashCollisionNeverRunsAnotherGraphsProgram) {
  test::fresh_engine();
  auto x = ones({3});
  auto sum = x + 2.0;
  auto product = x * 2.0;
  auto g1 = test::graph_of(sum), g2 = test::graph_of(product);
  ASSERT_NE(g1.hash, g2.hash);
  g2.hash = g1.hash;  // as if the two hashed alike
  auto p1 = lazy::lookup_or_compile(g1, Device{}, lazy::RunKind::Step, "test");
  auto p2 = lazy::lookup_or_compile(g2, Device{}, lazy::RunKind::Step, "test");
  EXPECT_NE(p1, p2);
  EXPECT_EQ(metrics::counter("CompileCacheCollision"), 1);
  EXPECT_EQ(metrics::counter("UncachedCompile"), 2);
  EXPECT_EQ(lazy::lookup_or_compile(g2, Device{}, lazy::RunKind::Step, "test"), p2);  // now cached
  EXPECT_EQ(metrics::counter("CachedCompile"), 1);
}

TEST(GuardedMemory, PoisonedWhenHandedOutAndGuardsCatchOverruns) {
  auto& be = runtime::backend(test::guarded_device());
  auto s = be.alloc(16);
  auto* bytes = static_cast<unsigned char*>(s->data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(bytes[i], 0xFF) << i;
  const int64_t before = test::guard_violations();
  bytes[16] = 0;  // one byte past the end
  s.reset();
  EXPECT_EQ(test::guard_violations(), before + 1);
  // A write after free is found when the block leaves the quarantine.
  auto t = be.alloc(8);
  auto* stale = static_cast<unsigned char*>(t->data());
  t.reset();
  stale[0] = 1;
  be.empty_cache();
  EXPECT_EQ(test::guard_violations(), before + 2);
}

TEST(GuardedMemory, CopiesThatDoNotFitAreRefused) {
  auto& be = runtime::backend(test::guarded_device());
  auto s = be.alloc(8);
  std::vector<char> host(16);
  EXPECT_THAT(test::error_of([&] { be.copy_in(host.data(), *s, 16); }), HasSubstr("copy_in of 16 bytes into a block of 8"));
}

}  // namespace
}  // namespace loom
