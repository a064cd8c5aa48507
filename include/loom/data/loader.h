// DeviceLoader: batches of a Dataset, prepared by a TBB pipeline on background threads and
// handed over as device tensors. A range-for over it is a training loop: each increment of
// the iterator calls loom::mark_step(), so the step traced in the loop body is compiled (once)
// and queued on the device while the pipeline already has the next batches ready.
//
//   auto train = std::make_shared<loom::data::HDF5Dataset>(
//       "fashion_mnist.h5", loom::data::HDF5Fields{{"train/images", "input"},
//                                                 {"train/labels", "target"}});
//   loom::data::DeviceLoader loader(
//       train, {.batch_size = 256, .shuffle = true, .seed = 1, .threads = 4, .prefetch = 4},
//       {loom::data::to_float(), loom::data::normalize({0.286}, {0.353}),
//        loom::data::random_crop({28, 28}, 2), loom::data::random_horizontal_flip()});
//   for (int epoch = 0; epoch < 10; ++epoch)
//     for (auto& batch : loader) {          // epoch 0, 1, ... (or loader.set_epoch(e))
//       opt.zero_grad();                    // or the gradients add up over the steps
//       auto loss = loss_fn(model, batch["input"], batch["target"]);
//       loss.backward();
//       loom::optim::optimizer_step(opt);   // the update (gradients averaged under mpirun)
//     }                                     // ++ → mark_step()
//
// Pipeline (tbb::parallel_pipeline in a task_arena of `threads` threads, at most `prefetch`
// batches in flight, on a background thread):
//   indices (serial, in order) → read + transform + collate a batch (parallel; samples of a
//   batch transformed with parallel_for; each field collated into host memory of `device`,
//   loom::alloc_host: page-locked on a GPU) → transfer to the device (serial, in order; one
//   copy per field from that memory, on a GPU's copy stream, then the memory is given back)
//   → a queue of ready batches → the consumer. At most `prefetch` batches are ahead of the
//   consumer, in the pipeline and the queue together. No stage waits for the consumer: while
//   the queue is full, the pipeline is stopped and only the loader's own thread waits, so no
//   TBB worker is kept from the training step's CPU kernels.
// Batch k of epoch e is a pure function of (dataset, seed, e, k): the same for any thread
// count or prefetch depth.
//
// Errors: an exception in a worker (a read, a user transform) ends the epoch; the batches
// before it are delivered, then the consumer's iterator rethrows it as a loom::Error that
// names the sample index and the dataset's source (file), with the original nested
// (std::rethrow_if_nested). Leaving the loop early (break, exception in the body) is fine:
// the iterator's destructor (or the next begin(), or the loader's destructor) cancels the
// pipeline (cancel_group_execution), drops the queued batches and joins the thread.
//
// Metrics (loom::metrics): counters LoaderBatches, LoaderSamples; stats LoaderWaitTime (ns the
// consumer waited for each batch, and for the end of each pass) and LoaderPrepareTime (ns to read, transform and collate a
// batch on a worker). stats() adds rates for this loader. Profiler spans (loom/profiler.h):
// loader_read, loader_transform, loader_collate, loader_transfer on the threads "loader" and
// "loader worker", loader_wait on the consumer's thread.
#pragma once

#include <loom/data/dataset.h>
#include <loom/data/sampler.h>
#include <loom/compile.h>
#include <loom/data/transforms.h>
#include <loom/tensor.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

namespace loom::data {

struct DeviceLoaderOptions {
  int64_t batch_size = 32;
  bool shuffle = false;     // RandomSampler(seed) instead of SequentialSampler
  uint64_t seed = 0;        // shuffling and random transforms
  LastBatch last_batch = LastBatch::Drop;
  int threads = 0;          // worker threads; 0 (or more than the cores) = all cores
  int prefetch = 2;         // batches prepared ahead of the consumer (in flight or ready)
  int64_t rank = 0;         // world_size > 1: DistributedSampler(rank, world_size), which
                            // repeats a few samples so the ranks' shares are equal (as
                            // PyTorch's): evaluate exactly once with a custom sampler
  int64_t world_size = 1;
  bool mark_step = true;    // call loom::mark_step() on each iterator increment
  Device device = {};
  // A custom order; overrides shuffle/rank/world_size. Its indices must lie in [0, the
  // dataset's size): another is a loom::Error when the epoch starts.
  std::shared_ptr<const Sampler> sampler = nullptr;
};

// One batch on the device: field name → tensor with a leading batch dimension.
struct Batch {
  std::map<std::string, Tensor> tensors;
  std::vector<int64_t> indices;  // dataset index of each row
  int64_t valid = 0;             // rows 0..valid-1 are real; the rest pad (LastBatch::Pad);
                                 // a DistributedSampler's repeats count as real
  int64_t index = 0;             // batch number within the epoch
  int64_t epoch = 0;

