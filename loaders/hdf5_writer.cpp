// HDF5Writer: creates datasets (chunked, optionally shuffled + deflated or LZF) and writes rows.
#include "hdf5_util.h"

#include <loom/data/hdf5.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <unistd.h>
#include <vector>

namespace loom::data {

using detail::check;
using detail::Handle;
using detail::Hdf5Lock;

struct HDF5Writer::Impl {
  Handle file;
  std::map<std::string, Handle> datasets;
  std::map<std::string, std::pair<HostDType, Shape>> layouts;
  bool in_memory = false;
};

namespace {

// Writes `bytes` to a new `file` (replacing one), with the system's reason on failure.
void write_whole_file(const std::string& file, const std::vector<char>& bytes, const std::string& context) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(context + ": cannot create: " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string why = n < 0 ? std::strerror(errno) : "nothing written";
      ::close(fd);
      throw Error(context + ": cannot write (" + std::to_string(done) + " of " + std::to_string(bytes.size()) +
                  " bytes written): " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0) throw Error(context + ": cannot close: " + std::strerror(errno));
}

}  // namespace

HDF5Writer::HDF5Writer(std::string file, bool in_memory)
    : file_(std::move(file)), impl_(std::make_unique<Impl>()) {
  const std::string context = "HDF5Writer: '" + file_ + "'";
  Hdf5Lock lock;
  impl_->in_memory = in_memory;
  Handle fapl;
  if (in_memory) {  // HDF5's core driver, without a backing file: close() writes the image
    fapl = Handle(check(H5Pcreate(H5P_FILE_ACCESS), context, "cannot create an access list"));
    check(H5Pset_fapl_core(fapl.get(), std::size_t{1} << 20, 0), context, "cannot select the in-memory driver");
  }
  impl_->file = Handle(check(H5Fcreate(file_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, in_memory ? fapl.get() : H5P_DEFAULT),
                             context, "cannot create"));
}

HDF5Writer::~HDF5Writer() {
  if (!impl_) return;
  Hdf5Lock lock;
  impl_.reset();
}

void HDF5Writer::create(const std::string& path, HostDType dtype, const Shape& shape, HDF5WriteOptions options) {
  const std::string context = "HDF5Writer: '" + file_ + "' dataset '" + path + "'";
  if (!impl_ || !impl_->file) throw Error(context + ": the file is closed");
  if (shape.empty()) throw Error(context + ": expected at least one dimension, got " + shape_str(shape));
  if (dtype == HostDType::Bool) throw Error(context + ": bool is not written (use uint8)");
  if (options.deflate < 0 || options.deflate > 9)
    throw Error(context + ": expected a deflate level 0-9, got " + std::to_string(options.deflate));
  if (options.deflate > 0 && options.lzf) throw Error(context + ": expected deflate or lzf, got both");
  if (impl_->datasets.count(path)) throw Error(context + ": already created");
  Hdf5Lock lock;
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Handle space(check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), context,
                     "cannot create the dataspace"));
  Handle lcpl(check(H5Pcreate(H5P_LINK_CREATE), context, "cannot create a link list"));
  check(H5Pset_create_intermediate_group(lcpl.get(), 1), context, "cannot set intermediate groups");
  Handle dcpl(check(H5Pcreate(H5P_DATASET_CREATE), context, "cannot create a creation list"));
  bool empty = false;
  for (auto d : shape) empty |= d == 0;
  if (options.chunk_rows > 0 && !empty) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = std::min<hsize_t>(dims[0], static_cast<hsize_t>(options.chunk_rows));
    check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), context, "cannot set chunks");
    if (options.deflate > 0 || options.lzf) {
      if (host_dtype_size(dtype) > 1) check(H5Pset_shuffle(dcpl.get()), context, "cannot set the shuffle filter");
      if (options.lzf)  // optional, as h5py sets it: a chunk LZF cannot shrink is stored as it is
        check(H5Pset_filter(dcpl.get(), detail::kLzfFilter, H5Z_FLAG_OPTIONAL, 0, nullptr), context,
              "cannot set the LZF filter");
      else
        check(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(options.deflate)), context, "cannot set deflate");
    }
  } else if ((options.deflate > 0 || options.lzf) && !empty) {
    throw Error(context + ": compression needs chunk_rows > 0");
  }
  Handle dset(check(H5Dcreate2(impl_->file.get(), path.c_str(), detail::file_h5_type(dtype), space.get(),
                               lcpl.get(), dcpl.get(), H5P_DEFAULT),
                    context, "cannot create"));
  impl_->datasets.emplace(path, std::move(dset));
  impl_->layouts.emplace(path, std::make_pair(dtype, shape));
}

