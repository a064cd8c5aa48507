// What the recipe binaries do around their checkpoints, as a user meets it: a signal stops a
// run within a few steps and saves, a second one exits at once; a diverging run stops with the
// step named and leaves the last good checkpoint alone; a full disk is one error line; a
// destination that cannot be written is refused before training.
#include "cli_util.h"
#include "temp_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <unistd.h>

namespace loom {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using test::CliProcess;
using test::run_cli;

using test::TempDir;

const std::string kResnet = std::string(LOOM_TRAIN_RESNET) + " --synthetic --batch-size 16 --eval-batch-size 100 ";

// The number after `prefix` in `text` (the last occurrence), or -1.
int64_t last_number_after(const std::string& text, const std::string& prefix) {
  auto at = text.rfind(prefix);
  if (at == std::string::npos) return -1;
  return std::stoll(text.substr(at + prefix.size()));
}

// Resumes from `ck` for zero new steps and returns the step it resumed at (-1: it could not).
int64_t resumed_step(const std::string& ck, int64_t max_steps) {
  auto r = run_cli(kResnet + "--max-steps " + std::to_string(max_steps) + " --checkpoint " + ck + " --resume");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr("nothing left to train: the run is at step "),
                              HasSubstr(" of its " + std::to_string(max_steps) + " (")));
  return last_number_after(r.output, "resumed from " + ck + " at step ");
}

TEST(Signals, SigintStopsWithinAFewStepsSavesAndExits130) {
  TempDir dir("sigint");
  const auto ck = dir / "run.ckpt.h5";
  CliProcess p(kResnet + "--log-every 1 --checkpoint " + ck);
  ASSERT_TRUE(p.read_until("step 3/")) << p.output();
  p.signal(SIGINT);
  const int64_t seen = last_number_after(p.output(), "step ");
  EXPECT_EQ(p.wait(), 130) << p.output();
  EXPECT_THAT(p.output(), HasSubstr("stopping after this step"));
  const int64_t stopped = last_number_after(p.output(), "interrupted at step ");
  // The device had finished step `seen` when the signal came; the host is at most two steps
  // ahead (max_steps_in_flight) and finishes the one it is tracing.
  EXPECT_GE(stopped, seen);
  EXPECT_LE(stopped, seen + 4) << p.output();
  EXPECT_EQ(resumed_step(ck, stopped), stopped);
}

TEST(Signals, ASecondSignalExitsAtOnceAndKeepsTheLastCheckpoint) {
  TempDir dir("sigint2");
  const auto ck = dir / "run.ckpt.h5";
  // Slow steps (ResNet-56, batch 64): the first signal's stop takes long enough for the second.
  const std::string slow = std::string(LOOM_TRAIN_RESNET) +
                           " --synthetic --model resnet56 --batch-size 64 --eval-batch-size 100 --checkpoint " + ck;
  ASSERT_EQ(run_cli(slow + " --max-steps 2").status, 0);
  CliProcess p(slow + " --log-every 1 --checkpoint-every 1 --resume");
  ASSERT_TRUE(p.read_until("step 3/")) << p.output();
  p.signal(SIGTERM);
  ASSERT_TRUE(p.read_until("stopping after this step")) << p.output();
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait(), 130) << p.output();
  EXPECT_THAT(p.output(), HasSubstr("second signal: exiting now"));
  EXPECT_THAT(p.output(), Not(HasSubstr("interrupted at step")));  // it did not finish the stop
  // Whatever step it died in, the checkpoint is a whole one, and the next run cleans up.
  auto r = run_cli(slow + " --max-steps 3 --resume");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_GE(last_number_after(r.output, "at step "), 2) << r.output;
  EXPECT_FALSE(fs::exists(ck + ".tmp"));
}

TEST(NonFinite, ADivergingRunStopsNamingTheStepAndKeepsTheGoodCheckpoint) {
  TempDir dir("nan");
  const auto ck = dir / "good.ckpt.h5";
  ASSERT_EQ(run_cli(kResnet + "--max-steps 2 --checkpoint " + ck).status, 0);
  auto r = run_cli(kResnet + "--max-steps 30 --checkpoint-every 1 --lr 1e30 --warmup 0 --checkpoint " + ck +
                   " --resume");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("train_resnet: error: (step \\d+: the training loss is "
                                                     "(nan|inf|-inf)|save_checkpoint: .* non-finite value)")))
      << r.output;
  const int64_t saved = resumed_step(ck, 2);
  EXPECT_GE(saved, 2);  // the good one, or a later one that was still finite
  EXPECT_FALSE(fs::exists(ck + ".tmp"));
}

TEST(NonFinite, SenselessOptionsAreRefusedUpFront) {
  struct Case {
    std::string command, message;
  };
  const std::string decoder = std::string(LOOM_TRAIN_DECODER) + " --generate hi --checkpoint none.h5 ";
  for (const auto& c : std::vector<Case>{
           {kResnet + "--lr nan", "train_resnet: error: --lr: expected a finite value, got nan"},
           {kResnet + "--lr inf", "train_resnet: error: --lr: expected a finite value, got inf"},
           {kResnet + "--momentum nan", "train_resnet: error: --momentum: expected a finite value, got nan"},
           {kResnet + "--weight-decay inf", "train_resnet: error: --weight-decay: expected a finite value, got inf"},
           {kResnet + "--label-smoothing 1.5", "--label-smoothing: expected a value in [0, 1), got 1.5"},
           {decoder + "--temperature nan", "train_decoder: error: --temperature: expected a finite value, got nan"},
           {decoder + "--temperature -1", "train_decoder: error: --temperature: expected a non-negative value, got -1"},
           {decoder + "--length -5", "train_decoder: error: --length: expected a non-negative value, got -5"},
           {std::string(LOOM_TRAIN_DECODER) + " --synthetic --weight-decay inf",
            "train_decoder: error: --weight-decay: expected a finite value, got inf"},
       }) {
    auto r = run_cli(c.command);
    EXPECT_EQ(r.status, 1) << c.command << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.command;
  }
}

