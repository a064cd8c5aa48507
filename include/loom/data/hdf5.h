// HDF5 datasets: read named arrays of an HDF5 file as examples, and write such files.
//
//   // Fashion-MNIST as prepare_data writes it: train/images uint8 [60000,1,28,28],
//   // train/labels int64 [60000].
//   auto train = std::make_shared<loom::data::HDF5Dataset>(
//       "fashion_mnist.h5", loom::data::HDF5Fields{{"train/images", "input"},
//                                                 {"train/labels", "target"}});
//   train->size();                   // 60000
//   auto e = train->get(0);          // e.at("input"): uint8 [1,28,28], e.at("target"): int64 []
//
//   // The same with every label checked by the constructor, before any training:
//   loom::data::HDF5Dataset checked("fashion_mnist.h5", {{"train/images", "input"}, {"train/labels", "target"}},
//                                   {.ranges = {{"target", {0, 10, "a class"}}}});
//
//   // Byte-level tokens for a TokenWindowDataset, every token checked below the vocabulary:
//   auto tokens = loom::data::read_hdf5("fortunes.h5", "train/tokens");
//   loom::data::TokenWindowDataset windows(tokens, 128, {.range = loom::data::ValueRange{0, 256, "a token"}},
//                                          "fortunes.h5 train/tokens");
//
// Every HDF5 dataset named in the mapping must have at least one dimension, the same first
// dimension (the sample axis), and an element type among uint8, int32, int64, float32 and
// float64 (any byte order); chunked or contiguous, uncompressed or compressed with HDF5's own
// filters (deflate, shuffle, ...) or LZF (h5py's compression="lzf"). A dataset that needs a
// filter this process lacks (blosc, zstd, ... without a plugin) fails when the HDF5Dataset is
// constructed, naming the filter's id and name. Sample i is row i of
// each. get_batch() reads each field of a whole batch under one acquisition of the HDF5 lock:
// the distinct rows it needs (or the blocks holding them, see HDF5DatasetOptions), sorted and
// merged into runs of consecutive rows, are read as hyperslabs; rows are then copied into the
// requested order outside the lock.
//
// Threads: Debian builds HDF5 without its thread-safety option, so no two HDF5 calls may run
// at once anywhere in the process. Every HDF5 call in loom takes hdf5_mutex() for its whole
// duration; the DeviceLoader's parallel stage therefore reads under that lock and does all
// transforms on host memory after it. Code that calls the HDF5 library itself while a loader
// runs must hold hdf5_mutex() too.
//
// Errors: every negative HDF5 status becomes a loom::Error of one line naming the file, the
// HDF5 dataset and what failed, with HDF5's own innermost message; a read that fails names the
// samples that cannot be read (a corrupt chunk's rows), not the whole batch's. HDF5's
// automatic error printing to stderr is turned off by the first loom HDF5 call.
//
// Integer fields with a declared range (class labels, HDF5DatasetOptions::ranges) are read
// and checked whole by the constructor, so a bad label fails before training starts:
//   HDF5Dataset: 'data/x.h5' dataset 'test/labels': sample 17 is 12, expected a class in
//   [0, 10) (out of range: 1 of 10000 samples)
#pragma once

#include <loom/data/dataset.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom::data {

// The lock around every HDF5 call in the process (see above).
std::mutex& hdf5_mutex();

// HDF5 dataset path → example field name, e.g. {"train/images", "input"}.
using HDF5Fields = std::vector<std::pair<std::string, std::string>>;

struct HDF5DatasetOptions {
  // Memory per mapped HDF5 dataset. A dataset whose whole array fits is kept in memory,
  // decoded, block by block (an HDF5 chunk, or about 1 MiB of rows when contiguous) as batches
  // first touch it: a batch reads only its missing blocks, and later batches copy rows
  // without calling HDF5 at all, on any number of threads (shuffled reads through HDF5 cost
  // milliseconds per batch even when HDF5 has every chunk cached). A larger dataset is read
  // through HDF5 on every batch, with an HDF5 chunk cache of this size.
  int64_t cache_bytes = int64_t{512} << 20;
  // false: never keep decoded blocks; every batch reads through HDF5 (with its chunk cache
  // of cache_bytes). For benchmarks, and files that change while being read. (HDF5 shares a
  // dataset opened twice in one process: the first opening's chunk cache applies.)
  bool block_cache = true;
  // How a batch's rows (or blocks) are selected, always in one lock acquisition:
  // false: one regular hyperslab and H5Dread per run of consecutive rows (blocks);
  // true: one union of hyperslabs and one H5Dread per field. Debian's HDF5 1.10 reads such an
  // irregular selection 10-35x slower than the same rows as separate regular hyperslabs (on
  // Fashion-MNIST, chunks cached: 9-10 ms vs 0.3-0.8 ms per shuffled batch of 256), hence the
  // default.
  bool single_selection = false;
  // Field name → the values it may hold, e.g. {{"target", {0, 10, "a class"}}}: the
  // constructor reads each such field whole (blocks kept when cached) and throws loom::Error
  // naming the first sample out of range, its value and how many are.
  std::map<std::string, ValueRange> ranges = {};
};

