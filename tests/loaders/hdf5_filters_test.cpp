// HDF5 filters: LZF read from a file h5py wrote (fixtures/lzf_images.h5, made by
// tests/reference/make_lzf_fixture.py) and written by HDF5Writer, and datasets whose filters
// this process lacks refused when opened, naming the filter.
#include "hdf5_util.h"
#include "loaders_test_util.h"
#include "test_util.h"

#include <loom/data/hdf5.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

namespace loom::data {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::StartsWith;
using test::TempDir;

const std::string kFixture = std::string(LOOM_TEST_DATA_DIR) + "/loaders/fixtures/lzf_images.h5";

// The fixture's values (see make_lzf_fixture.py).
uint8_t pixel(int64_t i, int64_t r, int64_t c) { return static_cast<uint8_t>(((5 * i + r) % 16) * 16 + c / 7); }
int64_t label(int64_t i) { return (3 * i + 1) % 10; }

void expect_fixture_sample(const Example& e, int64_t i) {
  const HostArray& image = e.at("input");
  ASSERT_EQ(image.str(), "uint8[1,28,28]");
  for (int64_t r = 0; r < 28; ++r)
    for (int64_t c = 0; c < 28; ++c)
      ASSERT_EQ(image.data<uint8_t>()[r * 28 + c], pixel(i, r, c)) << "sample " << i << " pixel " << r << "," << c;
  EXPECT_EQ(e.at("target").data<int64_t>()[0], label(i)) << "sample " << i;
  ASSERT_EQ(e.at("values").str(), "float32[3]");
  for (int64_t k = 0; k < 3; ++k)
    EXPECT_EQ(e.at("values").data<float>()[k], static_cast<float>(i) + 0.25f * static_cast<float>(k));
}

TEST(HDF5Lzf, ReadsAFileH5pyWrote) {
  for (const auto& options : std::vector<HDF5DatasetOptions>{{}, {.block_cache = false}, {.single_selection = true}}) {
    SCOPED_TRACE("block_cache " + std::to_string(options.block_cache));
    HDF5Dataset ds(kFixture, {{"train/images", "input"}, {"train/labels", "target"}, {"train/values", "values"}},
                   options);
    ASSERT_EQ(ds.size(), 24);
    const std::vector<int64_t> order{23, 0, 9, 8, 17, 16, 7, 15, 3};
    auto batch = ds.get_batch(order);
    for (std::size_t j = 0; j < order.size(); ++j) expect_fixture_sample(batch[j], order[j]);
  }
  HostArray labels = read_hdf5(kFixture, "train/labels");
  ASSERT_EQ(labels.str(), "int64[24]");
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(labels.data<int64_t>()[i], label(i));
}

TEST(HDF5Lzf, CorruptLzfChunkNamesItsRows) {
  TempDir dir;
  const std::string file = dir.file("lzf.h5");
  std::filesystem::copy_file(kFixture, file);
  ASSERT_EQ(test::corrupt_chunk(file, "train/images", 1), 8u);
  hsize_t chunk_bytes = 0;
  {
    std::lock_guard lock(hdf5_mutex());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "train/images", H5P_DEFAULT);
    H5Dget_chunk_storage_size(ds, std::vector<hsize_t>{8, 0, 0, 0}.data(), &chunk_bytes);
    H5Dclose(ds);
    H5Fclose(f);
  }
  HDF5Dataset ds(file, {{"train/images", "input"}, {"train/labels", "target"}});
  EXPECT_EQ(test::error_of([&] { ds.get_batch(std::vector<int64_t>{20, 9, 0}); }),
            "HDF5Dataset: '" + file + "' dataset 'train/images': cannot read samples 8..15: LZF: corrupt data in a "
            "chunk of " + std::to_string(chunk_bytes) + " compressed bytes");
}

// A chunk that decompresses to fewer bytes than its recorded size is corrupt: the rest of the
// chunk would be read from memory nothing wrote.
TEST(HDF5Lzf, AShortChunkIsCorruptNotPartlyUninitialised) {
  TempDir dir;
  const std::string file = dir.file("short.h5");
  std::filesystem::copy_file(kFixture, file);
  {
    std::lock_guard lock(hdf5_mutex());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "train/images", H5P_DEFAULT);
    std::vector<unsigned char> chunk(33, 7);
    chunk[0] = 31;  // an LZF literal run of 32 bytes
    const std::vector<hsize_t> offset{8, 0, 0, 0};
    ASSERT_GE(H5Dwrite_chunk(ds, H5P_DEFAULT, 0, offset.data(), chunk.size(), chunk.data()), 0);
    H5Dclose(ds);
    H5Fclose(f);
  }
  HDF5Dataset ds(file, {{"train/images", "input"}, {"train/labels", "target"}}, {.block_cache = false});
  EXPECT_THAT(test::error_of([&] { ds.get_batch(std::vector<int64_t>{9}); }),
              HasSubstr("LZF: a chunk of 33 compressed bytes decompresses to 32 bytes, not its "));
}

