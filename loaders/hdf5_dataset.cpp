// HDF5Dataset and read_hdf5: whole-batch reads (one H5Dread per field) under hdf5_mutex().
#include "hdf5_util.h"

#include <loom/data/hdf5.h>

#include <algorithm>
#include <filesystem>
#include <mutex>

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

// Rows per cached block: one HDF5 chunk along the sample axis (reading whole chunks is HDF5's
// fast path), or about 1 MiB of rows for contiguous data.
hsize_t block_rows(hid_t dset, std::size_t row_bytes, const std::string& context) {
  Handle dcpl(check(H5Dget_create_plist(dset), context, "cannot read the creation list"));
  if (H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
    const int rank = check(H5Pget_chunk(dcpl.get(), 0, nullptr), context, "cannot read the chunk rank");
    std::vector<hsize_t> chunk(static_cast<std::size_t>(std::max(rank, 1)));
    check(H5Pget_chunk(dcpl.get(), rank, chunk.data()), context, "cannot read the chunk shape");
    if (chunk[0] > 0) return chunk[0];
  }
  return std::max<hsize_t>(1, (hsize_t{1} << 20) / row_bytes);
}

// Selects the rows [first, first + count) of each run in `space` (a union of hyperslabs).
void select_runs(hid_t space, const std::vector<hsize_t>& dims, const std::vector<std::pair<hsize_t, hsize_t>>& runs,
                 const std::string& context) {
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    start[0] = runs[r].first;
    count[0] = runs[r].second;
    check(H5Sselect_hyperslab(space, r == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr, count.data(),
                              nullptr),
          context, "cannot select rows");
  }
}

// Sorted distinct values v as runs of rows [v * scale, min((v + 1) * scale, limit)), merged
// when consecutive: (first row, count).
std::vector<std::pair<hsize_t, hsize_t>> runs_of(const std::vector<int64_t>& sorted, hsize_t scale = 1,
                                                 hsize_t limit = ~hsize_t{0}) {
  std::vector<std::pair<hsize_t, hsize_t>> runs;
  for (int64_t v : sorted) {
    const hsize_t first = static_cast<hsize_t>(v) * scale, count = std::min(scale, limit - first);
    if (!runs.empty() && runs.back().first + runs.back().second == first) runs.back().second += count;
    else runs.emplace_back(first, count);
  }
  return runs;
}

using Block = std::shared_ptr<const std::vector<unsigned char>>;

}  // namespace

struct HDF5Dataset::Impl {
  struct Field {
    std::string path, name, context;
    Handle dset;
    HostDType dtype;
    std::vector<hsize_t> dims;
    std::size_t row_bytes = 0;
    // Decoded blocks of block_rows rows, filled on first use (block_rows 0: not cached).
    hsize_t block_rows = 0;
    std::vector<Block> blocks;  // guarded by Impl::cache_mutex
  };
  Handle file;
  std::vector<Field> fields;
  int64_t size = 0;
  std::mutex cache_mutex;  // never held while taking hdf5_mutex()
  bool single_selection = false;

