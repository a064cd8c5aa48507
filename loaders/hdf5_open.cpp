// Opening HDF5 files and datasets for reading, each way it can fail with its own message, and
// read_hdf5.
#include "hdf5_util.h"

#include <loom/data/hdf5.h>

#include <cstdint>
#include <filesystem>
#include <new>

namespace loom::data {

using detail::check;
using detail::Handle;
using detail::Hdf5Lock;

namespace detail {

Handle open_file(const std::string& file, const std::string& context) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) throw Error(context + ": no such file");
  if (std::filesystem::is_directory(file, ec)) throw Error(context + ": is a directory, not an HDF5 file");
  if (H5Fis_hdf5(file.c_str()) <= 0) {
    std::string msg = hdf5_error_message();
    throw Error(context + ": not an HDF5 file (or a corrupt one)" + (msg.empty() ? "" : ": " + msg));
  }
  return Handle(check(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), context, "cannot open"));
}

Handle open_dataset(hid_t file, const std::string& path, hid_t dapl, const std::string& context) {
  if (!path_exists(file, path)) throw Error(context + ": no such dataset in the file");
  Handle obj(check(H5Oopen(file, path.c_str(), H5P_DEFAULT), context, "cannot open object"));
  if (H5Iget_type(obj.get()) != H5I_DATASET)
    throw Error(context + ": is a group, not a dataset");
  obj.reset();
  Handle dset(check(H5Dopen2(file, path.c_str(), dapl), context, "cannot open dataset"));
  // A missing filter would otherwise surface at the first read of a chunk, mid-epoch.
  Handle dcpl(check(H5Dget_create_plist(dset.get()), context, "cannot read the creation list"));
  check_filters(dcpl.get(), context);
  return dset;
}

Layout inspect(hid_t dset, const std::string& context) {
  Handle type(check(H5Dget_type(dset), context, "cannot read the element type"));
  auto dtype = host_dtype_of_h5(type.get());
  if (!dtype)
    throw Error(context + ": unsupported dtype " + h5_type_name(type.get()) +
                " (supported: uint8, int32, int64, float32, float64)");
  Handle space(check(H5Dget_space(dset), context, "cannot read the dataspace"));
  if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE)
    throw Error(context + ": expected an array with a sample dimension, got a scalar or null dataspace");
  int rank = check(H5Sget_simple_extent_ndims(space.get()), context, "cannot read the rank");
  if (rank < 1) throw Error(context + ": expected an array with a sample dimension, got rank 0");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), context, "cannot read the shape");
  // Sizes are int64 from here on, and byte counts 64-bit: a shape past them is refused here,
  // not wrapped into a smaller array than the file's.
  uint64_t bytes = host_dtype_size(*dtype);
  for (auto d : dims)
    if (d > static_cast<hsize_t>(INT64_MAX) || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) ||
        bytes > static_cast<uint64_t>(INT64_MAX)) {
      std::string msg = context;
      msg += ": its shape [";
      for (std::size_t i = 0; i < dims.size(); ++i) {
        if (i) msg += ',';
        msg += std::to_string(dims[i]);
      }
      msg += "] is more bytes than a 64-bit size counts";
      throw Error(msg);
    }
  // Storage that lives elsewhere reads as fill values where it is missing, silently.
  Handle dcpl(check(H5Dget_create_plist(dset), context, "cannot read the creation list"));
  if (H5Pget_layout(dcpl.get()) == H5D_VIRTUAL)
    throw Error(context + ": is a virtual dataset, which loom does not read (its missing sources would read as "
                "fill values); copy it into a plain one (h5repack)");
  if (H5Pget_external_count(dcpl.get()) > 0)
    throw Error(context + ": keeps its data in external raw files, which loom does not read (a short file "
                "would read as fill values); copy it into the HDF5 file (h5repack)");
  return {*dtype, dims};
}

}  // namespace detail

HostArray read_hdf5(const std::string& file, const std::string& path) {
  const std::string context = "read_hdf5: '" + file + "' dataset '" + path + "'";
  Hdf5Lock lock;
  Handle f = detail::open_file(file, context);
  Handle dset = detail::open_dataset(f.get(), path, H5P_DEFAULT, context);
  detail::Layout layout = detail::inspect(dset.get(), context);
  HostArray out;
  try {
    out = HostArray(layout.dtype, Shape(layout.dims.begin(), layout.dims.end()));
  } catch (const std::bad_alloc&) {
    throw Error(context + ": its " + std::to_string(shape_numel(Shape(layout.dims.begin(), layout.dims.end()))) +
                " values do not fit in memory");
  }
  if (!out.bytes.empty())
    check(H5Dread(dset.get(), detail::native_h5_type(layout.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                  out.bytes.data()),
          context, "cannot read");
  return out;
}

}  // namespace loom::data
