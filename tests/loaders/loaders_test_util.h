// Helpers shared by the loader tests: a temporary directory and HDF5 fixtures written with the
// HDF5 C API directly (independently of loom's own HDF5 code).
#pragma once

#include <loom/data/dataset.h>
#include <loom/data/hdf5.h>

#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace loom::test {

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    auto base = std::filesystem::temp_directory_path();
    std::random_device rd;
    for (;;) {
      path_ = base / ("loom_loaders_" + std::to_string(rd()));
      if (std::filesystem::create_directory(path_)) break;
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// One dataset to write: `type` is an HDF5 file type (H5T_STD_U8LE, ...), `mem_type` the
// native type of `data`; chunk_rows 0 = contiguous.
struct H5Fixture {
  std::string path;
  hid_t type;
  hid_t mem_type;
  std::vector<hsize_t> dims;
  const void* data;
  hsize_t chunk_rows = 0;
  int deflate = 0;
};

// Writes the datasets into a new file (creating groups on the way); fails the test on error.
inline void write_h5(const std::string& file, const std::vector<H5Fixture>& datasets) {
  std::lock_guard lock(data::hdf5_mutex());
  hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0) << file;
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  for (const auto& d : datasets) {
    hid_t space = H5Screate_simple(static_cast<int>(d.dims.size()), d.dims.data(), nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (d.chunk_rows > 0) {
      std::vector<hsize_t> chunk = d.dims;
      chunk[0] = std::min(d.chunk_rows, d.dims[0]);
      H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
      if (d.deflate > 0) H5Pset_deflate(dcpl, static_cast<unsigned>(d.deflate));
    }
    hid_t ds = H5Dcreate2(f, d.path.c_str(), d.type, space, lcpl, dcpl, H5P_DEFAULT);
    EXPECT_GE(ds, 0) << d.path;
    EXPECT_GE(H5Dwrite(ds, d.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, d.data), 0) << d.path;
    H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(space);
  }
  H5Pclose(lcpl);
  ASSERT_GE(H5Fclose(f), 0);
}

// Deterministic uint8 "images" [n, c, h, w]: pixel value = (7*i + 3*k) % 251.
inline std::vector<uint8_t> fake_images(int64_t n, int64_t per_image) {
  std::vector<uint8_t> v(static_cast<std::size_t>(n * per_image));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < per_image; ++k)
      v[static_cast<std::size_t>(i * per_image + k)] = static_cast<uint8_t>((7 * i + 3 * k) % 251);
  return v;
}

inline std::vector<int64_t> fake_labels(int64_t n) {
  std::vector<int64_t> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = (i * 3) % 10;
  return v;
}

// An images/labels file like prepare_data's: images uint8 [n,1,h,w] chunked + compressed.
inline void write_image_file(const std::string& file, int64_t n, int64_t h, int64_t w,
                             hsize_t chunk_rows = 16, int deflate = 4) {
  auto images = fake_images(n, h * w);
  auto labels = fake_labels(n);
  write_h5(file, {{"train/images", H5T_STD_U8LE, H5T_NATIVE_UINT8,
                   {static_cast<hsize_t>(n), 1, static_cast<hsize_t>(h), static_cast<hsize_t>(w)},
                   images.data(), chunk_rows, deflate},
                  {"train/labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {static_cast<hsize_t>(n)},
                   labels.data(), chunk_rows, deflate}});
}

// Overwrites the stored (compressed) bytes of chunk `chunk` of dataset `path` with junk;
// returns the chunk's first row.
inline hsize_t corrupt_chunk(const std::string& file, const std::string& path, hsize_t chunk) {
  hsize_t offset[H5S_MAX_RANK] = {};
  unsigned mask = 0;
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    std::lock_guard lock(data::hdf5_mutex());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
    hid_t space = H5Dget_space(ds);
    EXPECT_GE(H5Dget_chunk_info(ds, space, chunk, offset, &mask, &addr, &size), 0) << file << " " << path;
    H5Sclose(space);
    H5Dclose(ds);
    H5Fclose(f);
  }
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(addr));
  std::string junk(static_cast<std::size_t>(size), '\xA5');
  io.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  return offset[0];
}

}  // namespace loom::test
