// The recipe binaries as a user runs them: a profiled train_resnet run writes a Chrome trace
// with host, device and loader spans; bad options end with one clear error line.
#include "cli_util.h"
#include "json_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace loom {
namespace {

using ::testing::HasSubstr;

using test::run_cli;

TEST(TrainResnet, ProfileOfAFewStepsIsAChromeTraceFromEveryThread) {
  auto trace = std::filesystem::temp_directory_path() / ("loom_profile_" + std::to_string(::getpid()) + ".json");
  auto r = run_cli(std::string(LOOM_TRAIN_RESNET) + " --synthetic --max-steps 3 --batch-size 16 --log-every 1 --profile " +
               trace.string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(trace);
  std::stringstream json;
  json << f.rdbuf();
  std::filesystem::remove(trace);
  EXPECT_TRUE(test::JsonChecker(json.str()).valid());
  for (const char* needle : {"\"traceEvents\"", "\"name\":\"host\"", "\"name\":\"device\"", "\"name\":\"loader",
                             "\"name\":\"train_step\"", "\"name\":\"execute\"", "\"name\":\"loader_read\""})
    EXPECT_NE(json.str().find(needle), std::string::npos) << "the trace lacks " << needle;
}

TEST(TrainResnet, BadOptionsEndWithOneClearErrorLine) {
  auto bin = std::string(LOOM_TRAIN_RESNET);
  struct Case {
    std::string args, message;
  };
  for (const auto& c : std::vector<Case>{
           {"--batch-size -4", "--batch-size: expected a positive value"},
           {"--model resnet7 --synthetic", "resnet7"},
           // The model's name is checked before the data file is looked for.
           {"--model resnet7 --data /nonexistent/file.h5", "unknown model 'resnet7'"},
           {"--data /nonexistent/file.h5", "--data: no such file '/nonexistent/file.h5'"},
           {"--mode fast --synthetic", "--mode: expected lazy, eager or compiled, got 'fast'"},
           {"--bogus", "unrecognised option '--bogus'"},
           {"--device tpu --synthetic", "--device: unknown kind 'tpu' in 'tpu'"},
           {"--device cpu:3 --synthetic", "--device: no device cpu:3"},
           {"--synthetic --checkpoint-every 2", "--checkpoint-every: needs --checkpoint FILE"},
           {"--synthetic --data x.h5", "--synthetic trains on generated data and reads no --data"},
       }) {
    auto r = run_cli(bin + " " + c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(r.output, HasSubstr("train_resnet: error: ")) << c.args;
  }
}

TEST(TrainDecoder, GenerateNeedsACheckpointOfTheSameModel) {
  auto r = run_cli(std::string(LOOM_TRAIN_DECODER) + " --generate hello");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("--generate: needs --checkpoint FILE"));
}

// A decoder run resumed with a larger --steps trains on from its checkpoint (its epochs do
// not depend on --steps); resumed with the same --steps, it only evaluates and says so.
TEST(TrainDecoder, AResumeWithMoreStepsTrainsOn) {
  const auto ck = std::filesystem::temp_directory_path() / ("loom_dec_" + std::to_string(::getpid()) + ".ckpt.h5");
  const std::string run = std::string(LOOM_TRAIN_DECODER) +
                          " --synthetic --hidden 32 --layers 1 --heads 2 --kv-heads 1 --intermediate 64 --seq-len 16"
                          " --batch-size 4 --eval-windows 8 --log-every 1 --checkpoint " + ck.string();
  auto r = run_cli(run + " --steps 3");
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_cli(run + " --steps 5 --resume");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("at step 3"));
  EXPECT_THAT(r.output, HasSubstr("step 5/5"));
  EXPECT_THAT(r.output, HasSubstr("trained 2 steps"));
  r = run_cli(run + " --steps 5 --resume");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("nothing left to train: the run is at step 5 of its 5"));
  EXPECT_THAT(r.output, HasSubstr("validation loss"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("training loss")));
  std::filesystem::remove(ck);
}

}  // namespace
}  // namespace loom
