// Data-parallel training under mpirun on loopback (TCP over lo, oversubscribed: CI machines
// have 2 cores and run as root). Two ranks with batch B must end where one process with batch
// 2B ends; a rank that dies or throws must end the job, not hang it; train_resnet must run on
// two processes, report global throughput and leave a checkpoint that evaluates the same
// alone.
#include <loom/dist.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace loom {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int status;  // the exit code; -1 when killed by a signal
  std::string output;
  double seconds;
};

Result run(const std::string& command) {
  auto start = std::chrono::steady_clock::now();
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed", 0};
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p)) out += buf.data();
  int status = pclose(p);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, seconds};
}

template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::Error";
  return {};
}

// ctest starts this process without mpirun: it is alone, and the collectives give back their
// operands.
TEST(Dist, AloneTheProcessIsRankZeroOfOne) {
  EXPECT_EQ(dist::rank(), 0);
  EXPECT_EQ(dist::world_size(), 1);
  EXPECT_EQ(dist::local_rank(), 0);
  EXPECT_EQ(dist::local_size(), 1);
  EXPECT_FALSE(dist::is_distributed());
  auto x = from_vector<float>({1, 2}, {2});
  EXPECT_EQ(dist::all_reduce(x, dist::ReduceOp::Mean).to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(dist::broadcast(x).to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ(dist::all_reduce(3.5), 3.5);
  dist::barrier();
  x.set_grad(ones({2}));
  dist::all_reduce_gradients({x});
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1}));
}

TEST(Dist, CollectivesRejectWhatTheyCannotReduce) {
  using ::testing::HasSubstr;
  EXPECT_THAT(error_of([] { dist::all_reduce(Tensor{}); }), HasSubstr("dist::all_reduce: got an undefined tensor"));
  EXPECT_THAT(error_of([] { dist::all_reduce(eq(zeros({2}), zeros({2}))); }),
              HasSubstr("cannot reduce bool tensors; cast to int32 first"));
  EXPECT_THAT(error_of([] { dist::all_reduce(zeros({2}, DType::Int64), dist::ReduceOp::Mean); }),
              HasSubstr("Mean needs a floating-point tensor, got int64"));
  EXPECT_THAT(error_of([] { dist::broadcast(zeros({2}), 1); }),
              HasSubstr("dist::broadcast: expected a root rank in [0, 1), got 1"));
}

// `timeout` turns a hang into exit code 124 (and a failed test) instead of a stuck ctest.
constexpr int kHang = 124;

std::string mpirun(int processes, const std::string& program_and_args) {
  return "timeout -k 5 150 " + std::string(LOOM_MPIEXEC) + " -np " + std::to_string(processes) +
         " --allow-run-as-root --oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo"
         " --mca oob_tcp_if_include lo " +
         program_and_args;
}

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("loom_dist_" + std::to_string(::getpid()) + "_" + name);
}

// name index → value, from dist_tiny_train --out.
std::map<std::string, double> read_parameters(const std::filesystem::path& file) {
  std::map<std::string, double> out;
  std::ifstream f(file);
  std::string name;
  std::size_t i;
  double v;
  while (f >> name >> i >> v) out[name + "[" + std::to_string(i) + "]"] = v;
  return out;
}

void expect_close(const std::map<std::string, double>& got, const std::map<std::string, double>& want,
                  double rtol) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  double scale = 0;
  for (const auto& [k, v] : want) scale = std::max(scale, std::abs(v));
  for (const auto& [k, v] : want) {
    ASSERT_TRUE(got.count(k)) << k;
    // Relative to the value, with the tensor's largest value as the floor for values near 0.
    EXPECT_LE(std::abs(got.at(k) - v), rtol * std::max(std::abs(v), 1e-2 * scale)) << k << ": " << got.at(k) << " vs " << v;
  }
}

std::string tiny() { return LOOM_DIST_TINY_TRAIN; }

TEST(DataParallel, CollectivesGiveEveryRankTheReducedValues) {
  auto r = run(mpirun(2, LOOM_DIST_COLLECTIVES));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("dist_collectives: all checks passed on 2 processes"));
}