class HDF5Dataset : public Dataset {
 public:
  // Opens the file read-only and checks every mapped dataset (throws loom::Error).
  HDF5Dataset(std::string file, HDF5Fields fields, HDF5DatasetOptions options = {});
  ~HDF5Dataset() override;
  HDF5Dataset(const HDF5Dataset&) = delete;
  HDF5Dataset& operator=(const HDF5Dataset&) = delete;

  int64_t size() const override;
  Example get(int64_t index) const override;
  std::vector<Example> get_batch(std::span<const int64_t> indices) const override;
  // "data/x.h5 test/images, test/labels": the file and the HDF5 datasets read.
  std::string source() const override;

  const std::string& file() const { return file_; }
  // Per-sample shape and element type of a field.
  Shape sample_shape(const std::string& field) const;
  HostDType dtype(const std::string& field) const;

 private:
  struct Impl;
  std::string file_;
  std::unique_ptr<Impl> impl_;
};

// Reads a whole HDF5 dataset (same dtypes as HDF5Dataset).
HostArray read_hdf5(const std::string& file, const std::string& path);

// Writes HDF5 files (prepare_data, tests). Intermediate groups are created as needed.
//
//   loom::data::HDF5Writer w("out.h5.tmp");
//   w.create("train/images", loom::data::HostDType::UInt8, {60000, 1, 28, 28},
//            {.chunk_rows = 1024, .deflate = 4});
//   w.write_rows("train/images", 0, first_rows);   // any number of rows at any offset
//   w.set_attribute("/", "num_classes", 10);
//   w.close();
struct HDF5WriteOptions {
  int64_t chunk_rows = 0;  // rows per chunk along the first dimension; 0 = contiguous
  int deflate = 0;         // gzip level 1-9; 0 = none (needs chunk_rows > 0)
  bool lzf = false;        // LZF as h5py writes it (filter 32000) instead; needs chunk_rows > 0
};

class HDF5Writer {
 public:
  // Creates `file`, replacing an existing one. With `in_memory` the file is built in memory
  // and only close() writes it out (an existing file is replaced then; a writer destroyed
  // without close() writes nothing), with plain writes: a write that fails (a full disk) is then an
  // error naming the system's reason, and leaves HDF5 nothing half-written to flush at exit
  // (checkpoints are written so). Either way the file is written in place: a failure leaves a
  // partial file under its name, so write to a temporary name and rename it once closed (as
  // save_checkpoint and prepare_data do) to keep the file that was there.
  explicit HDF5Writer(std::string file, bool in_memory = false);
  ~HDF5Writer();
  HDF5Writer(const HDF5Writer&) = delete;
  HDF5Writer& operator=(const HDF5Writer&) = delete;

  // A new dataset of the full `shape` (uint8 or the loom dtypes except bool).
  void create(const std::string& path, HostDType dtype, const Shape& shape,
              HDF5WriteOptions options = {});
  // Writes rows [first_row, first_row + rows.shape[0]) of a created dataset.
  void write_rows(const std::string& path, int64_t first_row, const HostArray& rows);
  // create() and write_rows() of the whole array.
  void write(const std::string& path, const HostArray& array, HDF5WriteOptions options = {});
  // An int64 attribute on a group or dataset ("/" for the file).
  void set_attribute(const std::string& object, const std::string& name, int64_t value);
  // Closes the file (the destructor does it too, ignoring errors); throws on failure.
  void close();

 private:
  struct Impl;
  std::string file_;
  std::unique_ptr<Impl> impl_;
};

// Flushes `path` to the disk (fsync): a file written and closed, before it is renamed over
// one that must survive a crash, or (`directory`) the directory after a rename in it. Throws
// loom::Error naming the path and the system's reason.
void sync_to_disk(const std::string& path, bool directory = false);

}  // namespace loom::data
