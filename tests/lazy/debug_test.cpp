// Recompile causes, per-step transfer warnings, graph dumps, the graph-size cap and the
// profiler's Chrome trace.
#include "json_check.h"
#include "profiler/track.h"
#include "runtime/registry.h"
#include "test_util.h"

#include <loom/autocast.h>
#include <loom/debug.h>
#include <loom/profiler.h>

#include <gmock/gmock.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <thread>

namespace loom {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

void fresh() {
  test::fresh_engine();
  debug::reset();
}

TEST(RecompileCause, NamesTheInputAndBothShapes) {
  fresh();
  auto w = from_vector<float>(std::vector<float>(28 * 28, 0.01f), {784, 1});
  for (int64_t batch : {128, 128, 96}) {
    auto x = rand({batch, 1, 28, 28}, 7);
    auto y = matmul(reshape(x, {batch, 784}), w);
    mark_step();
  }
  auto causes = debug::recompile_causes();
  // rand's seed is an input, the batch shape changes the random op: the first difference is
  // reported in terms of the node whose shape changed.
  ASSERT_EQ(causes.size(), 2u);
  EXPECT_EQ(causes[0].cause, "first compile at this call site");
  EXPECT_THAT(causes[1].cause, HasSubstr("[128,1,28,28]"));
  EXPECT_THAT(causes[1].cause, HasSubstr("[96,1,28,28]"));
  EXPECT_THAT(causes[1].site, HasSubstr("debug_test.cpp:"));
}

TEST(RecompileCause, AnInputShapeChangeNamesTheInput) {
  fresh();
  for (int64_t batch : {128, 96}) {
    auto x = from_vector(std::vector<float>(batch * 784, 1.0f), {batch, 1, 28, 28});
    auto y = sum(x * x, {1, 2, 3});
    mark_step();
  }
  auto causes = debug::recompile_causes();
  ASSERT_EQ(causes.size(), 2u);
  EXPECT_EQ(causes[1].cause, "input 0 changed from float32[128,1,28,28] to float32[96,1,28,28]");
}

TEST(RecompileCause, AScalarThatBecomesAConstant) {
  fresh();
  auto x = from_vector<float>({1, 2, 3}, {3});
  for (double s : {0.5, 1.0}) {
    auto y = x * s;
    mark_step();
  }
  auto causes = debug::recompile_causes();
  ASSERT_EQ(causes.size(), 2u);
  EXPECT_THAT(causes[1].cause, HasSubstr("a scalar became a constant"));
}

TEST(StepAnalysis, AnItemEveryStepIsReportedWithItsCallSite) {
  fresh();
  auto w = from_vector<float>({1, 2, 3}, {3});
  int item_line = 0;
  for (int step = 0; step < 14; ++step) {  // 3 of warm-up, then a window of 10 and one more
    w = w * 0.5 + 1.0;
    mark_step();
    item_line = __LINE__ + 1;
    float v = sum(w).item<float>();  // a logging line that syncs every step
    EXPECT_GT(v, 0);
  }
  auto warnings = debug::warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("TransferFromDevice"));
  EXPECT_THAT(warnings[0], HasSubstr("debug_test.cpp:" + std::to_string(item_line)));
}

// A loop that must read every step (sampling) says so, and is not warned about.
TEST(StepAnalysis, ExpectedReadsAreNotWarnedAbout) {
  fresh();
  auto w = from_vector<float>({1, 2, 3}, {3});
  debug::ExpectedReads sampling;
  for (int step = 0; step < 14; ++step) {
    w = w * 0.5 + 1.0;
    mark_step();
    EXPECT_GT(sum(w).item<float>(), 0);
  }
  EXPECT_TRUE(debug::warnings().empty());
}

// The first 3 steps are warm-up: the window of 10 steps the analysis looks at starts after
// them, so what compiles there is not held against the steps that follow.
TEST(StepAnalysis, CompilesDuringTheWarmUpDoNotCount) {
  // Step k (from 1) computes a sum over `size(k)` elements: a new size compiles a new graph.
  auto run = [](const std::function<int64_t(int)>& size) {
    fresh();
    for (int k = 1; k <= 14; ++k) {
      auto y = sum(ones({size(k)}) * 2.0);
      mark_step();
    }
    return debug::warnings();
  };
  // Six compiles, steps 1 to 6: three in the warm-up, three of the ten steps after it.
  for (const auto& w : run([](int k) { return k <= 6 ? k : 6; }))
    EXPECT_THAT(w, Not(HasSubstr("graphs were compiled"))) << w;
  // One compile in the warm-up, then six in steps 4 to 9: six of the ten.
  const auto said = run([](int k) { return k >= 4 && k <= 9 ? 100 + k : 1; });
  ASSERT_EQ(said.size(), 1u);
  EXPECT_THAT(said[0], HasSubstr("graphs were compiled in 6 of the last 10 steps"));
}

