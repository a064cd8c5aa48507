// HDF5Dataset: layouts and dtypes, whole-batch reads in any order, the writer, and every error
// naming the file and the dataset: bad labels before any read, the rows a corrupt chunk holds.
#include "loaders_test_util.h"
#include "test_util.h"

#include <loom/data/hdf5.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace loom::data {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using test::TempDir;

struct Layout {
  hsize_t chunk_rows;
  int deflate;
};

class HDF5Layouts : public ::testing::TestWithParam<Layout> {};

TEST_P(HDF5Layouts, ReadsEveryDtypeAndRankInRequestedOrder) {
  TempDir dir;
  const std::string file = dir.file("all.h5");
  const int64_t n = 37;
  auto images = test::fake_images(n, 2 * 3 * 4);
  std::vector<int32_t> i32(n * 2);
  std::vector<int64_t> i64(n);
  std::vector<float> f32(n * 5);
  std::vector<double> f64(n);
  for (int64_t i = 0; i < n; ++i) {
    i32[i * 2] = static_cast<int32_t>(-i);
    i32[i * 2 + 1] = static_cast<int32_t>(i * 100);
    i64[i] = i * 1'000'000'007LL;
    for (int k = 0; k < 5; ++k) f32[i * 5 + k] = static_cast<float>(i) + 0.1f * static_cast<float>(k);
    f64[i] = 1.0 / static_cast<double>(i + 1);
  }
  const auto [chunk, deflate] = GetParam();
  test::write_h5(file, {{"g/images", H5T_STD_U8LE, H5T_NATIVE_UINT8, {n, 2, 3, 4}, images.data(), chunk, deflate},
                        {"g/i32", H5T_STD_I32BE, H5T_NATIVE_INT32, {n, 2}, i32.data(), chunk, deflate},
                        {"i64", H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, i64.data(), chunk, deflate},
                        {"deep/er/f32", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n, 5}, f32.data(), chunk, deflate},
                        {"f64", H5T_IEEE_F64BE, H5T_NATIVE_DOUBLE, {n}, f64.data(), chunk, deflate}});
  const std::vector<HDF5DatasetOptions> variants{{},
                                                 {.single_selection = true},
                                                 {.block_cache = false},
                                                 {.block_cache = false, .single_selection = true},
                                                 {.cache_bytes = 0}};
  for (const auto& options : variants) {
    SCOPED_TRACE("cache_bytes " + std::to_string(options.cache_bytes) + " block_cache " +
                 std::to_string(options.block_cache) + " single_selection " + std::to_string(options.single_selection));
    HDF5Dataset ds(file, {{"g/images", "input"}, {"g/i32", "a"}, {"i64", "b"}, {"deep/er/f32", "c"}, {"f64", "d"}},
                   options);
    ASSERT_EQ(ds.size(), n);
    EXPECT_EQ(ds.sample_shape("input"), (Shape{2, 3, 4}));
    EXPECT_EQ(ds.dtype("input"), HostDType::UInt8);
    EXPECT_EQ(ds.dtype("a"), HostDType::Int32);
    EXPECT_EQ(ds.dtype("d"), HostDType::Float64);

    const std::vector<int64_t> order{36, 3, 4, 5, 0, 3, 20, 19, 36, 1};
    auto batch = ds.get_batch(order);
    ASSERT_EQ(batch.size(), order.size());
    for (std::size_t j = 0; j < order.size(); ++j) {
      const int64_t i = order[j];
      const Example& e = batch[j];
      ASSERT_EQ(e.at("input").shape, (Shape{2, 3, 4}));
      EXPECT_TRUE(std::equal(e.at("input").bytes.begin(), e.at("input").bytes.end(), images.begin() + i * 24));
      EXPECT_EQ(e.at("a").data<int32_t>()[0], -i);
      EXPECT_EQ(e.at("a").data<int32_t>()[1], i * 100);
      EXPECT_EQ(e.at("b").shape, Shape{});
      EXPECT_EQ(e.at("b").data<int64_t>()[0], i * 1'000'000'007LL);
      EXPECT_FLOAT_EQ(e.at("c").data<float>()[4], static_cast<float>(i) + 0.4f);
      EXPECT_DOUBLE_EQ(e.at("d").data<double>()[0], 1.0 / static_cast<double>(i + 1));
    }
    EXPECT_EQ(ds.get(7).at("b").data<int64_t>()[0], 7 * 1'000'000'007LL);
    EXPECT_THAT(test::error_of([&] { ds.get(n); }), AllOf(HasSubstr(file), HasSubstr("out of range")));
    EXPECT_EQ(ds.get_batch(order)[3].at("input").bytes, batch[3].at("input").bytes) << "served again (from the cache)";
  }

  auto whole = read_hdf5(file, "deep/er/f32");
  EXPECT_EQ(whole.str(), "float32[37,5]");
  EXPECT_EQ(whole.data<float>()[5 * 3 + 2], f32[5 * 3 + 2]);
}

INSTANTIATE_TEST_SUITE_P(Layouts, HDF5Layouts,
                         ::testing::Values(Layout{0, 0}, Layout{8, 0}, Layout{5, 6}, Layout{64, 1}),
                         [](const auto& info) {
                           return info.param.chunk_rows == 0 ? std::string("contiguous")
                                                             : "chunk" + std::to_string(info.param.chunk_rows) +
                                                                   "_deflate" + std::to_string(info.param.deflate);
                         });

TEST(HDF5Writer, RoundTripsWithLoomsReader) {
  TempDir dir;
  const std::string file = dir.file("w.h5");
  HDF5Writer w(file);
  w.create("train/images", HostDType::UInt8, {10, 1, 2, 2}, {.chunk_rows = 4, .deflate = 5});
  auto px = test::fake_images(10, 4);
  HostArray first(HostDType::UInt8, {6, 1, 2, 2}), rest(HostDType::UInt8, {4, 1, 2, 2});
  std::copy(px.begin(), px.begin() + 24, first.bytes.begin());
  std::copy(px.begin() + 24, px.end(), rest.bytes.begin());
  w.write_rows("train/images", 6, rest);
  w.write_rows("train/images", 0, first);
  w.write("train/labels", HostArray::from_vector<int64_t>(test::fake_labels(10), {10}), {.chunk_rows = 4});
  w.set_attribute("/", "num_classes", 10);
  EXPECT_THAT(test::error_of([&] { w.write_rows("train/images", 8, rest); }), HasSubstr("cannot write uint8[4,1,2,2] at row 8"));
  w.close();

  HDF5Dataset ds(file, {{"train/images", "input"}, {"train/labels", "target"}});
  EXPECT_EQ(ds.size(), 10);
  EXPECT_EQ(ds.get(9).at("input").bytes, std::vector<unsigned char>(px.begin() + 36, px.end()));
  EXPECT_EQ(ds.get(9).at("target").data<int64_t>()[0], 7);
  std::lock_guard lock(hdf5_mutex());
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t attr = H5Aopen(f, "num_classes", H5P_DEFAULT);
  ASSERT_GE(attr, 0);
  int64_t classes = 0;
  H5Aread(attr, H5T_NATIVE_INT64, &classes);
  EXPECT_EQ(classes, 10);
  H5Aclose(attr);
  H5Fclose(f);
}

// ---- errors: each names the file and the dataset ----

TEST(HDF5Errors, MissingFile) {
  TempDir dir;
  const std::string file = dir.file("nope.h5");
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"train/images", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("train/images"), HasSubstr("no such file")));
}