void HDF5Writer::write_rows(const std::string& path, int64_t first_row, const HostArray& rows) {
  const std::string context = "HDF5Writer: '" + file_ + "' dataset '" + path + "'";
  if (!impl_ || !impl_->file) throw Error(context + ": the file is closed");
  auto it = impl_->datasets.find(path);
  if (it == impl_->datasets.end()) throw Error(context + ": not created");
  const auto& [dtype, shape] = impl_->layouts.at(path);
  if (rows.dtype != dtype || rows.shape.size() != shape.size() ||
      !std::equal(rows.shape.begin() + 1, rows.shape.end(), shape.begin() + 1) || first_row < 0 ||
      first_row + rows.shape[0] > shape[0])
    throw Error(context + ": cannot write " + rows.str() + " at row " + std::to_string(first_row) + " of " +
                host_dtype_name(dtype) + shape_str(shape));
  if (rows.numel() == 0) return;
  Hdf5Lock lock;
  Handle fspace(check(H5Dget_space(it->second.get()), context, "cannot read the dataspace"));
  std::vector<hsize_t> start(shape.size(), 0), count(rows.shape.begin(), rows.shape.end());
  start[0] = static_cast<hsize_t>(first_row);
  check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr), context,
        "cannot select rows");
  Handle mspace(check(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr), context,
                      "cannot create a memory dataspace"));
  check(H5Dwrite(it->second.get(), detail::native_h5_type(dtype), mspace.get(), fspace.get(), H5P_DEFAULT,
                 rows.bytes.data()),
        context, "cannot write");
}

void HDF5Writer::write(const std::string& path, const HostArray& array, HDF5WriteOptions options) {
  create(path, array.dtype, array.shape, options);
  write_rows(path, 0, array);
}

void HDF5Writer::set_attribute(const std::string& object, const std::string& name, int64_t value) {
  const std::string context = "HDF5Writer: '" + file_ + "' attribute '" + name + "' of '" + object + "'";
  if (!impl_ || !impl_->file) throw Error(context + ": the file is closed");
  Hdf5Lock lock;
  Handle space(check(H5Screate(H5S_SCALAR), context, "cannot create the dataspace"));
  Handle attr(check(H5Acreate_by_name(impl_->file.get(), object.c_str(), name.c_str(), H5T_STD_I64LE, space.get(),
                                      H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    context, "cannot create"));
  check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), context, "cannot write");
}

void HDF5Writer::close() {
  if (!impl_ || !impl_->file) return;
  const std::string context = "HDF5Writer: '" + file_ + "'";
  Hdf5Lock lock;
  for (auto& [path, dset] : impl_->datasets)
    if (dset.close() < 0) detail::throw_hdf5(context + " dataset '" + path + "'", "cannot close");
  impl_->datasets.clear();
  std::vector<char> image;
  if (impl_->in_memory) {
    if (H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL) < 0) detail::throw_hdf5(context, "cannot flush");
    ssize_t size = H5Fget_file_image(impl_->file.get(), nullptr, 0);
    if (size < 0) detail::throw_hdf5(context, "cannot size the file image");
    image.resize(static_cast<std::size_t>(size));
    if (H5Fget_file_image(impl_->file.get(), image.data(), image.size()) < 0)
      detail::throw_hdf5(context, "cannot copy the file image");
  }
  if (impl_->file.close() < 0) detail::throw_hdf5(context, "cannot close (flush)");
  if (impl_->in_memory) write_whole_file(file_, image, context);
}

void sync_to_disk(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0));
  if (fd < 0 || ::fsync(fd) != 0) {
    std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw Error("cannot flush '" + path + "' to the disk: " + why);
  }
  ::close(fd);
}

}  // namespace loom::data
