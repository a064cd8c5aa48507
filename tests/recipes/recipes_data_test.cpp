// The recipes' data checks, through the binaries: labels and tokens out of range end the run
// with one error line naming the file, the dataset, the sample and the value, before any
// training step (for the test split too, not after an epoch); a split too short for one
// window, or labels of the wrong shape or type, name the split.
#include "cli_util.h"

#include <loom/data/hdf5.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <unistd.h>

namespace loom {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using test::run_cli;

// A file removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((std::filesystem::temp_directory_path() / ("loom_data_" + std::to_string(::getpid()) + "_" + name))
                  .string()) {}
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An image file shaped like Fashion-MNIST's (train: 64 images, test: 32, 1x28x28 unless
// `train_image` and `test_image` say otherwise), labels i % 10.
void write_images(const std::string& file, const data::HostArray& train_labels, const data::HostArray& test_labels,
                  const Shape& train_image = {1, 28, 28}, const Shape& test_image = {1, 28, 28}) {
  data::HDF5Writer w(file);
  for (const auto& [split, labels] : {std::pair{"train", &train_labels}, std::pair{"test", &test_labels}}) {
    Shape shape{labels->shape[0]};
    const Shape& image = std::string(split) == "train" ? train_image : test_image;
    shape.insert(shape.end(), image.begin(), image.end());
    w.write(std::string(split) + "/images", data::HostArray(data::HostDType::UInt8, shape),
            {.chunk_rows = 16, .deflate = 1});
    w.write(std::string(split) + "/labels", *labels, {.chunk_rows = 16});
  }
  w.close();
}

data::HostArray labels(int64_t n, std::vector<std::pair<int64_t, int64_t>> overrides = {}) {
  std::vector<int64_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i % 10;
  for (const auto& [i, value] : overrides) v[static_cast<std::size_t>(i)] = value;
  return data::HostArray::from_vector(v, {n});
}

// Byte-level tokens 'a'..'z' as int32, so that a token can exceed --vocab 256.
data::HostArray tokens(int64_t n, std::vector<std::pair<int64_t, int32_t>> overrides = {}) {
  std::vector<int32_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<int32_t>('a' + i % 26);
  for (const auto& [i, value] : overrides) v[static_cast<std::size_t>(i)] = value;
  return data::HostArray::from_vector(v, {n});
}

void write_tokens(const std::string& file, const data::HostArray& train, const data::HostArray& val) {
  data::HDF5Writer w(file);
  w.write("train/tokens", train, {.chunk_rows = 256, .deflate = 1});
  w.write("val/tokens", val, {.chunk_rows = 256, .deflate = 1});
  w.close();
}

// The lines of `output` holding `needle`.
std::vector<std::string> lines_with(const std::string& output, const std::string& needle) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

// Exit code 1, `error` as the one error line, and no training step made.
void expect_fails_before_training(const test::CliResult& r, const std::string& error) {
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(lines_with(r.output, "error:"), std::vector<std::string>{error}) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("step 1/"))) << "a training step was made";
  EXPECT_THAT(r.output, Not(HasSubstr("trained ")));
}

TEST(TrainResnet, LabelsOutOfRangeFailBeforeAnyStepNamingFileDatasetSampleAndValue) {
  TempFile file("labels.h5");
  const std::string run = std::string(LOOM_TRAIN_RESNET) + " --epochs 1 --batch-size 16 --log-every 1 --data " +
                          file.path();
  // The test split, which is read only after an epoch of training.
  write_images(file.path(), labels(64), labels(32, {{17, 12}}));
  expect_fails_before_training(run_cli(run), "train_resnet: error: HDF5Dataset: '" + file.path() +
                                                 "' dataset 'test/labels': sample 17 is 12, expected a class in "
                                                 "[0, 10) (out of range: 1 of 32 samples)");
  write_images(file.path(), labels(64, {{40, -1}, {63, 10}, {5, 11}}), labels(32));
  expect_fails_before_training(run_cli(run), "train_resnet: error: HDF5Dataset: '" + file.path() +
                                                 "' dataset 'train/labels': sample 5 is 11, expected a class in "
                                                 "[0, 10) (out of range: 3 of 64 samples)");
}

