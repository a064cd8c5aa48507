// Tensor creation, reads, printing and metrics plumbing.
#include "test_util.h"

#include <sstream>

namespace loom {
namespace {

using test::fresh_engine;

TEST(Tensor, Creation) {
  EXPECT_EQ(zeros({2, 2}).to_vector<float>(), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(ones({3}, DType::Int32).to_vector<int32_t>(), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(full({2}, 2.5, DType::Float64).to_vector<double>(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(arange(4).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(arange(1, 2, 0.25, DType::Float32).to_vector<float>(),
            (std::vector<float>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(iota({2, 3}, 1).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(iota({2, 3}, 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(from_vector<bool>({true, false}, {2}).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_DOUBLE_EQ(scalar_tensor(3.25, DType::Float64).item<double>(), 3.25);
  EXPECT_EQ(zeros({2, 3}).shape(), (Shape{2, 3}));
  EXPECT_EQ(zeros({2, 3}).size(-1), 3);
  EXPECT_EQ(zeros({2, 3}, DType::Int64).dtype(), DType::Int64);
}

TEST(Tensor, RandomIsCounterBasedAndSeedIsDeviceData) {
  fresh_engine();
  auto a = rand({1000}, 42).to_vector<float>();
  auto b = rand({1000}, 42).to_vector<float>();
  auto c = rand({1000}, 43).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Three reads of one graph shape over different seeds: compiled once.
  EXPECT_EQ(metrics::counter("UncachedCompile"), 1);
  EXPECT_EQ(metrics::counter("CachedCompile"), 2);
  // The first elements do not depend on how many are drawn.
  auto d = rand({10}, 42).to_vector<float>();
  EXPECT_EQ(std::vector<float>(a.begin(), a.begin() + 10), d);
}

TEST(Tensor, Printing) {
  std::ostringstream os;
  os << from_vector<float>({1, 2.5f, -3, 4}, {2, 2});
  EXPECT_EQ(os.str(), "tensor([[1.0000, 2.5000],\n        [-3.0000, 4.0000]], dtype=float32)");
  os.str("");
  os << from_vector<int64_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {10});
  EXPECT_EQ(os.str(), "tensor([1, 2, 3, ..., 8, 9, 10], dtype=int64)");
  os.str("");
  os << scalar_tensor(2, DType::Int32);
  EXPECT_EQ(os.str(), "tensor(2, dtype=int32)");
}

TEST(Tensor, PrintingIsATransfer) {
  fresh_engine();
  std::ostringstream os;
  os << exp(zeros({2}));
  EXPECT_EQ(metrics::counter("TransferFromDevice"), 1);
}

TEST(Metrics, ReportCountersStatsAndReset) {
  fresh_engine();
  auto x = from_vector<float>({1, 2}, {2});
  (x * x).to_vector<float>();
  auto report = metrics::report();
  for (const char* name : {"TransferToDevice", "TransferFromDevice", "UncachedCompile",
                           "CompileTime", "ExecuteTime", "GraphSize", "TransferFromDeviceTime"})
    EXPECT_NE(report.find(name), std::string::npos) << name << " missing from\n" << report;
  EXPECT_EQ(metrics::stat("CompileTime").count, 1);
  EXPECT_GT(metrics::stat("ExecuteTime").total, 0);
  metrics::reset();
  EXPECT_EQ(metrics::counter("TransferToDevice"), 0);
  EXPECT_EQ(metrics::stat("CompileTime").count, 0);
  // A long name keeps its line whole (a fixed buffer cut it, and the next line joined it).
  const std::string long_name(300, 'x');
  metrics::record(long_name + "Time", 2e6);
  metrics::increment(long_name);
  report = metrics::report();
  EXPECT_NE(report.find(long_name + " 1\n"), std::string::npos) << report;
  EXPECT_NE(report.find(long_name + "Time count=1 total=2.000ms mean=2.000ms min=2.000ms max=2.000ms\n"),
            std::string::npos)
      << report;
  metrics::reset();
}

TEST(Allocator, ASteadyStepAllocatesNothingFromTheSystem) {
  fresh_engine();
  auto w = from_vector<float>(std::vector<float>(4096, 1.0f), {64, 64});
  for (int i = 0; i < 3; ++i) {
    w = tanh(matmul(w, w) * 0.01);
    mark_step();
    wait_device_ops();  // one step in flight at a time, so the blocks needed are fixed
  }
  wait_device_ops();
  auto before = metrics::counter("AllocatorSystemAlloc");
  for (int i = 0; i < 5; ++i) {
    w = tanh(matmul(w, w) * 0.01);
    mark_step();
    wait_device_ops();  // one step in flight at a time, so the blocks needed are fixed
  }
  wait_device_ops();
  EXPECT_EQ(metrics::counter("AllocatorSystemAlloc"), before);
  EXPECT_GT(metrics::counter("AllocatorCacheHit"), 0);
}

}  // namespace
}  // namespace loom
