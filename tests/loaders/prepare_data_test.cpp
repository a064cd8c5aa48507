// prepare_data, run as a program on tiny IDX and text inputs written here.
#include "loaders_test_util.h"

#include <loom/data/hdf5.h>
#include <loom/data/loader.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <sys/wait.h>

namespace loom::data {
namespace {

using ::testing::HasSubstr;
using test::TempDir;

struct RunResult {
  int status;
  std::string output;
};

RunResult run_prepare_data(const std::string& args, const TempDir& dir) {
  const std::string log = dir.file("prepare_data.log");
  const std::string cmd = std::string(LOOM_PREPARE_DATA) + " " + args + " > '" + log + "' 2>&1";
  const int raw = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, ss.str()};
}

void put_be32(std::string& s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

// IDX files for `n` images of rows x cols and their labels (label = i % 10).
void write_idx(const TempDir& dir, const std::string& prefix, uint32_t n, uint32_t rows, uint32_t cols,
               uint32_t image_magic = 0x00000803) {
  std::string images, labels;
  put_be32(images, image_magic);
  put_be32(images, n);
  put_be32(images, rows);
  put_be32(images, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) images.push_back(static_cast<char>(i % 256));
  put_be32(labels, 0x00000801);
  put_be32(labels, n);
  for (uint32_t i = 0; i < n; ++i) labels.push_back(static_cast<char>(i % 10));
  write_gz(dir.file(prefix + "-images-idx3-ubyte.gz"), images);
  write_gz(dir.file(prefix + "-labels-idx1-ubyte.gz"), labels);
}

std::string h5_type(const std::string& file, const std::string& path) {
  std::lock_guard lock(hdf5_mutex());
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  hid_t t = H5Dget_type(ds);
  std::string name = H5Tequal(t, H5T_STD_U8LE) > 0 ? "u8le" : H5Tequal(t, H5T_STD_I64LE) > 0 ? "i64le" : "other";
  H5Tclose(t);
  H5Dclose(ds);
  H5Fclose(f);
  return name;
}

int64_t root_attribute(const std::string& file, const char* name) {
  std::lock_guard lock(hdf5_mutex());
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  int64_t v = -1;
  H5Aread(a, H5T_NATIVE_INT64, &v);
  H5Aclose(a);
  H5Fclose(f);
  return v;
}

TEST(PrepareData, FashionMnistIdxToHDF5) {
  TempDir dir;
  write_idx(dir, "train", 25, 3, 4);
  write_idx(dir, "t10k", 7, 3, 4);
  const std::string out = dir.file("fm.h5");
  auto r = run_prepare_data("--fashion-mnist " + dir.path().string() + " --output " + out + " --chunk-rows 4", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("train/images: 25/25 (100%)"));

  auto images = read_hdf5(out, "train/images");
  EXPECT_EQ(images.str(), "uint8[25,1,3,4]");
  EXPECT_EQ(images.data<uint8_t>()[13 * 12 + 5], (13 * 12 + 5) % 256);
  auto labels = read_hdf5(out, "train/labels");
  EXPECT_EQ(labels.str(), "int64[25]");
  EXPECT_EQ(labels.data<int64_t>()[17], 7);
  EXPECT_EQ(read_hdf5(out, "test/images").str(), "uint8[7,1,3,4]");
  EXPECT_EQ(read_hdf5(out, "test/labels").str(), "int64[7]");
  EXPECT_EQ(h5_type(out, "train/images"), "u8le");
  EXPECT_EQ(h5_type(out, "test/labels"), "i64le");
  EXPECT_EQ(root_attribute(out, "num_classes"), 10);
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));

  // Refuses to overwrite without --force, and leaves the file alone.
  const auto size = std::filesystem::file_size(out);
  r = run_prepare_data("--fashion-mnist " + dir.path().string() + " --output " + out, dir);
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("--force"));
  EXPECT_EQ(std::filesystem::file_size(out), size);
  r = run_prepare_data("--fashion-mnist " + dir.path().string() + " --output " + out + " --force --quiet", dir);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "");
}

TEST(PrepareData, ClearErrors) {
  TempDir dir;
  const std::string out = dir.file("fm.h5");
  auto r = run_prepare_data("--fashion-mnist " + dir.file("missing") + " --output " + out, dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("no such directory"));

  write_idx(dir, "train", 5, 2, 2, /*image_magic=*/0x00000903);
  write_idx(dir, "t10k", 2, 2, 2);
  r = run_prepare_data("--fashion-mnist " + dir.path().string() + " --output " + out, dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("bad IDX magic number 0x00000903"));
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp")) << "no broken output left behind";
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;

  r = run_prepare_data("--output " + out, dir);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.output, HasSubstr("exactly one of"));
  r = run_prepare_data("--help", dir);
  EXPECT_EQ(r.status, 0);
  for (const char* option : {"--fashion-mnist", "--text", "--output", "--force", "--val-fraction", "--token-dtype",
                             "--chunk-rows", "--token-chunk", "--compression", "--quiet"})
    EXPECT_THAT(r.output, HasSubstr(option));
}

