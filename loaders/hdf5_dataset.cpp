// HDF5Dataset and read_hdf5: whole-batch reads (one H5Dread per field) under hdf5_mutex().
#include "hdf5_util.h"

#include <loom/data/hdf5.h>

#include <algorithm>
#include <filesystem>

namespace loom::data {

using detail::check;
using detail::Handle;
using detail::Hdf5Lock;

namespace {

std::string quoted_list(const HDF5Fields& fields) {
  std::string s;
  for (const auto& [path, name] : fields) s += (s.empty() ? "'" : ", '") + path + "'";
  return s;
}

// Opens `file` read-only with a clear message for the common failures.
Handle open_file(const std::string& file, const std::string& context) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) throw Error(context + ": no such file");
  if (std::filesystem::is_directory(file, ec)) throw Error(context + ": is a directory, not an HDF5 file");
  if (H5Fis_hdf5(file.c_str()) <= 0) {
    std::string msg = detail::hdf5_error_message();
    throw Error(context + ": not an HDF5 file (or a corrupt one)" + (msg.empty() ? "" : ": " + msg));
  }
  return Handle(check(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), context, "cannot open"));
}

// Opens dataset `path`, checking that it exists and is a dataset.
Handle open_dataset(hid_t file, const std::string& path, hid_t dapl, const std::string& context) {
  if (!detail::path_exists(file, path)) throw Error(context + ": no such dataset in the file");
  Handle obj(check(H5Oopen(file, path.c_str(), H5P_DEFAULT), context, "cannot open object"));
  if (H5Iget_type(obj.get()) != H5I_DATASET)
    throw Error(context + ": is a group, not a dataset");
  obj.reset();
  return Handle(check(H5Dopen2(file, path.c_str(), dapl), context, "cannot open dataset"));
}

struct Layout {
  HostDType dtype;
  std::vector<hsize_t> dims;
};

// Checks the element type and rank of an open dataset.
Layout inspect(hid_t dset, const std::string& context) {
  Handle type(check(H5Dget_type(dset), context, "cannot read the element type"));
  auto dtype = detail::host_dtype_of_h5(type.get());
  if (!dtype)
    throw Error(context + ": unsupported dtype " + detail::h5_type_name(type.get()) +
                " (supported: uint8, int32, int64, float32, float64)");
  Handle space(check(H5Dget_space(dset), context, "cannot read the dataspace"));
  if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE)
    throw Error(context + ": expected an array with a sample dimension, got a scalar or null dataspace");
  int rank = check(H5Sget_simple_extent_ndims(space.get()), context, "cannot read the rank");
  if (rank < 1) throw Error(context + ": expected an array with a sample dimension, got rank 0");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), context, "cannot read the shape");
  return {*dtype, dims};
}

bool is_prime(uint64_t n) {
  if (n < 2) return false;
  for (uint64_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

// A dataset access property list whose chunk cache can hold the whole dataset, up to
// `cache_bytes` (HDF5's default 1 MiB would re-decompress chunks on every shuffled batch).
Handle access_plist(hid_t dset, const Layout& layout, int64_t cache_bytes, const std::string& context) {
  Handle dapl(check(H5Pcreate(H5P_DATASET_ACCESS), context, "cannot create an access list"));
  Handle dcpl(check(H5Dget_create_plist(dset), context, "cannot read the creation list"));
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED || cache_bytes <= 0) return dapl;
  std::vector<hsize_t> chunk(layout.dims.size());
  check(H5Pget_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), context, "cannot read the chunk shape");
  uint64_t chunks = 1, chunk_bytes = host_dtype_size(layout.dtype);
  for (std::size_t d = 0; d < chunk.size(); ++d) {
    chunk_bytes *= chunk[d];
    chunks *= chunk[d] ? (layout.dims[d] + chunk[d] - 1) / chunk[d] : 1;
  }
  const uint64_t bytes = std::min<uint64_t>(chunks * chunk_bytes, static_cast<uint64_t>(cache_bytes));
  const uint64_t held = chunk_bytes ? std::max<uint64_t>(1, bytes / chunk_bytes) : 1;
  uint64_t slots = std::min<uint64_t>(std::max<uint64_t>(521, 10 * held), 1'000'003);
  while (!is_prime(slots)) ++slots;
  check(H5Pset_chunk_cache(dapl.get(), slots, bytes, 0.75), context, "cannot size the chunk cache");
  return dapl;
}

}  // namespace

struct HDF5Dataset::Impl {
  struct Field {
    std::string path, name, context;
    Handle dset;
    HostDType dtype;
    std::vector<hsize_t> dims;
    std::size_t row_bytes = 0;
  };
  Handle file;
  std::vector<Field> fields;
  int64_t size = 0;

  const Field& field(const std::string& name, const std::string& file_name) const {
    for (const auto& f : fields)
      if (f.name == name) return f;
    throw Error("HDF5Dataset: '" + file_name + "' maps no dataset to field '" + name + "'");
  }
};

