// The recipes train as a user runs them, on real files: train_decoder learns a small text and
// samples from the checkpoint it wrote; train_resnet reads an image file and runs its options
// (--mode lazy|eager|compiled give the same losses, eager to rounding where convs run
// channels-last, --schedule step|constant set the learning
// rate they say, --label-smoothing and --augment change what is trained on).
#include "cli_util.h"
#include "temp_dir.h"

#include <loom/data/hdf5.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

namespace loom {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using test::run_cli;

using test::TempDir;

// Whether this run keeps every conv [N,C,H,W] (LOOM_CONV_LAYOUT=nchw, the Nchw.* runs).
bool nchw_convs() {
  const char* v = std::getenv("LOOM_CONV_LAYOUT");
  return v && std::string(v) == "nchw";
}

// Per logged step ("step k/N  loss X  lr Y"): (loss, lr).
std::vector<std::pair<double, double>> logged_steps(const std::string& output) {
  static const std::regex re(R"(step (\d+)/\d+  loss ([0-9.]+)  lr ([0-9.e+-]+))");
  std::vector<std::pair<double, double>> out;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it)
    out.emplace_back(std::stod((*it)[2]), std::stod((*it)[3]));
  return out;
}

double number_after(const std::string& output, const std::string& prefix) {
  auto at = output.rfind(prefix);
  if (at == std::string::npos) return NAN;
  return std::stod(output.substr(at + prefix.size()));
}

const std::string kText = "the cat sat on the mat. ";

data::HostArray text_tokens(int64_t n) {
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<unsigned char>(kText[i % kText.size()]);
  return data::HostArray::from_vector(v, {n});
}

TEST(TrainDecoder, LearnsARealFileAndSamplesFromItsCheckpoint) {
  TempDir dir("decoder");
  {
    data::HDF5Writer w(dir / "text.h5");
    w.write("train/tokens", text_tokens(6000), {.chunk_rows = 1024, .deflate = 1});
    w.write("val/tokens", text_tokens(1200), {.chunk_rows = 1024, .deflate = 1});
    w.close();
  }
  const std::string model = std::string(LOOM_TRAIN_DECODER) +
                            " --hidden 32 --layers 1 --heads 2 --kv-heads 1 --intermediate 64 --seq-len 16"
                            " --threads 1 --loader-threads 1 --checkpoint " + dir / "lm.h5";
  auto train = run_cli(model + " --data " + dir / "text.h5" +
                       " --batch-size 8 --steps 60 --warmup 5 --lr 1e-2 --eval-windows 16 --log-every 20");
  ASSERT_EQ(train.status, 0) << train.output;
  const auto steps = logged_steps(train.output);
  ASSERT_EQ(steps.size(), 3u) << train.output;
  // A uniform guess over 256 bytes costs ln 256 = 5.55 nats; a text of 11 distinct bytes,
  // repeating every 24, is learned far below that.
  const double val = number_after(train.output, "validation loss ");
  EXPECT_LT(val, 1.5) << train.output;
  EXPECT_LT(steps.back().first, steps.front().first) << train.output;
  ASSERT_TRUE(fs::exists(dir / "lm.h5"));

  // Greedy sampling from the checkpoint: deterministic, and only bytes of the text follow the
  // prompt (an untrained model picks among all 256).
  auto sample = [&] {
    // The sample alone: stdout, without the log lines of stderr.
    return run_cli("{ " + model + " --generate 'the cat' --length 24 --temperature 0 2>/dev/null; }");
  };
  const auto a = sample(), b = sample();
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  const auto at = a.output.find("the cat");
  ASSERT_NE(at, std::string::npos) << a.output;
  const std::string continuation = a.output.substr(at + 7, 24);
  ASSERT_EQ(continuation.size(), 24u) << a.output;
  const std::set<char> alphabet(kText.begin(), kText.end());
  for (char c : continuation) EXPECT_TRUE(alphabet.count(c)) << "sampled byte " << int(c) << " in '" << continuation << "'";
}

// A Fashion-MNIST-shaped file: 64 training and 36 test images whose mean brightness is their
// label (a class a small net can tell apart), labels i % 10.
void write_images(const std::string& file) {
  data::HDF5Writer w(file);
  for (const auto& [split, n] : {std::pair{"train", int64_t{64}}, std::pair{"test", int64_t{36}}}) {
    std::vector<uint8_t> pixels(static_cast<std::size_t>(n * 28 * 28));
    std::vector<int64_t> labels(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      labels[i] = i % 10;
      for (int64_t p = 0; p < 28 * 28; ++p)
        pixels[i * 784 + p] = static_cast<uint8_t>(20 * labels[i] + (p * 7 + i * 13) % 41);
    }
    w.write(std::string(split) + "/images", data::HostArray::from_vector(pixels, {n, 1, 28, 28}),
            {.chunk_rows = 16, .deflate = 1});
    w.write(std::string(split) + "/labels", data::HostArray::from_vector(labels, {n}), {.chunk_rows = 16});
  }
  w.close();
}