TEST(CheckpointWrites, AFullDiskIsOneErrorLineAndKeepsThePreviousCheckpoint) {
  TempDir dir("full");
  const auto ck = dir / "run.ckpt.h5";
  ASSERT_EQ(run_cli(kResnet + "--max-steps 2 --checkpoint " + ck).status, 0);
  const auto size = fs::file_size(ck);
  // Files over 64 KiB cannot be written (EFBIG, as a full disk gives ENOSPC): the checkpoint,
  // about 2 MB, fails part way through.
  auto r = run_cli("bash -c \"trap '' XFSZ; ulimit -f 64; exec " + kResnet + "--max-steps 4 --checkpoint " + ck +
                   " --resume\"");
  EXPECT_EQ(r.status, 1) << r.output;  // not a crash
  EXPECT_THAT(r.output, HasSubstr("train_resnet: error: save_checkpoint: '" + ck +
                                  "' not written (the previous checkpoint is kept): "));
  EXPECT_EQ(r.output.find("error:"), r.output.rfind("error:")) << "one error line\n" << r.output;
  EXPECT_FALSE(fs::exists(ck + ".tmp"));
  EXPECT_EQ(fs::file_size(ck), size);
  EXPECT_EQ(resumed_step(ck, 2), 2);
}

TEST(CheckpointWrites, TheFileIsFlushedBeforeTheRenameAndTheDirectoryAfter) {
  if (run_cli("strace -V").status != 0) GTEST_SKIP() << "strace is not installed: the system calls cannot be seen";
  TempDir dir("fsync");
  const auto ck = dir / "run.ckpt.h5";
  auto r = run_cli("strace -f -y -e trace=fsync,rename,renameat,renameat2 " + kResnet + "--max-steps 1 --checkpoint " +
                   ck);
  if (r.output.find("PTRACE") != std::string::npos || r.output.find("Operation not permitted") != std::string::npos)
    GTEST_SKIP() << "strace may not trace here: " << r.output.substr(0, 200);
  ASSERT_EQ(r.status, 0) << r.output;
  // With -y, strace names each descriptor's file: fsync(5</tmp/.../run.ckpt.h5.tmp>) = 0.
  const auto synced_tmp = r.output.find("fsync(");
  ASSERT_NE(synced_tmp, std::string::npos) << r.output;
  const std::string first = r.output.substr(synced_tmp, r.output.find('\n', synced_tmp) - synced_tmp);
  EXPECT_NE(first.find("<" + ck + ".tmp>)"), std::string::npos) << "the first fsync is not the .tmp file's\n"
                                                                     << r.output;
  const auto renamed = r.output.find("\"" + ck + "\"", synced_tmp);  // rename*(..., "<ck>") = 0, after it
  ASSERT_NE(renamed, std::string::npos) << "no rename after the fsync\n" << r.output;
  std::string directory = dir / "";
  directory.pop_back();
  EXPECT_NE(r.output.find("fsync(", renamed), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<" + directory + ">)", renamed), std::string::npos)
      << "no fsync of the directory after the rename\n" << r.output;
}

TEST(CheckpointWrites, DestinationsThatCannotBeWrittenAreRefusedBeforeTraining) {
  TempDir dir("dest");
  struct Case {
    std::string args, message;
  };
  for (const auto& c : std::vector<Case>{
           {"--checkpoint " + dir / "", "--checkpoint '" + dir / "" + "': is a directory, expected a file name"},
           {"--checkpoint " + dir / "missing/run.h5", "--checkpoint '" + dir / "missing/run.h5" +
                                                          "': the directory '" + dir / "missing" + "' does not exist"},
           {"--checkpoint /proc/loom.ckpt.h5", "--checkpoint '/proc/loom.ckpt.h5': cannot create a file there"},
           {"--profile " + dir / "", "--profile '" + dir / "" + "': is a directory"},
           {"--profile /proc/trace.json", "--profile '/proc/trace.json': cannot create a file there"},
       }) {
    auto r = run_cli(kResnet + "--max-steps 5 --log-every 1 " + c.args);
    EXPECT_EQ(r.status, 1) << c.args << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("train_resnet: error: " + c.message)) << c.args;
    EXPECT_THAT(r.output, Not(HasSubstr("step 1/"))) << "refused only after training\n" << r.output;
  }
}

TEST(CheckpointWrites, AStaleTempFileIsRemovedAndAMissingResumeIsSaid) {
  TempDir dir("stale");
  const auto ck = dir / "run.ckpt.h5";
  std::ofstream(ck + ".tmp") << "half a checkpoint";
  auto r = run_cli(kResnet + "--max-steps 1 --checkpoint " + ck + " --resume");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("removed " + ck + ".tmp, left by a run that stopped while saving"));
  EXPECT_THAT(r.output, HasSubstr("--resume: no checkpoint at " + ck + " yet; starting from scratch"));
  EXPECT_FALSE(fs::exists(ck + ".tmp"));
  EXPECT_TRUE(fs::exists(ck));
}

}  // namespace
}  // namespace loom
