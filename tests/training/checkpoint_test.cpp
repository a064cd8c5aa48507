// Checkpoint files directly (loom/checkpoint.h): what is saved comes back, every field; a
// missing, truncated or foreign file is a loom::Error naming it; and a save writes
// "<path>.tmp" and renames it over the last checkpoint, never writing into the file that
// is there (a reader holding the old file keeps the old contents, a failed save keeps it).
#include "temp_dir.h"
#include "test_util.h"

#include <loom/checkpoint.h>
#include <loom/data/hdf5.h>

#include <cmath>
#include <filesystem>
#include <hdf5.h>
#include <fstream>
#include <string>
#include <unistd.h>

namespace loom {
namespace {

namespace fs = std::filesystem;

using test::TempDir;

Checkpoint sample(int64_t step) {
  Checkpoint c;
  c.model = {{"fc.weight", from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
             {"fc.bias", from_vector<double>({0.5, -0.25}, {2})},
             {"bn.num_batches_tracked", scalar_tensor(7, DType::Int64)}};
  c.optimizer = {{"0.momentum_buffer", from_vector<float>({-1, 0, 1, 2, 3, 4}, {2, 3})}};
  c.optimizer_steps = step;
  c.step = step;
  c.epoch = 2;
  c.batch_in_epoch = 5;
  c.seed = 1234;
  c.model_name = "mlp";
  c.options = "--lr 0.1 --batch-size 8";
  return c;
}

TEST(Checkpoint, EveryFieldComesBack) {
  TempDir dir("roundtrip");
  const Checkpoint c = sample(42);
  save_checkpoint(dir / "a.h5", c);
  const Checkpoint back = load_checkpoint(dir / "a.h5");
  EXPECT_EQ(back.step, 42);
  EXPECT_EQ(back.optimizer_steps, 42);
  EXPECT_EQ(back.epoch, 2);
  EXPECT_EQ(back.batch_in_epoch, 5);
  EXPECT_EQ(back.seed, 1234);
  EXPECT_EQ(back.model_name, "mlp");
  EXPECT_EQ(back.options, "--lr 0.1 --batch-size 8");
  ASSERT_EQ(back.model.size(), c.model.size());
  for (std::size_t i = 0; i < c.model.size(); ++i) {
    EXPECT_EQ(back.model[i].first, c.model[i].first);
    EXPECT_EQ(back.model[i].second.dtype(), c.model[i].second.dtype()) << c.model[i].first;
    EXPECT_EQ(back.model[i].second.shape(), c.model[i].second.shape()) << c.model[i].first;
    EXPECT_EQ(back.model[i].second.to_host().bytes, c.model[i].second.to_host().bytes) << c.model[i].first;
  }
  ASSERT_EQ(back.optimizer.size(), 1u);
  EXPECT_EQ(back.optimizer[0].first, "0.momentum_buffer");
  EXPECT_EQ(back.optimizer[0].second.to_vector<float>(), (std::vector<float>{-1, 0, 1, 2, 3, 4}));
  EXPECT_FALSE(fs::exists(checkpoint_temp_path(dir / "a.h5")));
}

// Replaces dataset `path` of `file` with `bytes` as uint8 (a checkpoint's text), or overwrites
// a float32 dataset's values with `values`.
void replace_text(const std::string& file, const std::string& path, const std::string& bytes) {
  std::lock_guard lock(data::hdf5_mutex());
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  H5Ldelete(f, path.c_str(), H5P_DEFAULT);
  const hsize_t n[1] = {bytes.size()};
  hid_t space = H5Screate_simple(1, n, nullptr);
  hid_t ds = H5Dcreate2(f, path.c_str(), H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data());
  H5Dclose(ds);
  H5Sclose(space);
  H5Fclose(f);
}

void overwrite_floats(const std::string& file, const std::string& path, const std::vector<float>& values) {
  std::lock_guard lock(data::hdf5_mutex());
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
  H5Dclose(ds);
  H5Fclose(f);
}

// A key the index cannot hold is refused when saving (the previous file kept); an index that
// does not describe the file's tensors exactly, or a non-finite value, is refused when loading,
// naming the file (a tensor could load in another shape, or be dropped, silently).
TEST(Checkpoint, TheIndexAndTheValuesAreChecked) {
  TempDir dir("index");
  const std::string file = dir / "c.h5";
  save_checkpoint(file, sample(1));
  for (const char* key : {"a b", "a\nmodel x 1", ""}) {
    Checkpoint bad = sample(2);
    bad.model.emplace_back(key, zeros({2}));
    EXPECT_NE(test::error_of([&] { save_checkpoint(file, bad); }).find("the previous checkpoint is kept"),
              std::string::npos);
  }
  EXPECT_EQ(load_checkpoint(file).step, 1);
  const std::string good = "model fc.weight 2 2 3\nmodel fc.bias 1 2\nmodel bn.num_batches_tracked 0\n"
                           "optimizer 0.momentum_buffer 2 2 3\n";
  const std::pair<std::string, std::string> cases[] = {
      {"model fc.weight 2 3 2\n", "model/fc.weight is float32[2,3], the index says [3,2]"},
      {"model fc.weight 2 2 3\nmodel fc.weight 2 2 3\n", "model/fc.weight is in the index twice"},
      {"meta counters 1 8\n", "meta/index line 1 is not '<model|optimizer> <name> <rank> <sizes>'"},
      {"model fc.weight 2 2 -3\n", "meta/index line 1 has no positive size for each of its 2 dimensions"},
      {"model fc.weight 2 2 3 4\n", "meta/index line 1 has more than 2 sizes"},
      {"model fc.weight 99999999999 2 3\n", "is not '<model|optimizer> <name> <rank> <sizes>'"},
  };
  for (const auto& [index, want] : cases) {
    replace_text(file, "meta/index", index);
    const std::string msg = test::error_of([&] { load_checkpoint(file); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
  }
  replace_text(file, "meta/index", good);
  EXPECT_EQ(load_checkpoint(file).model.size(), 3u);
  overwrite_floats(file, "model/fc.weight", {1, 2, std::nanf(""), 4, 5, 6});
  EXPECT_NE(test::error_of([&] { load_checkpoint(file); }).find("model/fc.weight holds a non-finite value at element 2"),
            std::string::npos);
}

TEST(Checkpoint, AMissingFileIsAnErrorNamingIt) {
  TempDir dir("missing");
  EXPECT_EQ(test::error_of([&] { load_checkpoint(dir / "none.h5"); }),
            "load_checkpoint: no such file '" + dir / "none.h5" + "'");
}

TEST(Checkpoint, ATruncatedFileIsAnErrorNamingIt) {
  TempDir dir("truncated");
  save_checkpoint(dir / "a.h5", sample(1));
  const auto size = fs::file_size(dir / "a.h5");
  for (auto keep : {size / 2, size - 8, std::uintmax_t{100}}) {
    fs::copy_file(dir / "a.h5", dir / "cut.h5", fs::copy_options::overwrite_existing);
    fs::resize_file(dir / "cut.h5", keep);
    const std::string msg = test::error_of([&] { load_checkpoint(dir / "cut.h5"); });
    EXPECT_NE(msg.find(dir / "cut.h5"), std::string::npos) << "cut to " << keep << ": " << msg;
  }
}

TEST(Checkpoint, AForeignFileIsAnErrorNamingIt) {
  TempDir dir("foreign");
  {
    std::ofstream text(dir / "notes.h5");
    text << "not an HDF5 file at all\n";
  }
  {
    data::HDF5Writer w(dir / "data.h5");  // HDF5, but no checkpoint in it
    w.write("train/labels", data::HostArray::from_vector<int64_t>({1, 2, 3}, {3}));
    w.close();
  }
  {
    data::HDF5Writer w(dir / "version.h5");  // the layout, from a format version to come
    w.write("meta/counters", data::HostArray::from_vector<int64_t>({4, 0, 0, 0, 0, 0, 0, 0}, {8}));
    w.close();
  }
  for (const char* name : {"notes.h5", "data.h5", "version.h5"}) {
    const std::string msg = test::error_of([&] { load_checkpoint(dir / name); });
    EXPECT_NE(msg.find(dir / name), std::string::npos) << msg;
  }
  EXPECT_EQ(test::error_of([&] { load_checkpoint(dir / "version.h5"); }),
            "load_checkpoint: '" + dir / "version.h5" + "' is not a loom checkpoint (meta/counters)");
}

// The old file is replaced, not rewritten: a second name (hard link) for the old checkpoint
// still reads the old step after the save, which writing into the file would have changed.
TEST(Checkpoint, ASaveWritesATempFileAndRenamesIt) {
  TempDir dir("rename");
  const std::string ck = dir / "run.h5";
  save_checkpoint(ck, sample(1));
  fs::create_hard_link(ck, dir / "old.h5");
  // A stale temp file (a run killed while saving) is overwritten, then renamed away.
  { std::ofstream(checkpoint_temp_path(ck)) << "partial"; }
  save_checkpoint(ck, sample(2));
  EXPECT_EQ(load_checkpoint(ck).step, 2);
  EXPECT_EQ(load_checkpoint(dir / "old.h5").step, 1) << "the save wrote into the old file";
  EXPECT_EQ(fs::hard_link_count(ck), 1u);
  EXPECT_FALSE(fs::exists(checkpoint_temp_path(ck)));
}

// When the temp file cannot be written the last checkpoint stays as it was.
TEST(Checkpoint, AFailedSaveKeepsThePreviousCheckpoint) {
  TempDir dir("failed");
  const std::string ck = dir / "run.h5";
  save_checkpoint(ck, sample(1));
  // A directory where the temp file goes: it cannot be created.
  fs::create_directory(checkpoint_temp_path(ck));
  const std::string msg = test::error_of([&] { save_checkpoint(ck, sample(2)); });
  EXPECT_EQ(msg.rfind("save_checkpoint: '" + ck + "' not written (the previous checkpoint is kept): ", 0), 0u)
      << msg;
  EXPECT_EQ(load_checkpoint(ck).step, 1);
  fs::remove(checkpoint_temp_path(ck));
  EXPECT_EQ(test::error_of([&] { save_checkpoint("", sample(2)); }),
            "save_checkpoint: expected a file name, got an empty one");
}

}  // namespace
}  // namespace loom