TEST(DataParallel, MismatchedCollectivesAreAnErrorNotAHang) {
  auto r = run(mpirun(2, std::string(LOOM_DIST_COLLECTIVES) + " --mismatch"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, kHang) << r.output;
  EXPECT_THAT(r.output, HasSubstr("dist::all_reduce: the ranks disagree on the tensor's shape or dtype"));
  // Another reduce op on each rank (Sum and Mean both sum through MPI: only a check sees it),
  // and a number's all_reduce against a tensor's.
  for (const char* how : {"op", "kind"}) {
    auto m = run(mpirun(2, std::string(LOOM_DIST_COLLECTIVES) + " --mismatch " + how));
    EXPECT_NE(m.status, 0) << how << "\n" << m.output;
    EXPECT_NE(m.status, kHang) << how << "\n" << m.output;
    EXPECT_THAT(m.output, HasSubstr("dist::all_reduce: the ranks disagree on")) << how;
  }
}

void expect_two_ranks_match_one_process(const std::string& options) {
  auto one = temp_path("one"), two = temp_path("two");
  auto single = run(tiny() + " --batch-size 8 --steps 6 --out " + one.string() + " " + options);
  ASSERT_EQ(single.status, 0) << single.output;
  EXPECT_THAT(single.output, HasSubstr("trained 6 steps on 1 processes"));
  auto dual = run(mpirun(2, tiny() + " --batch-size 4 --steps 6 --out " + two.string() + " " + options));
  ASSERT_EQ(dual.status, 0) << dual.output;
  EXPECT_THAT(dual.output, HasSubstr("trained 6 steps on 2 processes"));

  auto p_one = read_parameters(one.string() + ".rank0.txt");
  auto p0 = read_parameters(two.string() + ".rank0.txt");
  auto p1 = read_parameters(two.string() + ".rank1.txt");
  for (const auto& f : {one.string() + ".rank0.txt", two.string() + ".rank0.txt", two.string() + ".rank1.txt"})
    std::filesystem::remove(f);
  EXPECT_EQ(p0, p1) << "the two ranks ended with different parameters";
  expect_close(p0, p_one, 1e-5);
}

TEST(DataParallel, TwoRanksWithBatchBEndWhereOneProcessWithBatch2BEnds) {
  expect_two_ranks_match_one_process("");
}

// With clipping the Trainer averages first and clips the averaged gradients: two ranks end
// where one process ends, and both end elsewhere than without clipping (the clip acts: the
// gradients' norm is above 0.05 here).
TEST(DataParallel, ClippingActsOnTheAveragedGradients) {
  expect_two_ranks_match_one_process("--clip 0.05");
  auto clipped = temp_path("clipped"), unclipped = temp_path("unclipped");
  for (const auto& [path, clip] : {std::pair{clipped, "0.05"}, std::pair{unclipped, "0"}}) {
    auto r = run(tiny() + " --batch-size 8 --steps 6 --clip " + clip + " --out " + path.string());
    ASSERT_EQ(r.status, 0) << r.output;
  }
  auto a = read_parameters(clipped.string() + ".rank0.txt");
  auto b = read_parameters(unclipped.string() + ".rank0.txt");
  std::filesystem::remove(clipped.string() + ".rank0.txt");
  std::filesystem::remove(unclipped.string() + ".rank0.txt");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  double largest = 0;
  for (const auto& [k, v] : a) largest = std::max(largest, std::abs(v - b.at(k)));
  EXPECT_GT(largest, 1e-3) << "clipping at 0.05 changed no parameter: it was not applied";
}

// "A signal to any rank stops all of them at the same step" (loom/trainer.h): SIGTERM reaches
// rank 1 alone during step 3; both ranks finish step 3, stop there and exit cleanly.
TEST(DataParallel, ASignalToOneRankStopsEveryRankAtTheSameStep) {
  auto r = run(mpirun(2, tiny() + " --steps 1000 --fail-rank 1 --fail-step 3 --fail-mode sigterm"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("dist_tiny_train: rank 0 stopped at step 3")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("dist_tiny_train: rank 1 stopped at step 3")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("trained 3 steps on 2 processes")) << r.output;
}

TEST(DataParallel, ARankThatThrowsEndsEveryRankWithItsMessage) {
  auto r = run(mpirun(2, tiny() + " --steps 100000 --fail-rank 1 --fail-step 5 --fail-mode throw"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, kHang) << "the job hung after rank 1 failed\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("[rank 1 of 2] dist_tiny_train: error: injected failure at step 5"));
  EXPECT_THAT(r.output, Not(HasSubstr("trained")));
}

TEST(DataParallel, AKilledRankEndsTheOthersInBoundedTime) {
  auto r = run(mpirun(2, tiny() + " --steps 100000 --fail-rank 1 --fail-step 5 --fail-mode kill"));
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, kHang) << "rank 0 hung after rank 1 was killed\n" << r.output;
  EXPECT_LT(r.seconds, 120) << r.output;
  EXPECT_THAT(r.output, HasSubstr("signal 9")) << "mpirun should name the killed rank's signal";
  EXPECT_THAT(r.output, Not(HasSubstr("trained")));
}

double accuracy_in(const std::string& output) {
  std::smatch m;
  static const std::regex re("test accuracy ([0-9.]+)%");
  if (!std::regex_search(output, m, re)) return -1;
  return std::stod(m[1]);
}

TEST(TrainResnet, TwoProcessesReportGlobalThroughputAndACheckpointEveryRankResumes) {
  auto ck = temp_path("resnet.ckpt.h5");
  std::string args = std::string(LOOM_TRAIN_RESNET) +
                     " --synthetic --model resnet20 --batch-size 8 --eval-batch-size 100 --threads 1"
                     " --loader-threads 1 --log-every 1 --checkpoint " + ck.string();
  auto trace = temp_path("trace.json");
  auto first = run(mpirun(2, args + " --max-steps 2 --profile " + trace.string()));
  ASSERT_EQ(first.status, 0) << first.output;
  // Each rank's trace in a file of its own, whole (no two ranks wrote one file).
  for (const auto& t : {trace, trace.parent_path() / (trace.stem().string() + ".rank1.json")}) {
    std::ifstream f(t);
    std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(json.rfind("{\"displayTimeUnit\"", 0), 0u) << t;
    EXPECT_EQ(json.substr(json.size() - 4), "\n]}\n") << t;
    std::filesystem::remove(t);
  }
  EXPECT_THAT(first.output, HasSubstr("data-parallel over 2 processes: 8 images per process and step"));
  EXPECT_THAT(first.output, HasSubstr("steps of 16 images"));
  EXPECT_THAT(first.output, HasSubstr("images/s over 2 processes"));
  // Rank 0 alone logs: one summary, not two.
  ASSERT_NE(first.output.find("test accuracy"), std::string::npos) << first.output;
  EXPECT_EQ(first.output.find("test accuracy"), first.output.rfind("test accuracy")) << first.output;
  ASSERT_TRUE(std::filesystem::exists(ck));

  // Both ranks resume from rank 0's checkpoint and go on.
  auto second = run(mpirun(2, args + " --max-steps 3 --resume"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr("resumed from " + ck.string() + " at step 2"));
  EXPECT_THAT(second.output, HasSubstr("trained 1 step in "));
  EXPECT_THAT(second.output, HasSubstr("(the run is at step 3)"));
  double sharded = accuracy_in(second.output);
  ASSERT_GE(sharded, 0) << second.output;

  // One process evaluating the same checkpoint (nothing left to train) reports the same
  // accuracy as the two processes that each evaluated half of the test set.
  auto alone = run(args + " --max-steps 3 --resume");
  ASSERT_EQ(alone.status, 0) << alone.output;
  EXPECT_THAT(alone.output, HasSubstr("resumed from " + ck.string() + " at step 3"));
  EXPECT_DOUBLE_EQ(accuracy_in(alone.output), sharded) << second.output << alone.output;

  // Training on from it alone would take other samples than the two processes would have.
  auto on = run(args + " --max-steps 5 --resume");
  EXPECT_EQ(on.status, 1) << on.output;
  EXPECT_THAT(on.output, HasSubstr("was written by a run over 2 processes, this run has 1")) << on.output;
  std::filesystem::remove(ck);
}

}  // namespace
}  // namespace loom