TEST(StepAnalysis, AStepClosureDoesNotWarn) {
  fresh();
  auto w = from_vector<float>({1, 2, 3}, {3});
  float seen = 0;
  for (int step = 0; step < 12; ++step) {
    w = w * 0.5 + 1.0;
    auto total = sum(w);
    add_step_closure([total, &seen] { seen = total.item<float>(); });
    mark_step();
  }
  wait_device_ops();
  EXPECT_GT(seen, 0);
  EXPECT_TRUE(debug::warnings().empty()) << debug::warnings()[0];
}

// bfloat16 matmuls on a device that runs them in float32 on widened copies (a CPU without
// AVX512_BF16) are said once, whatever the number of programs; where the device has bfloat16
// kernels nothing is said.
TEST(StepAnalysis, BFloat16WidenedToFloat32IsSaidOnce) {
  fresh();
  const bool widened = !runtime::backend(Device{}).target().runs(ir::Op::Matmul, DType::BFloat16);
  for (int64_t n : {4, 8, 4}) {  // two programs, one of them twice
    Autocast scope(Precision::BFloat16);
    auto y = matmul(rand({n, 16}, 1), rand({16, 4}, 2));
    mark_step();
  }
  int said = 0;
  for (const auto& w : debug::warnings())
    if (w.find("bfloat16 matmul or convolution") != std::string::npos) {
      ++said;
      EXPECT_THAT(w, HasSubstr("cpu:0"));
      EXPECT_THAT(w, HasSubstr("saves memory there, not time"));
    }
  EXPECT_EQ(said, widened ? 1 : 0);
}

// A cut is not the user's barrier: a step closure's error waits for theirs (the op that cut
// threw it, and was lost), and eager ops, which grow no graph, never cut.
TEST(GraphCap, ACutRethrowsNoClosureErrorAndEagerOpsDoNotCut) {
  fresh();
  std::atomic<bool> after{false};
  add_step_closure([] { throw Error("the closure failed"); });
  add_step_closure([&] { after = true; });  // runs once the first one's error is kept
  mark_step();
  while (!after) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  setenv("LOOM_MAX_GRAPH_NODES", "50", 1);
  auto z = from_vector<double>({0, 0}, {2});
  auto x = from_vector<double>({1, 2}, {2});
  EXPECT_NO_THROW(for (int i = 0; i < 500; ++i) z = z + x);
  EXPECT_GE(metrics::counter("GraphCut"), 9);
  EXPECT_THAT(test::error_of([] { mark_step(); }), HasSubstr("the closure failed"));
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{500, 1000}));
  const auto cuts = metrics::counter("GraphCut");
  {
    EagerModeGuard eager(true);
    for (int i = 0; i < 200; ++i) z = z + x;
  }
  unsetenv("LOOM_MAX_GRAPH_NODES");
  EXPECT_EQ(metrics::counter("GraphCut"), cuts);
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{700, 1400}));
}

TEST(GraphCap, ALoopWithoutABarrierIsCutAndStaysCorrect) {
  fresh();
  setenv("LOOM_MAX_GRAPH_NODES", "100", 1);
  auto z = from_vector<double>({0, 0}, {2});
  auto x = from_vector<double>({1, 2}, {2});
  for (int i = 0; i < 1000; ++i) z = z + x;  // no barrier
  unsetenv("LOOM_MAX_GRAPH_NODES");
  EXPECT_GE(metrics::counter("GraphCut"), 9);
  EXPECT_LE(metrics::stat("GraphSize").max, 110);
  EXPECT_EQ(z.to_vector<double>(), (std::vector<double>{1000, 2000}));
}

TEST(GraphDumps, EachCompiledGraphIsWrittenBeforeAndAfterThePasses) {
  fresh();
  auto dir = std::filesystem::temp_directory_path() / ("loom_dumps_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  setenv("LOOM_DUMP_GRAPHS", dir.c_str(), 1);
  auto x = from_vector<float>({1, 2}, {2});
  (exp(x) + x).to_vector<float>();
  unsetenv("LOOM_DUMP_GRAPHS");
  std::vector<std::string> names;
  for (auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 3u);
  EXPECT_THAT(names[0], ::testing::EndsWith(".after.txt"));
  EXPECT_THAT(names[1], ::testing::EndsWith(".before.dot"));
  EXPECT_THAT(names[2], ::testing::EndsWith(".before.txt"));
  std::ifstream f(dir / names[2]);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr("exp float32[2]"));
  std::filesystem::remove_all(dir);
}

// The recorded spans, saved as a Chrome trace to a temporary file and read back.
std::string saved_trace(const std::string& prefix) {
  auto path = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()) + ".json");
  profiler::save(path);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  std::filesystem::remove(path);
  return text.str();
}