  // Reads the rows of `runs` (rows in all) with one H5Dread.
  std::vector<unsigned char> read_runs(const Field& f, const std::vector<std::pair<hsize_t, hsize_t>>& runs,
                                       hsize_t rows) const;

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
  impl_->single_selection = options.single_selection;
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
        f.dtype = layout.dtype;
        f.dims = layout.dims;
        f.row_bytes = host_dtype_size(f.dtype);
        for (std::size_t d = 1; d < f.dims.size(); ++d) f.row_bytes *= f.dims[d];
        const uint64_t bytes = f.dims[0] * f.row_bytes;
        Handle dapl;
        if (options.block_cache && f.row_bytes > 0 &&
            bytes <= static_cast<uint64_t>(std::max<int64_t>(0, options.cache_bytes))) {
          f.block_rows = block_rows(probe.get(), f.row_bytes, f.context);
          f.blocks.resize(static_cast<std::size_t>((f.dims[0] + f.block_rows - 1) / f.block_rows));
        } else {
          dapl = access_plist(probe.get(), layout, options.cache_bytes, f.context);
        }
        probe.reset();
        f.dset = Handle(check(H5Dopen2(impl_->file.get(), path.c_str(), dapl ? dapl.get() : H5P_DEFAULT), f.context,
                              "cannot open dataset"));
      }
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

  // The distinct rows in file order.
  std::vector<int64_t> rows(indices.begin(), indices.end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());

  std::vector<Example> out(indices.size());
  for (auto& f : impl_->fields) {
    const Shape sample_shape(f.dims.begin() + 1, f.dims.end());
    auto put = [&](std::size_t i, const unsigned char* row) {
      HostArray a;
      a.dtype = f.dtype;
      a.shape = sample_shape;
      a.bytes.assign(row, row + f.row_bytes);
      out[i][f.name] = std::move(a);
    };
    if (f.block_rows == 0) {
      // Not cached: one union of row hyperslabs, then rows into the requested order.
      const std::vector<unsigned char> data = impl_->read_runs(f, runs_of(rows), rows.size());
      for (std::size_t i = 0; i < indices.size(); ++i) {
        const auto pos = static_cast<std::size_t>(std::lower_bound(rows.begin(), rows.end(), indices[i]) - rows.begin());
        put(i, data.data() + pos * f.row_bytes);
      }
      continue;
    }
    // Cached: the blocks this batch needs; the missing ones are read with one H5Dread.
    std::vector<int64_t> needed;
    for (int64_t r : rows) {
      const auto b = static_cast<int64_t>(static_cast<hsize_t>(r) / f.block_rows);
      if (needed.empty() || needed.back() != b) needed.push_back(b);
    }
    std::vector<Block> held(f.blocks.size());
    std::vector<int64_t> missing;
    {
      std::lock_guard lock(impl_->cache_mutex);
      for (int64_t b : needed) {
        held[static_cast<std::size_t>(b)] = f.blocks[static_cast<std::size_t>(b)];
        if (!held[static_cast<std::size_t>(b)]) missing.push_back(b);
      }
    }
    if (!missing.empty()) {
      const auto runs = runs_of(missing, f.block_rows, f.dims[0]);
      hsize_t total = 0;
      for (const auto& r : runs) total += r.second;
      const std::vector<unsigned char> data = impl_->read_runs(f, runs, total);
      std::lock_guard lock(impl_->cache_mutex);
      std::size_t offset = 0;
      for (int64_t b : missing) {
        const hsize_t first = static_cast<hsize_t>(b) * f.block_rows;
        const std::size_t n = std::min(f.block_rows, f.dims[0] - first) * f.row_bytes;
        auto& slot = f.blocks[static_cast<std::size_t>(b)];
        if (!slot)  // else another thread filled it meanwhile; the contents are the same
          slot = std::make_shared<const std::vector<unsigned char>>(data.begin() + static_cast<std::ptrdiff_t>(offset),
                                                                    data.begin() + static_cast<std::ptrdiff_t>(offset + n));
        held[static_cast<std::size_t>(b)] = slot;
        offset += n;
      }
    }
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const auto r = static_cast<hsize_t>(indices[i]);
      put(i, held[r / f.block_rows]->data() + (r % f.block_rows) * f.row_bytes);
    }
  }
  return out;
}

std::vector<unsigned char> HDF5Dataset::Impl::read_runs(const Field& f,
                                                        const std::vector<std::pair<hsize_t, hsize_t>>& runs,
                                                        hsize_t rows) const {
  std::vector<unsigned char> data(rows * f.row_bytes);
  const std::string what = "cannot read rows " + std::to_string(runs.front().first) + ".." +
                           std::to_string(runs.back().first + runs.back().second - 1) + " (" +
                           std::to_string(rows) + " rows in " + std::to_string(runs.size()) + " runs)";
  const hid_t type = detail::native_h5_type(f.dtype);
  Hdf5Lock lock;
  Handle fspace(check(H5Dget_space(f.dset.get()), f.context, "cannot read the dataspace"));
  std::vector<hsize_t> mdims = f.dims;
  if (single_selection || runs.size() == 1) {
    select_runs(fspace.get(), f.dims, runs, f.context);
    mdims[0] = rows;
    Handle mspace(check(H5Screate_simple(static_cast<int>(mdims.size()), mdims.data(), nullptr), f.context,
                        "cannot create a memory dataspace"));
    check(H5Dread(f.dset.get(), type, mspace.get(), fspace.get(), H5P_DEFAULT, data.data()), f.context, what);
    return data;
  }
  // One regular hyperslab per run: HDF5 1.10 reads a union of hyperslabs (an irregular
  // selection) 10-35x slower than the same rows as separate regular ones.
  std::size_t offset = 0;
  for (const auto& run : runs) {
    select_runs(fspace.get(), f.dims, {run}, f.context);
    mdims[0] = run.second;
    Handle mspace(check(H5Screate_simple(static_cast<int>(mdims.size()), mdims.data(), nullptr), f.context,
                        "cannot create a memory dataspace"));
    check(H5Dread(f.dset.get(), type, mspace.get(), fspace.get(), H5P_DEFAULT, data.data() + offset), f.context, what);
    offset += run.second * f.row_bytes;
  }
  return data;
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