TEST(HDF5Lzf, HDF5WriterWritesLzfAsH5pyDoes) {
  TempDir dir;
  const std::string file = dir.file("w.h5");
  const int64_t n = 40;
  HostArray images(HostDType::UInt8, {n, 1, 28, 28});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < 28; ++r)
      for (int64_t c = 0; c < 28; ++c) images.data<uint8_t>()[(i * 28 + r) * 28 + c] = pixel(i, r, c);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[static_cast<std::size_t>(i)] = label(i);
  HDF5Writer w(file);
  w.write("train/images", images, {.chunk_rows = 16, .lzf = true});
  w.write("train/labels", HostArray::from_vector(labels, {n}), {.chunk_rows = 16, .lzf = true});
  EXPECT_EQ(test::error_of([&] { w.write("x", images, {.chunk_rows = 16, .deflate = 4, .lzf = true}); }),
            "HDF5Writer: '" + file + "' dataset 'x': expected deflate or lzf, got both");
  EXPECT_EQ(test::error_of([&] { w.write("y", images, {.lzf = true}); }),
            "HDF5Writer: '" + file + "' dataset 'y': compression needs chunk_rows > 0");
  w.close();

  {
    // The pipeline h5py writes: filter 32000 "lzf", {revision 4, LZF 1.5, chunk bytes}.
    std::lock_guard lock(hdf5_mutex());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "train/images", H5P_DEFAULT);
    hid_t dcpl = H5Dget_create_plist(ds);
    ASSERT_EQ(H5Pget_nfilters(dcpl), 1);
    unsigned flags = 0, values[3] = {}, config = 0;
    std::size_t count = 3;
    char name[32] = "";
    EXPECT_EQ(H5Pget_filter2(dcpl, 0, &flags, &count, values, sizeof name, name, &config), 32000);
    EXPECT_STREQ(name, "lzf");
    ASSERT_EQ(count, 3u);
    EXPECT_EQ(values[0], 4u);
    EXPECT_EQ(values[1], 0x0105u);
    EXPECT_EQ(values[2], 16u * 28 * 28);
    EXPECT_LT(H5Dget_storage_size(ds), static_cast<hsize_t>(images.bytes.size()) / 2) << "compressed";
    H5Pclose(dcpl);
    H5Dclose(ds);
    H5Fclose(f);
  }
  HDF5Dataset ds(file, {{"train/images", "input"}, {"train/labels", "target"}});
  auto batch = ds.get_batch(std::vector<int64_t>{39, 0, 17});
  EXPECT_EQ(batch[0].at("input").bytes,
            std::vector<unsigned char>(images.bytes.begin() + 39 * 784, images.bytes.begin() + 40 * 784));
  EXPECT_EQ(batch[2].at("target").data<int64_t>()[0], label(17));
}

TEST(HDF5Filters, UnavailableFilterFailsWhenOpenedNamingIt) {
  // Written by h5py with compression=32001 (blosc), which it lacked: no name stored.
  for (const std::string& msg :
       {test::error_of([] { HDF5Dataset(kFixture, {{"train/images", "input"}, {"train/blosc", "ids"}}); }),
        test::error_of([] { read_hdf5(kFixture, "train/blosc"); })}) {
    EXPECT_THAT(msg, MatchesRegex("(HDF5Dataset|read_hdf5): '" + kFixture + "' dataset 'train/blosc': compressed "
                                  "with HDF5 filter 32001 'blosc', which this HDF5 does not have.*"));
    EXPECT_THAT(msg, HasSubstr("; filters available: deflate, shuffle, fletcher32, "));
    EXPECT_THAT(msg, HasSubstr(", lzf"));
  }
}

size_t passthrough(unsigned, std::size_t, const unsigned[], std::size_t nbytes, std::size_t*, void**) {
  return nbytes;
}

TEST(HDF5Filters, StoredFilterNameIsReportedAndHDF5sCauseComesFirst) {
  TempDir dir;
  const std::string file = dir.file("acme.h5");
  // A filter "acme" (id 32099) registered only while writing: the file stores its name.
  static const H5Z_class2_t acme = {H5Z_CLASS_T_VERS, 32099, 1, 1, "acme", nullptr, nullptr, passthrough};
  {
    detail::Hdf5Lock lock;
    ASSERT_GE(H5Zregister(&acme), 0);
    hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t dims[1] = {8}, chunk[1] = {4};
    hid_t space = H5Screate_simple(1, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 1, chunk);
    ASSERT_GE(H5Pset_filter(dcpl, 32099, H5Z_FLAG_MANDATORY, 0, nullptr), 0);
    hid_t ds = H5Dcreate2(f, "x", H5T_STD_I64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    const int64_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Fclose(f);
    ASSERT_GE(H5Zunregister(32099), 0);
  }
  EXPECT_THAT(test::error_of([&] { HDF5Dataset(file, {{"x", "input"}}); }),
              StartsWith("HDF5Dataset: '" + file + "' dataset 'x': compressed with HDF5 filter 32099 'acme', "
                         "which this HDF5 does not have"));
  // Read by HDF5 itself, the stack ends in the plugin loader's failed search: the line that
  // names the filter comes first, the search after it.
  detail::Hdf5Lock lock;
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "x", H5P_DEFAULT);
  int64_t data[8];
  EXPECT_LT(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  const std::string cause = detail::hdf5_error_message();
  H5Dclose(ds);
  H5Fclose(f);
  if (cause != "required filter 'acme' is not registered") {  // else a plugin directory exists, without it
    EXPECT_THAT(cause, MatchesRegex("required filter 'acme' is not registered \\(plugin search: [^()]+\\)"));
  }
}

}  // namespace
}  // namespace loom::data