TEST(Profiler, ChromeTraceWithHostAndDeviceSpans) {
  fresh();
  profiler::clear();
  profiler::start();
  auto w = from_vector<float>({1, 2, 3}, {3});
  for (int i = 0; i < 3; ++i) {
    profiler::Trace span("user_step");
    w = tanh(w) * 2.0;
    mark_step();
  }
  w.to_vector<float>();
  wait_device_ops();
  profiler::stop();
  std::stringstream json;
  json << saved_trace("loom_trace_");
  EXPECT_TRUE(test::JsonChecker(json.str()).valid()) << json.str();
  for (const char* needle : {"\"traceEvents\"", "\"name\":\"host\"", "\"name\":\"device\"",
                             "\"name\":\"user_step\"", "\"name\":\"execute\"", "\"name\":\"compile\"",
                             "\"name\":\"trace\"", "\"name\":\"transfer_from_device\"", "\"ph\":\"X\""})
    EXPECT_THAT(json.str(), HasSubstr(needle));
  EXPECT_FALSE(test::JsonChecker(std::string("{\"a\":[1,2,}")).valid());  // the checker can fail
}

// Spans whose times the caller measured (profiler/track.h: the CUDA backend's kernel spans,
// timed with CUDA events) show on their named track's own row, at the times given, on the same
// time axis as the host threads' spans; they are kept if the profiler stopped meanwhile.
TEST(Profiler, SpansOnANamedTrackKeepTheirTimes) {
  profiler::clear();
  profiler::start();
  const int64_t t0 = profiler::now_ns();
  const int row = profiler::track("test:0 stream");
  EXPECT_EQ(profiler::track("test:0 stream"), row);
  EXPECT_NE(profiler::track("test:1 stream"), row);
  profiler::add_span(row, "first_kernel", t0, t0 + 1000);  // the earliest span: the trace's origin
  const int64_t before = profiler::now_ns();
  { profiler::Trace span("host_span"); }
  const int64_t after = profiler::now_ns();
  profiler::stop();
  profiler::add_span(row, "later_kernel", t0 + 5'000'000, t0 + 5'250'500);  // 5 ms on, 250.5 µs
  std::stringstream json;
  json << saved_trace("loom_track_");
  EXPECT_TRUE(test::JsonChecker(json.str()).valid()) << json.str();
  const std::string tid = "\"tid\":" + std::to_string(row);
  EXPECT_THAT(json.str(), HasSubstr("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1," + tid +
                                    ",\"args\":{\"name\":\"test:0 stream\"}}"));
  EXPECT_THAT(json.str(), HasSubstr("{\"name\":\"first_kernel\",\"ph\":\"X\",\"pid\":1," + tid +
                                    ",\"ts\":0.000,\"dur\":1.000}"));
  EXPECT_THAT(json.str(), HasSubstr("{\"name\":\"later_kernel\",\"ph\":\"X\",\"pid\":1," + tid +
                                    ",\"ts\":5000.000,\"dur\":250.500}"));
  // The host thread's span, on another row, between the clock reads around it.
  std::smatch m;
  const std::string text = json.str();
  ASSERT_TRUE(std::regex_search(text, m, std::regex("\"name\":\"host_span\",\"ph\":\"X\",\"pid\":1,"
                                                    "\"tid\":(\\d+),\"ts\":([0-9.]+)")))
      << text;
  EXPECT_NE(std::stoi(m[1]), row);
  EXPECT_GE(std::stod(m[2]), (before - t0) / 1e3 - 1e-3);
  EXPECT_LE(std::stod(m[2]), (after - t0) / 1e3 + 1e-3);
}

// profiler::save throws a loom::Error naming the file it could not write, leaving nothing
// behind: a directory that does not exist, and a path that is a directory (the rename fails).
TEST(Profiler, SaveToAPathThatCannotBeWrittenIsAnError) {
  profiler::clear();
  profiler::start();
  { profiler::Trace span("one"); }
  profiler::stop();
  const std::string missing = "/nonexistent_loom_dir/trace.json";
  const std::string tmp = ".tmp." + std::to_string(::getpid());  // this process's own name
  EXPECT_EQ(test::error_of([&] { profiler::save(missing); }),
            "profiler: cannot write '" + missing + tmp + "'");
  const auto dir = std::filesystem::temp_directory_path() / ("loom_trace_dir_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "inside");  // not empty: rename cannot replace it
  const std::string msg = test::error_of([&] { profiler::save(dir.string()); });
  EXPECT_THAT(msg, HasSubstr("profiler: cannot rename '" + dir.string() + tmp + "' to '" + dir.string() + "'"));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "inside"));
  EXPECT_FALSE(std::filesystem::exists(dir.string() + tmp)) << "the temporary file was left";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom
