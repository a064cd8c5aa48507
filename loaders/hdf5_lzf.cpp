// The LZF filter (liblzf) under the id and parameters h5py uses for compression="lzf", so files
// written from Python read as any other; HDF5 itself has no LZF, and Debian ships no plugin.
//
// Parameters (cd_values), as h5py stores them: {filter revision, LZF API version, uncompressed
// chunk bytes}. The chunk size, when present and non-zero, sizes the decompression buffer;
// otherwise the buffer starts at the compressed size and doubles until the chunk fits.
// Compression that would not shrink a chunk fails, and HDF5 then stores that chunk as it is
// (the filter is optional in the pipeline, as h5py sets it).
#include "hdf5_util.h"

#include <loom/error.h>

#include <lzf.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace loom::data::detail {
namespace {

constexpr unsigned kFilterRevision = 4;  // h5py's, so h5py reads our files as its own
constexpr std::size_t kMaxChunkBytes = std::size_t{1} << 32;  // HDF5 chunks are below 4 GiB

// Records the chunk size in bytes in cd_values[2] when the dataset is created.
herr_t set_local(hid_t dcpl, hid_t type, hid_t /*space*/) {
  unsigned flags = 0;
  std::size_t n = 3;
  unsigned values[3] = {0, 0, 0};
  if (H5Pget_filter_by_id2(dcpl, kLzfFilter, &flags, &n, values, 0, nullptr, nullptr) < 0) return -1;
  const int rank = H5Pget_chunk(dcpl, 0, nullptr);
  if (rank <= 0) return -1;
  hsize_t chunk[H5S_MAX_RANK];
  if (H5Pget_chunk(dcpl, rank, chunk) < 0) return -1;
  std::size_t bytes = H5Tget_size(type);
  if (bytes == 0) return -1;
  for (int d = 0; d < rank; ++d) bytes *= static_cast<std::size_t>(chunk[d]);
  values[0] = kFilterRevision;
  values[1] = LZF_VERSION;
  values[2] = bytes < kMaxChunkBytes ? static_cast<unsigned>(bytes) : 0;
  return H5Pmodify_filter(dcpl, kLzfFilter, flags, 3, values);
}

// HDF5's filter callback: compresses or (H5Z_FLAG_REVERSE) decompresses *buf in place,
// returning the new size in bytes, or 0 on failure (the buffer then stays HDF5's).
std::size_t filter(unsigned flags, std::size_t cd_nelmts, const unsigned cd_values[], std::size_t nbytes,
                   std::size_t* buf_size, void** buf) {
  if (nbytes == 0 || nbytes >= kMaxChunkBytes) return 0;
  const auto in_len = static_cast<unsigned>(nbytes);
  if (!(flags & H5Z_FLAG_REVERSE)) {
    // Keep only a real gain: at most nbytes - 1 bytes of output.
    void* out = H5allocate_memory(nbytes, false);
    if (!out) return 0;
    const unsigned n = lzf_compress(*buf, in_len, out, in_len - 1);
    if (n == 0) {
      H5free_memory(out);
      return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = nbytes;
    return n;
  }
  const bool size_known = cd_nelmts >= 3 && cd_values[2] != 0;
  std::size_t size = size_known ? cd_values[2] : std::max(*buf_size, nbytes);
  if (size >= kMaxChunkBytes) return 0;
  for (;;) {
    void* out = H5allocate_memory(size, false);
    if (!out) return 0;
    errno = 0;
    const unsigned n = lzf_decompress(*buf, in_len, out, static_cast<unsigned>(size));
    // A chunk whose size is on record decompresses to exactly that: fewer bytes would leave
    // the rest of the chunk's buffer unwritten (and read as data).
    if (n != 0 && size_known && n != size) {
      H5free_memory(out);
      H5Epush2(H5E_DEFAULT, __FILE__, "lzf_filter", __LINE__, H5E_ERR_CLS, H5E_PLINE, H5E_READERROR,
               "LZF: a chunk of %zu compressed bytes decompresses to %u bytes, not its %zu", nbytes, n, size);
      return 0;
    }
    if (n != 0) {
      H5free_memory(*buf);
      *buf = out;
      *buf_size = size;
      return n;
    }
    H5free_memory(out);
    // E2BIG: the buffer is too small (no size stored, or a wrong one); anything else is
    // corrupt data. The line pushed here becomes the innermost of HDF5's error stack.
    if (errno == E2BIG && 2 * size < kMaxChunkBytes) {
      size *= 2;
      continue;
    }
    H5Epush2(H5E_DEFAULT, __FILE__, "lzf_filter", __LINE__, H5E_ERR_CLS, H5E_PLINE, H5E_READERROR,
             errno == E2BIG ? "LZF: a chunk of %zu compressed bytes decompresses to 4 GiB or more"
                            : "LZF: corrupt data in a chunk of %zu compressed bytes",
             nbytes);
    return 0;
  }
}

const H5Z_class2_t kLzfClass = {
    H5Z_CLASS_T_VERS,
    kLzfFilter,
    1,  // encoder present
    1,  // decoder present
    "lzf",
    nullptr,  // can_apply: any type, any chunk
    set_local,
    filter,
};

}  // namespace

void register_lzf_filter() {
  if (H5Zregister(&kLzfClass) < 0)
    throw Error("HDF5: cannot register the LZF filter (" + std::to_string(kLzfFilter) + "): " + hdf5_error_message());
}

}  // namespace loom::data::detail