class TrainResnetOptions : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("resnet");
    write_images(*dir_ / "images.h5");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  // Six steps of batch 8 on the file; the test set (36) in batches of 16, the last padded.
  // A run is made once per options string (the tests share the plain one).
  static test::CliResult train(const std::string& options) {
    auto it = runs_.find(options);
    if (it != runs_.end()) return it->second;
    auto r = run_cli(std::string(LOOM_TRAIN_RESNET) + " --data " + *dir_ / "images.h5" +
                     " --model resnet20 --batch-size 8 --eval-batch-size 16 --max-steps 6 --lr 0.05"
                     " --warmup 0 --threads 1 --loader-threads 1 --log-every 1 " + options);
    return runs_.emplace(options, r).first->second;
  }
  static TempDir* dir_;
  static std::map<std::string, test::CliResult> runs_;
};
TempDir* TrainResnetOptions::dir_ = nullptr;
std::map<std::string, test::CliResult> TrainResnetOptions::runs_;

TEST_F(TrainResnetOptions, ModesGiveTheSameLossesOnARealFile) {
  std::vector<std::pair<double, double>> lazy;
  for (const char* mode : {"lazy", "compiled", "eager"}) {
    auto r = train(std::string(mode) == "lazy" ? "--augment false" : std::string("--augment false --mode ") + mode);
    ASSERT_EQ(r.status, 0) << mode << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr("mode " + std::string(mode))) << r.output;
    EXPECT_THAT(r.output, HasSubstr("test accuracy ")) << r.output;
    const auto steps = logged_steps(r.output);
    ASSERT_EQ(steps.size(), 6u) << r.output;
    if (lazy.empty()) {
      lazy = steps;
    } else if (std::string(mode) == "compiled" || nchw_convs()) {
      EXPECT_EQ(steps, lazy) << mode;  // the same graphs, the same kernels
    } else {
      // Eager runs op by op: a batch norm's statistics read [N,C,H,W] there, while the step's
      // graph has them read the channels-last output of the conv before (the CPU's default
      // float32 layout choice), and a float sum's order follows the layout. The first loss
      // is the same function to rounding; training then drifts apart (the Nchw.TrainResnetModes
      // run checks all three modes exactly with every conv [N,C,H,W]).
      EXPECT_NEAR(steps[0].first, lazy[0].first, 2e-4) << mode;
      for (std::size_t i = 0; i < steps.size(); ++i) {
        EXPECT_TRUE(std::isfinite(steps[i].first)) << mode << " step " << i + 1;
        EXPECT_EQ(steps[i].second, lazy[i].second) << mode << " step " << i + 1;  // the rate
      }
    }
  }
}

TEST_F(TrainResnetOptions, SchedulesSetTheLearningRateTheySay) {
  auto step = train("--augment false --schedule step");  // x0.1 every 6/3 = 2 steps
  ASSERT_EQ(step.status, 0) << step.output;
  auto lrs = logged_steps(step.output);
  ASSERT_EQ(lrs.size(), 6u) << step.output;
  EXPECT_DOUBLE_EQ(lrs[0].second, 0.05);
  EXPECT_DOUBLE_EQ(lrs[1].second, 0.05);
  EXPECT_DOUBLE_EQ(lrs[2].second, 0.005);
  EXPECT_DOUBLE_EQ(lrs[4].second, 0.0005);
  auto constant = train("--augment false --schedule constant");
  ASSERT_EQ(constant.status, 0) << constant.output;
  for (const auto& [loss, lr] : logged_steps(constant.output)) EXPECT_DOUBLE_EQ(lr, 0.05);
  auto cosine = train("--augment false");  // cosine, the default
  ASSERT_EQ(cosine.status, 0) << cosine.output;
  lrs = logged_steps(cosine.output);
  ASSERT_EQ(lrs.size(), 6u);
  for (std::size_t i = 1; i < lrs.size(); ++i) EXPECT_LT(lrs[i].second, lrs[i - 1].second) << "step " << i + 1;
}

TEST_F(TrainResnetOptions, LabelSmoothingAndAugmentationChangeTheLoss) {
  auto plain = train("--augment false");
  auto smoothed = train("--augment false --label-smoothing 0.2");
  auto augmented = train("--augment true");
  for (const auto* r : {&plain, &smoothed, &augmented}) ASSERT_EQ(r->status, 0) << r->output;
  const auto p = logged_steps(plain.output), s = logged_steps(smoothed.output), a = logged_steps(augmented.output);
  ASSERT_FALSE(p.empty());
  ASSERT_EQ(p.size(), s.size());
  ASSERT_EQ(p.size(), a.size());
  // The same initial model and first batch: smoothing changes the first loss, augmentation
  // (random crops and flips of the same images) the first batch itself.
  EXPECT_NE(s[0].first, p[0].first);
  EXPECT_NE(a[0].first, p[0].first);
}

}  // namespace
}  // namespace loom