TEST(HDF5Errors, NotAnHDF5File) {
  TempDir dir;
  const std::string file = dir.file("text.h5");
  std::ofstream(file) << "just some text, not HDF5\n";
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"train/images", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("train/images"), HasSubstr("not an HDF5 file")));
}

TEST(HDF5Errors, MissingDatasetPathAndGroupInsteadOfDataset) {
  TempDir dir;
  const std::string file = dir.file("d.h5");
  test::write_image_file(file, 10, 2, 2);
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"train/images", "input"}, {"train/imagez", "x"}}); }),
              AllOf(HasSubstr(file), HasSubstr("dataset 'train/imagez'"), HasSubstr("no such dataset")));
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"nowhere/images", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("nowhere/images"), HasSubstr("no such dataset")));
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"train", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("dataset 'train'"), HasSubstr("is a group")));
  EXPECT_THAT(test::error_of([&] { read_hdf5(file, "train/nothing"); }),
              AllOf(HasSubstr(file), HasSubstr("train/nothing")));
}

TEST(HDF5Errors, ImagesAndLabelsOfDifferentLengths) {
  TempDir dir;
  const std::string file = dir.file("len.h5");
  auto images = test::fake_images(10, 4);
  auto labels = test::fake_labels(9);
  test::write_h5(file, {{"train/images", H5T_STD_U8LE, H5T_NATIVE_UINT8, {10, 1, 2, 2}, images.data()},
                        {"train/labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {9}, labels.data()}});
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"train/images", "input"}, {"train/labels", "target"}}); }),
              AllOf(HasSubstr(file), HasSubstr("different lengths"), HasSubstr("'train/images' has 10"),
                    HasSubstr("'train/labels' has 9")));
}

