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

// arange as PyTorch 1.13 computes it (torch.arange with these arguments): an integer range
// truncates its bounds and step first and counts in int64 (through doubles it repeated values
// and miscounted), and a float range is computed in float64 and rounded once.
TEST(Tensor, ArangeTruncatesIntegerBoundsAndRoundsFloatsOnce) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(arange(-2.5, 2, 1).to_vector<int64_t>(), (V{-2, -1, 0, 1}));
  EXPECT_EQ(arange(0, 5, 1.5).to_vector<int64_t>(), (V{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(5, -3, -2).to_vector<int64_t>(), (V{5, 3, 1, -1}));
  EXPECT_EQ(arange(0, 10, 3).to_vector<int64_t>(), (V{0, 3, 6, 9}));
  const int64_t two53 = int64_t{1} << 53;
  EXPECT_EQ(arange(0x1p53, 0x1p53 + 4, 1).to_vector<int64_t>(), (V{two53, two53 + 1, two53 + 2, two53 + 3}));
  EXPECT_EQ(arange(1, 4, 1, DType::Int32).to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_NE(test::error_of([] { arange(-1, 1, 0.5); }).find("arange: expected a step that is not 0 as an integer"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { arange(0, 3, 1, DType::Bool); }).find("expected a numeric dtype"), std::string::npos);
  EXPECT_EQ(arange(0, 1, 0.1, DType::Float32).to_vector<float>()[9], 0.8999999761581421f);
}

// An int32 or bool sum is int64, as in PyTorch: 100 x 10^8 in int32 wrapped to 1410065408, and
// a bool sum (a count) was refused.
TEST(Tensor, IntegerAndBoolSumsAreInt64) {
  const auto big = full({100}, 1e8, DType::Int32);
  EXPECT_EQ(big.sum().dtype(), DType::Int64);
  EXPECT_EQ(big.sum().item<int64_t>(), 10000000000);
  const auto flags = from_vector<bool>({true, false, true, true}, {2, 2});
  EXPECT_EQ(flags.sum().item<int64_t>(), 3);
  EXPECT_EQ(sum(flags, {1}).to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(ones({3}, DType::Int64).sum().dtype(), DType::Int64);
  EXPECT_EQ(ones({3}).sum().dtype(), DType::Float32);
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