TEST(PrepareData, TextToByteTokens) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "corpus");
  std::ofstream(dir.path() / "corpus" / "a") << std::string(700, 'a');
  std::ofstream(dir.path() / "corpus" / "b") << std::string(300, 'b');
  std::ofstream(dir.path() / "corpus" / "b.dat") << std::string(50, '\0');  // strfile index: skipped
  std::filesystem::create_symlink("b", dir.path() / "corpus" / "b.u8");     // same file: read once
  const std::string out = dir.file("tok.h5");
  auto r = run_prepare_data("--text " + (dir.path() / "corpus").string() + " --output " + out +
                                " --val-fraction 0.2 --token-chunk 64",
                            dir);
  ASSERT_EQ(r.status, 0) << r.output;
  auto train = read_hdf5(out, "train/tokens"), val = read_hdf5(out, "val/tokens");
  EXPECT_EQ(train.str(), "uint8[800]");
  EXPECT_EQ(val.str(), "uint8[200]");
  EXPECT_EQ(train.data<uint8_t>()[699], 'a');
  EXPECT_EQ(train.data<uint8_t>()[700], 'b');
  EXPECT_EQ(val.data<uint8_t>()[199], 'b');
  EXPECT_EQ(root_attribute(out, "vocab_size"), 256);

  r = run_prepare_data("--text " + (dir.path() / "corpus" / "a").string() + " --output " + dir.file("t64.h5") +
                           " --token-dtype int64 --val-fraction 0",
                       dir);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_hdf5(dir.file("t64.h5"), "train/tokens").str(), "int64[700]");
}

// The output never replaces or joins the input: an input that is the output is refused with
// the input untouched, an output written into the corpus directory (or any HDF5 file there)
// is not read back as text by the next run, and a directory as the output is refused before
// any work.
TEST(PrepareData, TheOutputIsNeverAnInput) {
  TempDir dir;
  std::filesystem::create_directory(dir.path() / "corpus");
  const std::string text = (dir.path() / "corpus" / "a").string();
  std::ofstream(text) << std::string(700, 'a');
  auto r = run_prepare_data("--text " + text + " --output " + text + " --force", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--text: '" + text + "' is the --output file"));
  EXPECT_EQ(std::filesystem::file_size(text), 700u);

  const std::string inside = (dir.path() / "corpus" / "tok.h5").string();
  for (int run = 0; run < 2; ++run) {
    r = run_prepare_data("--text " + (dir.path() / "corpus").string() + " --output " + inside + " --force", dir);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("700 bytes from 1 files")) << "run " << run;
  }

  r = run_prepare_data("--text " + text + " --output " + dir.path().string() + " --force", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr(dir.path().string() + ": is a directory, expected a file name"));
}

TEST(PrepareData, RealFashionMnistThroughTheLoader) {
  const std::string source = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(source + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << source << " not installed (Debian package dataset-fashion-mnist)";
  TempDir dir;
  const std::string out = dir.file("fashion_mnist.h5");
  auto r = run_prepare_data("--fashion-mnist --output " + out + " --quiet", dir);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const auto& [split, n] : {std::pair<std::string, int64_t>{"train", 60000}, {"test", 10000}}) {
    auto labels = read_hdf5(out, split + "/labels");
    ASSERT_EQ(labels.str(), "int64[" + std::to_string(n) + "]");
    std::vector<int64_t> counts(10, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t l = labels.data<int64_t>()[i];
      ASSERT_GE(l, 0);
      ASSERT_LT(l, 10);
      ++counts[static_cast<std::size_t>(l)];
    }
    EXPECT_EQ(counts, std::vector<int64_t>(10, n / 10)) << split;
  }
  EXPECT_EQ(root_attribute(out, "num_classes"), 10);

  auto train = std::make_shared<HDF5Dataset>(out, HDF5Fields{{"train/images", "input"}, {"train/labels", "target"}});
  EXPECT_EQ(train->sample_shape("input"), (Shape{1, 28, 28}));
  DeviceLoader loader(train, {.batch_size = 128, .shuffle = true, .seed = 3, .threads = 2, .mark_step = false},
                      {to_float("input"), normalize({0.2860}, {0.3530}, "input"), random_crop({28, 28}, 2, "input"),
                       random_horizontal_flip(0.5, "input")});
  EXPECT_EQ(loader.batches_per_epoch(), 468);
  int k = 0;
  for (auto& b : loader) {
    EXPECT_EQ(b["input"].shape(), (Shape{128, 1, 28, 28}));
    EXPECT_EQ(b["input"].dtype(), DType::Float32);
    EXPECT_EQ(b["target"].shape(), (Shape{128}));
    EXPECT_EQ(b["target"].dtype(), DType::Int64);
    if (++k == 3) break;
  }
}

}  // namespace
}  // namespace loom::data