TEST(HDF5Errors, UnsupportedDtypeAndRank) {
  TempDir dir;
  const std::string file = dir.file("dtype.h5");
  std::vector<int16_t> shorts(12);
  std::vector<uint32_t> words(12);
  int64_t scalar = 5;
  test::write_h5(file, {{"x/shorts", H5T_STD_I16LE, H5T_NATIVE_INT16, {12}, shorts.data()},
                        {"x/words", H5T_STD_U32LE, H5T_NATIVE_UINT32, {12}, words.data()}});
  {
    // A scalar dataset, which has no sample dimension.
    std::lock_guard lock(hdf5_mutex());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t ds = H5Dcreate2(f, "x/scalar", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &scalar);
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(f);
  }
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"x/shorts", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("x/shorts"), HasSubstr("unsupported dtype int16")));
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"x/words", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("x/words"), HasSubstr("unsupported dtype uint32")));
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"x/scalar", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("x/scalar"), HasSubstr("sample dimension")));
}

// A shape whose bytes a 64-bit size cannot count (a sparse chunked dataset is a few bytes on
// disk), and data kept in external raw files, are refused naming the file and the dataset.
TEST(HDF5Errors, HugeShapesAndExternalStorage) {
  TempDir dir;
  const std::string file = dir.file("odd.h5");
  {
    std::lock_guard lock(hdf5_mutex());
    hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t huge[1] = {hsize_t{1} << 61}, chunk[1] = {1024};
    hid_t space = H5Screate_simple(1, huge, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    H5Dclose(H5Dcreate2(f, "huge", H5T_STD_I64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(space);
    const hsize_t ten[1] = {10};
    space = H5Screate_simple(1, ten, nullptr);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_external(dcpl, (dir.path() / "raw.bin").c_str(), 0, 40);
    H5Dclose(H5Dcreate2(f, "external", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
  }
  EXPECT_THAT(test::error_of([&] { read_hdf5(file, "huge"); }),
              AllOf(HasSubstr(file), HasSubstr("'huge'"), HasSubstr("more bytes than a 64-bit size counts")));
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"huge", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("more bytes than a 64-bit size counts")));
  EXPECT_THAT(test::error_of([&] { read_hdf5(file, "external"); }),
              AllOf(HasSubstr(file), HasSubstr("'external'"), HasSubstr("external raw files")));
  EXPECT_THAT(test::error_of([] { HostArray(HostDType::Int64, {int64_t{1} << 61}); }),
              HasSubstr("more bytes than a 64-bit size counts"));
}

TEST(HDF5Errors, TruncatedFile) {
  TempDir dir;
  const std::string file = dir.file("trunc.h5");
  test::write_image_file(file, 200, 8, 8, /*chunk_rows=*/16, /*deflate=*/0);
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"train/images", "input"}, {"train/labels", "target"}}); }),
              AllOf(HasSubstr(file), HasSubstr("train/images")));
  std::filesystem::resize_file(file, 100);  // not even a whole superblock
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"train/images", "input"}}); }),
              AllOf(HasSubstr(file), HasSubstr("train/images")));
}

TEST(HDF5Errors, CorruptChunkNamesTheRowsThatCannotBeRead) {
  TempDir dir;
  const std::string file = dir.file("corrupt.h5");
  test::write_image_file(file, 128, 8, 8, /*chunk_rows=*/16, /*deflate=*/6);
  ASSERT_EQ(test::corrupt_chunk(file, "train/images", 4), 64u);  // rows 64-79
  const std::string prefix = "HDF5Dataset: '" + file + "' dataset 'train/images': cannot read samples ";
  struct Case {
    HDF5DatasetOptions options;
    std::string rows;  // cached: a whole chunk (block) is decoded or not; uncached: rows
  };
  for (const auto& [options, rows] : std::vector<Case>{{{}, "64..79"},
                                                       {{.single_selection = true}, "64..79"},
                                                       {{.block_cache = false}, "70"},
                                                       {{.block_cache = false, .single_selection = true}, "70"}}) {
    SCOPED_TRACE("block_cache " + std::to_string(options.block_cache) + " single_selection " +
                 std::to_string(options.single_selection));
    HDF5Dataset ds(file, {{"train/images", "input"}, {"train/labels", "target"}}, options);
    // Chunks 0, 4 and 7 (one read of three runs, or of one selection), only chunk 4 corrupt.
    EXPECT_EQ(test::error_of([&] { ds.get_batch(std::vector<int64_t>{127, 70, 0, 3}); }),
              prefix + rows + ": inflate() failed");
    EXPECT_EQ(ds.get_batch(std::vector<int64_t>{127, 0, 3, 80}).size(), 4u) << "the other chunks still read";
  }
}

