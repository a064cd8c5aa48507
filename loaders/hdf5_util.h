// Private helpers for the HDF5 boundary: the process-wide lock, RAII handles, type mapping,
// and turning negative HDF5 statuses into loom::Error. Everything here must be called with
// hdf5_mutex() held (Hdf5Lock).
#pragma once

#include <loom/data/dataset.h>
#include <loom/data/hdf5.h>

#include <hdf5.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::data::detail {

// Holds hdf5_mutex() and keeps HDF5's automatic error printing off (the setting is global
// in Debian's build, per thread in thread-safe builds; setting it costs nothing). The first
// one registers loom's own filters (LZF), before any dataset can be opened.
class Hdf5Lock {
 public:
  Hdf5Lock();

 private:
  std::lock_guard<std::mutex> lock_;
};

// HDF5's innermost error description for the failed call, on one line, "" when the stack is
// empty; clears the stack. Lines from the plugin loader (HDF5's fallback search for a filter
// it lacks) come after the line that says what was missing, in parentheses.
std::string hdf5_error_message();

// Throws loom::Error("<context>: <what>: <HDF5's message>").
[[noreturn]] void throw_hdf5(const std::string& context, const std::string& what);

// Returns `status` (an id or herr_t), throwing throw_hdf5(context, what) when negative.
template <class T>
T check(T status, const std::string& context, const std::string& what) {
  if (status < 0) throw_hdf5(context, what);
  return status;
}

// An HDF5 identifier closed (with the close function for its kind) at scope exit.
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : id_(id) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, -1)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) { reset(); id_ = std::exchange(o.id_, -1); }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t get() const { return id_; }
  explicit operator bool() const { return id_ >= 0; }
  // Closes now; returns the close status (0 when there was nothing to close).
  herr_t close();
  void reset() { close(); }

 private:
  hid_t id_ = -1;
};

// The host dtype for an HDF5 element type, nullopt when loom cannot read it.
std::optional<HostDType> host_dtype_of_h5(hid_t type);
// "int16", "uint32", "float16", "string", "compound", ... for messages.
std::string h5_type_name(hid_t type);
// The native memory type for reading into / writing from a host array.
hid_t native_h5_type(HostDType t);
// The little-endian file type prepare_data writes.
hid_t file_h5_type(HostDType t);

// Registers the LZF filter (h5py's compression="lzf", id 32000) with HDF5; hdf5_lzf.cpp.
inline constexpr H5Z_filter_t kLzfFilter = 32000;
void register_lzf_filter();

// Throws loom::Error naming each filter of the dataset creation list `dcpl` that this process
// cannot decode: its id, its name (the one stored in the file, else the registered one for
// well-known ids) and the filters that are available.
void check_filters(hid_t dcpl, const std::string& context);

// Opens `file` read-only, with a clear message for the common failures (hdf5_open.cpp).
Handle open_file(const std::string& file, const std::string& context);
// Opens dataset `path`, checking that it exists, is a dataset, and that every filter it was
// written with can be decoded here (check_filters).
Handle open_dataset(hid_t file, const std::string& path, hid_t dapl, const std::string& context);

struct Layout {
  HostDType dtype;
  std::vector<hsize_t> dims;
};
// Checks the element type and rank of an open dataset.
Layout inspect(hid_t dset, const std::string& context);

// True when every component of `path` exists in `file` (no HDF5 error on the way).
bool path_exists(hid_t file, const std::string& path);

}  // namespace loom::data::detail