HDF5Dataset::HDF5Dataset(std::string file, HDF5Fields fields, HDF5DatasetOptions options)
    : file_(std::move(file)), impl_(std::make_unique<Impl>()) {
  const std::string file_context = "HDF5Dataset: '" + file_ + "' (datasets " + quoted_list(fields) + ")";
  if (fields.empty()) throw Error(file_context + ": expected at least one dataset → field mapping");
  for (std::size_t i = 0; i < fields.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (fields[i].second == fields[j].second)
        throw Error(file_context + ": field '" + fields[i].second + "' is mapped twice");
  Hdf5Lock lock;
  try {
    impl_->file = open_file(file_, file_context);
    for (const auto& [path, name] : fields) {
      Impl::Field f;
      f.path = path;
      f.name = name;
      f.context = "HDF5Dataset: '" + file_ + "' dataset '" + path + "'";
      {
        Handle probe = open_dataset(impl_->file.get(), path, H5P_DEFAULT, f.context);
        Layout layout = inspect(probe.get(), f.context);
        Handle dapl = access_plist(probe.get(), layout, options.chunk_cache_bytes, f.context);
        probe.reset();
        f.dset = Handle(check(H5Dopen2(impl_->file.get(), path.c_str(), dapl.get()), f.context, "cannot open dataset"));
        f.dtype = layout.dtype;
        f.dims = layout.dims;
      }
      f.row_bytes = host_dtype_size(f.dtype);
      for (std::size_t d = 1; d < f.dims.size(); ++d) f.row_bytes *= f.dims[d];
      const auto rows = static_cast<int64_t>(f.dims[0]);
      if (impl_->fields.empty()) {
        impl_->size = rows;
      } else if (rows != impl_->size) {
        const auto& first = impl_->fields.front();
        throw Error("HDF5Dataset: '" + file_ + "': datasets have different lengths: '" + first.path +
                    "' has " + std::to_string(impl_->size) + " samples, '" + path + "' has " +
                    std::to_string(rows));
      }
      impl_->fields.push_back(std::move(f));
    }
  } catch (...) {
    impl_.reset();  // closes the handles while the lock is held
    throw;
  }
}

HDF5Dataset::~HDF5Dataset() {
  if (!impl_) return;
  Hdf5Lock lock;
  impl_.reset();
}

int64_t HDF5Dataset::size() const { return impl_->size; }

Shape HDF5Dataset::sample_shape(const std::string& field) const {
  const auto& f = impl_->field(field, file_);
  return Shape(f.dims.begin() + 1, f.dims.end());
}

HostDType HDF5Dataset::dtype(const std::string& field) const { return impl_->field(field, file_).dtype; }

Example HDF5Dataset::get(int64_t index) const {
  const int64_t one[1] = {index};
  return std::move(get_batch(one).front());
}

std::vector<Example> HDF5Dataset::get_batch(std::span<const int64_t> indices) const {
  for (int64_t i : indices)
    if (i < 0 || i >= impl_->size)
      throw Error("HDF5Dataset: '" + file_ + "': sample index " + std::to_string(i) +
                  " out of range [0, " + std::to_string(impl_->size) + ")");
  if (indices.empty()) return {};

  // The distinct rows in file order, as runs of consecutive rows: one hyperslab each.
  std::vector<int64_t> rows(indices.begin(), indices.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<std::pair<hsize_t, hsize_t>> runs;  // (first row, count)
  for (int64_t r : rows) {
    if (!runs.empty() && runs.back().first + runs.back().second == static_cast<hsize_t>(r)) ++runs.back().second;
    else runs.emplace_back(static_cast<hsize_t>(r), 1);
  }

  std::vector<std::vector<unsigned char>> data(impl_->fields.size());
  {
    Hdf5Lock lock;
    for (std::size_t k = 0; k < impl_->fields.size(); ++k) {
      const auto& f = impl_->fields[k];
      const std::size_t rank = f.dims.size();
      Handle fspace(check(H5Dget_space(f.dset.get()), f.context, "cannot read the dataspace"));
      std::vector<hsize_t> start(rank, 0), count = f.dims;
      for (std::size_t r = 0; r < runs.size(); ++r) {
        start[0] = runs[r].first;
        count[0] = runs[r].second;
        check(H5Sselect_hyperslab(fspace.get(), r == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(),
                                  nullptr, count.data(), nullptr),
              f.context, "cannot select rows");
      }
      std::vector<hsize_t> mdims = f.dims;
      mdims[0] = rows.size();
      Handle mspace(check(H5Screate_simple(static_cast<int>(rank), mdims.data(), nullptr), f.context,
                          "cannot create a memory dataspace"));
      data[k].resize(rows.size() * f.row_bytes);
      check(H5Dread(f.dset.get(), detail::native_h5_type(f.dtype), mspace.get(), fspace.get(), H5P_DEFAULT,
                    data[k].data()),
            f.context, "cannot read samples " + std::to_string(rows.front()) + ".." +
                           std::to_string(rows.back()) + " (" + std::to_string(rows.size()) + " rows)");
    }
  }

  std::vector<Example> out(indices.size());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto pos = static_cast<std::size_t>(std::lower_bound(rows.begin(), rows.end(), indices[i]) - rows.begin());
    for (std::size_t k = 0; k < impl_->fields.size(); ++k) {
      const auto& f = impl_->fields[k];
      HostArray a;
      a.dtype = f.dtype;
      a.shape = Shape(f.dims.begin() + 1, f.dims.end());
      a.bytes.assign(data[k].begin() + static_cast<std::ptrdiff_t>(pos * f.row_bytes),
                     data[k].begin() + static_cast<std::ptrdiff_t>((pos + 1) * f.row_bytes));
      out[i][f.name] = std::move(a);
    }
  }
  return out;
}

HostArray read_hdf5(const std::string& file, const std::string& path) {
  const std::string context = "read_hdf5: '" + file + "' dataset '" + path + "'";
  Hdf5Lock lock;
  Handle f = open_file(file, context);
  Handle dset = open_dataset(f.get(), path, H5P_DEFAULT, context);
  Layout layout = inspect(dset.get(), context);
  HostArray out(layout.dtype, Shape(layout.dims.begin(), layout.dims.end()));
  if (!out.bytes.empty())
    check(H5Dread(dset.get(), detail::native_h5_type(layout.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                  out.bytes.data()),
          context, "cannot read");
  return out;
}

}  // namespace loom::data