TEST(TrainResnet, LabelsOfTheWrongTypeOrShapeNameTheSplit) {
  TempFile file("labels.h5");
  const std::string run = std::string(LOOM_TRAIN_RESNET) + " --epochs 1 --batch-size 16 --data " + file.path();
  write_images(file.path(), labels(64), data::HostArray::from_vector(std::vector<float>(32, 1.0f), {32}));
  expect_fails_before_training(run_cli(run), "train_resnet: error: HDF5Dataset: '" + file.path() +
                                                 "' dataset 'test/labels': expected integers (a class in [0, 10)), "
                                                 "got float32 values");
  write_images(file.path(), data::HostArray::from_vector(std::vector<int64_t>(128, 1), {64, 2}), labels(32));
  expect_fails_before_training(run_cli(run), "train_resnet: error: --data: '" + file.path() +
                                                 "' train/labels must be [N] class indices, got samples of [2]");
}

// Images of another size are cropped to their own size (padding 2), and the two splits must
// hold one image shape.
TEST(TrainResnet, ImagesOfAnotherSizeTrainAndBothSplitsMustMatch) {
  TempFile file("sizes.h5");
  const std::string run = std::string(LOOM_TRAIN_RESNET) + " --epochs 1 --batch-size 16 --data " + file.path();
  write_images(file.path(), labels(64), labels(32), {3, 20, 20}, {3, 20, 20});
  const auto r = run_cli(run + " --max-steps 2 --eval-batch-size 16");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("trained 2 steps"));
  write_images(file.path(), labels(64), labels(32), {3, 20, 20}, {3, 24, 24});
  expect_fails_before_training(run_cli(run), "train_resnet: error: --data: '" + file.path() +
                                                 "' test/images hold samples of [3,24,24], train/images of "
                                                 "[3,20,20]; both splits need one image shape");
}

TEST(TrainDecoder, TokensOutOfVocabFailBeforeAnyStepNamingFileSplitTokenAndValue) {
  TempFile file("tokens.h5");
  const std::string run = std::string(LOOM_TRAIN_DECODER) +
                          " --hidden 32 --layers 1 --heads 2 --kv-heads 2 --intermediate 64 --seq-len 16 "
                          "--batch-size 2 --steps 2 --log-every 1 --data " + file.path();
  write_tokens(file.path(), tokens(2000), tokens(500, {{123, 300}}));
  expect_fails_before_training(run_cli(run), "train_decoder: error: TokenWindowDataset ('" + file.path() +
                                                 " val/tokens'): token 123 is 300, expected a token (--vocab) in "
                                                 "[0, 256) (out of range: 1 of 500 tokens)");
  write_tokens(file.path(), tokens(2000, {{1999, 256}, {7, -1}}), tokens(500));
  expect_fails_before_training(run_cli(run), "train_decoder: error: TokenWindowDataset ('" + file.path() +
                                                 " train/tokens'): token 7 is -1, expected a token (--vocab) in "
                                                 "[0, 256) (out of range: 2 of 2000 tokens)");
  // A smaller --vocab: the byte-level text no longer fits.
  write_tokens(file.path(), tokens(2000), tokens(500));
  expect_fails_before_training(run_cli(run + " --vocab 64"),
                               "train_decoder: error: TokenWindowDataset ('" + file.path() +
                                   " train/tokens'): token 0 is 97, expected a token (--vocab) in [0, 64) "
                                   "(out of range: 2000 of 2000 tokens)");
}

TEST(TrainDecoder, ASplitTooShortForOneWindowIsNamed) {
  TempFile file("tokens.h5");
  write_tokens(file.path(), tokens(2000), tokens(10));
  auto r = run_cli(std::string(LOOM_TRAIN_DECODER) + " --seq-len 16 --steps 2 --data " + file.path());
  expect_fails_before_training(r, "train_decoder: error: TokenWindowDataset ('" + file.path() +
                                      " val/tokens'): 10 tokens cannot hold one window of seq_len + 1 = 17");
}

}  // namespace
}  // namespace loom