  // Throws loom::Error naming the missing field and the fields present.
  const Tensor& operator[](const std::string& field) const;
  bool contains(const std::string& field) const { return tensors.count(field) != 0; }
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
};

// What compile() guards and binds in a batch passed to a compiled step (loom/compile.h): its
// tensors by name, its size and its count of real rows (which a step may turn into a mask).
// The indices, the batch number and the epoch are not the step's business.
template <class V>
void capture_visit(V& v, const Batch& b) {
  capture_visit(v, b.tensors);
  v.integer(b.size());
  v.integer(b.valid);
}

// This loader's figures since construction (or reset_stats()).
struct LoaderStats {
  int64_t batches = 0;
  int64_t samples = 0;
  double wait_seconds = 0;     // consumer blocked waiting for batches
  double iterate_seconds = 0;  // wall time from begin() to the end of each iteration
  double samples_per_second() const { return iterate_seconds > 0 ? samples / iterate_seconds : 0; }
  double batches_per_second() const { return iterate_seconds > 0 ? batches / iterate_seconds : 0; }
  // Share of the loop's wall time spent waiting for data (0 = the device never waits).
  double wait_fraction() const { return iterate_seconds > 0 ? wait_seconds / iterate_seconds : 0; }
};

class DeviceLoader {
 public:
  // Transforms are applied in order to every sample (on worker threads) before collation.
  // Fields must end up float32/float64/int32/int64/bool: uint8 needs to_float() or cast().
  DeviceLoader(std::shared_ptr<Dataset> dataset, DeviceLoaderOptions options,
               std::vector<Transform> transforms = {});
  ~DeviceLoader();
  DeviceLoader(DeviceLoader&&) noexcept;
  DeviceLoader& operator=(DeviceLoader&&) noexcept;

  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;

    Iterator() = default;
    // An iterator dropped before the end of its epoch (break, exception) stops that epoch's
    // pipeline: nothing can consume it any more.
    ~Iterator();
    Iterator(Iterator&& other) noexcept;
    Iterator& operator=(Iterator&& other) noexcept;
    Batch& operator*() const { return *batch_; }
    Batch* operator->() const { return batch_.get(); }
    // mark_step() (if enabled), then waits for the next batch; rethrows a worker's error.
    Iterator& operator++();
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return batch_ == nullptr; }

   private:
    friend class DeviceLoader;
    struct State;
    Iterator(State* state, uint64_t run, std::source_location site);
    State* state_ = nullptr;
    uint64_t run_ = 0;
    std::unique_ptr<Batch> batch_;
    std::source_location site_;  // the loop's line, named by its mark_step()s
  };

  // Starts epoch epoch() (cancelling an unfinished one), waits for its first batch, and moves
  // epoch() on by one. Only one iteration at a time: an older iterator ends when a new one
  // starts. Iterators must not outlive the loader. `site` (by default where begin() is called:
  // the range-for's line) names the iterator's mark_step()s in loom::debug's causes.
  Iterator begin(std::source_location site = std::source_location::current());
  std::default_sentinel_t end() { return {}; }

  // The epoch the next begin() runs.
  int64_t epoch() const;
  void set_epoch(int64_t epoch);
  // Resuming inside an epoch: the next begin() runs `epoch` from batch `first_batch` (each
  // batch as a full pass gives it, Batch::index included; the ones before are not read). The
  // epochs after start at batch 0. first_batch == batches_per_epoch() gives an empty pass;
  // past it, or negative, is a loom::Error.
  void set_epoch(int64_t epoch, int64_t first_batch);
  int64_t batches_per_epoch() const;
  const Dataset& dataset() const;
  // Where the batches are delivered (DeviceLoaderOptions::device).
  Device device() const;

  LoaderStats stats() const;
  void reset_stats();

 private:
  std::unique_ptr<Iterator::State> state_;
};

}  // namespace loom::data