TEST(HDF5Ranges, LabelsOutOfRangeFailAtConstructionNamingSampleAndValue) {
  TempDir dir;
  const std::string file = dir.file("labels.h5");
  const int64_t n = 40;
  auto images = test::fake_images(n, 4);
  auto labels = test::fake_labels(n);
  labels[17] = 12;
  labels[30] = -1;
  std::vector<int32_t> labels32(labels.begin(), labels.end());
  std::vector<float> float_labels(n, 1.0f);
  std::vector<int64_t> pairs(2 * n, 1);
  pairs[2 * 9 + 1] = 10;
  test::write_h5(file, {{"test/images", H5T_STD_U8LE, H5T_NATIVE_UINT8, {n, 1, 2, 2}, images.data(), 8, 4},
                        {"test/labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, labels.data(), 8, 4},
                        {"test/labels32", H5T_STD_I32BE, H5T_NATIVE_INT32, {n}, labels32.data()},
                        {"test/float_labels", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n}, float_labels.data()},
                        {"test/pairs", H5T_STD_I64LE, H5T_NATIVE_INT64, {n, 2}, pairs.data(), 8, 0}});
  const ValueRange classes{0, 10, "a class"};
  const std::map<std::string, ValueRange> target{{"target", classes}};
  auto error = [&](const std::string& labels_path, const HDF5DatasetOptions& options) {
    return test::error_of([&] { HDF5Dataset(file, {{"test/images", "input"}, {labels_path, "target"}}, options); });
  };
  const std::string want = "HDF5Dataset: '" + file + "' dataset 'test/labels': sample 17 is 12, expected a class in " +
                           "[0, 10) (out of range: 2 of 40 samples)";
  EXPECT_EQ(error("test/labels", {.ranges = target}), want) << "cached, blocks of 8 rows";
  EXPECT_EQ(error("test/labels", {.block_cache = false, .ranges = target}), want) << "read through HDF5";
  EXPECT_EQ(error("test/labels32", {.ranges = target}),
            "HDF5Dataset: '" + file + "' dataset 'test/labels32': sample 17 is 12, expected a class in [0, 10) " +
                "(out of range: 2 of 40 samples)");
  EXPECT_NO_THROW(HDF5Dataset(file, {{"test/labels", "target"}}, {.ranges = {{"target", {-1, 13, "a class"}}}}));
  EXPECT_EQ(error("test/float_labels", {.ranges = target}),
            "HDF5Dataset: '" + file + "' dataset 'test/float_labels': expected integers (a class in [0, 10)), " +
                "got float32 values");
  EXPECT_EQ(error("test/pairs", {.ranges = target}),
            "HDF5Dataset: '" + file + "' dataset 'test/pairs': sample 9 element 1 is 10, expected a class in " +
                "[0, 10) (out of range: 1 of 80 values)");
  EXPECT_EQ(error("test/labels", {.ranges = {{"label", classes}}}),
            "HDF5Dataset: '" + file + "' (datasets 'test/images', 'test/labels'): a value range is given for " +
                "field 'label', which no dataset maps to");

  // In range: the checked column is served as usual.
  labels[17] = 7;
  labels[30] = 0;
  const std::string good = dir.file("good.h5");
  test::write_h5(good, {{"test/labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {n}, labels.data(), 8, 4}});
  HDF5Dataset ds(good, {{"test/labels", "target"}}, {.ranges = target});
  EXPECT_EQ(ds.get(17).at("target").data<int64_t>()[0], 7);
  EXPECT_EQ(ds.source(), good + " test/labels");
}

TEST(HDF5Writer, ErrorsAreOneLineWithHDF5sCause) {
  const std::string missing_dir = test::error_of([] { HDF5Writer("/nonexistent/dir/out.h5"); });
  EXPECT_THAT(missing_dir, StartsWith("HDF5Writer: '/nonexistent/dir/out.h5': cannot create: unable to open file: "
                                      "name = '/nonexistent/dir/out.h5', errno = 2, error message = 'No such file "
                                      "or directory'"));
  // HDF5 writes the time of a failed write with ctime(), which ends in a newline.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full to fill";
  const std::string full = test::error_of([] { HDF5Writer("/dev/full"); });
  EXPECT_THAT(full, StartsWith("HDF5Writer: '/dev/full': cannot create: file write failed: time = "));
  EXPECT_THAT(full, HasSubstr(", filename = '/dev/full', file descriptor = "));
  EXPECT_THAT(full, HasSubstr("errno = 28, error message = 'No space left on device'"));
  EXPECT_EQ(full.find('\n'), std::string::npos) << full;
}

}  // namespace
}  // namespace loom::data
